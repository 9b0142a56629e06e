"""Shared helpers of the benchmark scripts: timing, ceilings, FLOP/byte counting,
machine description, JSON output and a table printer.

Importing this module needs neither a GPU nor torch: torch is imported inside the
functions that use it, so ``python benchmarks/X.py --help`` and the CPU unit tests
(tests/unit/test_benchmarks_cpu.py) run anywhere.
"""

from __future__ import annotations

# One file over 500 lines, on purpose: what every benchmark script shares (timing, ceilings,
# FLOP and byte counts, the machine, JSON, tables); each script imports it whole.

import datetime as _dt
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------------------
# Llama-3.1-8B attention and the project's seed workload


@dataclass(frozen=True)
class Model:
    heads_q: int = 32
    heads_kv: int = 8
    head_dim: int = 128


LLAMA_8B = Model()

SEED_PROMPT = 2048         # tokens per prompt
SEED_OUTPUT = 128          # output tokens per request
SEED_BATCH_TOKENS = 16384  # batched tokens per scheduler step
PAGE_SIZE = 16


def seed_decode_context_lengths(num_seqs: int = 256, prompt: int = SEED_PROMPT,
                                output: int = SEED_OUTPUT) -> list[int]:
    """Context lengths of a decode step in steady state: requests at every point of their
    output, spread uniformly over prompt .. prompt + output - 1 (2048..2175)."""
    return [prompt + (i * output) // num_seqs for i in range(num_seqs)]


# --------------------------------------------------------------------------------------
# FLOPs and bytes


def causal_pairs(len_q: int, len_k: int) -> int:
    """(query, key) pairs a causal mask keeps, with the queries aligned to the END of the
    keys (FlashAttention's convention when len_q != len_k): query i (0-based) sees keys
    0 .. len_k - len_q + i, that is max(0, len_k - len_q + i + 1) of them."""
    if len_q <= 0 or len_k <= 0:
        return 0
    first = max(0, len_q - len_k)  # first query that sees at least one key
    n = len_q - first
    lo = len_k - len_q + first + 1
    hi = len_k
    return (lo + hi) * n // 2


def attention_pairs(q_lens: Sequence[int], k_lens: Sequence[int], causal: bool) -> int:
    """Exact number of (query, key) pairs computed, summed over sequences."""
    if len(q_lens) != len(k_lens):
        raise ValueError("q_lens and k_lens must have the same length")
    if causal:
        return sum(causal_pairs(q, k) for q, k in zip(q_lens, k_lens))
    return sum(q * k for q, k in zip(q_lens, k_lens))


def attention_flops(q_lens: Sequence[int], k_lens: Sequence[int], heads: int, head_dim: int,
                    causal: bool, convention: str = "exact", head_dim_v: Optional[int] = None) -> float:
    """Forward attention FLOPs: 2 matmuls (QK^T and PV), 2 FLOPs per multiply-add.

    convention="exact": 2 * pairs * h * (d + d_v) with the exact causal pair count.
    convention="half": the FlashAttention papers' (and docs/anchors.md's) convention,
    4 * sum(s_q * s_k) * h * d, halved for causal.
    """
    d_v = head_dim if head_dim_v is None else head_dim_v
    if convention == "half":
        full = sum(q * k for q, k in zip(q_lens, k_lens))
        return 2.0 * full * heads * (head_dim + d_v) / (2.0 if causal else 1.0)
    if convention != "exact":
        raise ValueError(f"unknown FLOP convention {convention!r}")
    return 2.0 * attention_pairs(q_lens, k_lens, causal) * heads * (head_dim + d_v)


def decode_bytes(k_lens: Sequence[int], heads_q: int, heads_kv: int, head_dim: int,
                 kv_elem: int, q_elem: int, out_elem: int = 2) -> int:
    """Bytes a decode step must move: K and V of every context token (read once), plus
    q read and out written (one query token per sequence)."""
    kv = 2 * sum(k_lens) * heads_kv * head_dim * kv_elem
    b = len(k_lens)
    return kv + b * heads_q * head_dim * (q_elem + out_elem)


# --------------------------------------------------------------------------------------
# Timing


@dataclass
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    min_ms: float
    samples: int
    method: str
    first_call_s: Optional[float] = None

    def as_dict(self) -> dict:
        return asdict(self)


def quantile(values: Sequence[float], q: float) -> float:
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def triton_available() -> bool:
    try:
        import triton.testing  # noqa: F401
    except Exception:
        return False
    return True


def _rotating(fns: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    if len(fns) == 1:
        return fns[0]
    state = [0]

    def call():
        fn = fns[state[0] % len(fns)]
        state[0] += 1
        return fn()

    return call


def time_first_call(fn: Callable[[], Any]) -> float:
    """Wall seconds of one call including a device sync (JIT, lazy module loading)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def time_cuda(fns: Sequence[Callable[[], Any]] | Callable[[], Any], *, warmup: int = 5,
              reps: int = 30, inner: int = 1, timer: str = "auto",
              target_ms: Optional[float] = None) -> Timing:
    """Median GPU time of one call.

    ``fns``: one callable or several equivalent ones over different input sets; calls
    rotate through them (so inputs smaller than L2 are not re-read hot).
    timer="triton": triton.testing.do_bench (flushes L2 before every call, times each
    call with CUDA events, median). timer="events": own loop, ``reps`` samples of
    ``inner`` back-to-back calls between two CUDA events, after ``warmup`` calls.
    "auto": triton when importable, else events.
    """
    import torch

    fn_list = list(fns) if isinstance(fns, (list, tuple)) else [fns]
    call = _rotating(fn_list)
    if timer == "auto":
        timer = "triton" if triton_available() else "events"
    if timer == "triton":
        try:
            import triton.testing

            # do_bench's budgets are in ms; derive them from the wanted repeat count.
            est = _estimate_ms(call)
            rep_ms = max(target_ms or 0.0, reps * est, 5.0)
            warm_ms = max(warmup * est, 2.0)
            qs = triton.testing.do_bench(call, warmup=warm_ms, rep=rep_ms,
                                         quantiles=[0.5, 0.2, 0.8], return_mode="median")
            med, p20, p80 = (float(x) for x in qs)
            samples = max(1, int(rep_ms / max(est, 1e-3)))
            return Timing(med, p20, p80, min(p20, med), samples, "triton.do_bench(median, L2 flushed)")
        except Exception as exc:  # noqa: BLE001 - fall back, but say so
            print(f"[timing] triton.do_bench failed ({type(exc).__name__}: {exc}); using CUDA events",
                  file=sys.stderr)
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        for _ in range(inner):
            call()
        ends[i].record()
    torch.cuda.synchronize()
    per_call = [s.elapsed_time(e) / inner for s, e in zip(starts, ends)]
    return Timing(statistics.median(per_call), quantile(per_call, 0.2), quantile(per_call, 0.8),
                  min(per_call), reps, f"cuda events ({inner} call(s)/sample)")


def _estimate_ms(call: Callable[[], Any], n: int = 3) -> float:
    import torch

    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / n


def l2_bytes(device_index: int = 0) -> int:
    import torch

    props = torch.cuda.get_device_properties(device_index)
    return int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)


def input_sets_for(bytes_per_set: int, l2: int, max_sets: int = 8) -> int:
    """How many input sets to rotate through so that one pass reads > 2x L2."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(max_sets, math.ceil(2 * l2 / bytes_per_set)))


# --------------------------------------------------------------------------------------
# Ceilings of the card, measured in the same run


def measure_ceilings(quick: bool = False, timer: str = "events") -> dict:
    """bf16 dense matmul (8192^3, random data) TFLOP/s; fp8 e4m3 matmul via
    torch._scaled_mm when available; device-to-device copy GB/s counting read + write."""
    import torch

    out: dict[str, Any] = {}
    n = 8192
    reps = 10 if quick else 30
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = time_cuda(lambda: torch.matmul(a, b), warmup=5, reps=reps, timer=timer)
    out["bf16_matmul_tflops"] = 2.0 * n**3 / (t.median_ms * 1e-3) / 1e12
    out["bf16_matmul_ms"] = t.median_ms
    try:
        a8 = a.to(torch.float8_e4m3fn)
        b8 = b.to(torch.float8_e4m3fn).t().contiguous().t()  # column-major second operand
        one = torch.ones((), device="cuda", dtype=torch.float32)
        fn = lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        fn()
        t8 = time_cuda(fn, warmup=5, reps=reps, timer=timer)
        out["fp8_matmul_tflops"] = 2.0 * n**3 / (t8.median_ms * 1e-3) / 1e12
        del a8, b8
    except Exception as exc:  # noqa: BLE001
        out["fp8_matmul_tflops"] = None
        out["fp8_matmul_error"] = f"{type(exc).__name__}: {exc}"[:300]
    del a, b
    nbytes = 2 * 2**30
    src = torch.empty(nbytes, device="cuda", dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    tc = time_cuda(lambda: dst.copy_(src), warmup=3, reps=reps, timer=timer)
    out["copy_gbs"] = 2.0 * nbytes / (tc.median_ms * 1e-3) / 1e9
    out["copy_bytes"] = nbytes
    del src, dst
    torch.cuda.empty_cache()
    out["method"] = ("median of CUDA-event samples; matmul 8192^3 on randn data; copy of 2 GiB "
                     "device-to-device counted as read + write")
    return out


# --------------------------------------------------------------------------------------
# Machine description


def _run(cmd: list[str], timeout: float = 20) -> Optional[str]:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except Exception:  # noqa: BLE001
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def build_info_dict() -> dict:
    """The installed wheel's build_info.json (or why it is missing) and where it lives."""
    try:
        import vendored_flash_attn
        from vendored_flash_attn.declaration.build_info import BuildInfoMissing, load_build_info
    except Exception as exc:  # noqa: BLE001
        return {"error": f"vendored_flash_attn not importable: {exc}"}
    try:
        raw = dict(load_build_info().raw)
    except BuildInfoMissing as exc:
        raw = {"error": str(exc)}
    raw["_package_path"] = str(Path(vendored_flash_attn.__file__).parent)
    raw["_package_version"] = getattr(vendored_flash_attn, "__version__", None)
    return raw


def build_option(info: dict, name: str) -> Optional[str]:
    """A knob's value as recorded in build_info.json (``options.NAME.value``)."""
    opt = (info.get("options") or {}).get(name)
    if isinstance(opt, dict):
        return opt.get("value")
    return opt


def machine_info(gpu: bool = True) -> dict:
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "argv": sys.argv,
    }
    git = _run(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    if git:
        info["git_commit"] = git
        dirty = _run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
        info["git_dirty"] = bool(dirty)
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cuda"] = torch.version.cuda
        if gpu and torch.cuda.is_available():
            idx = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(idx)
            info["gpu"] = {
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "sm_count": props.multi_processor_count,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "l2_bytes": int(getattr(props, "L2_cache_size", 0) or 0),
            }
    except Exception as exc:  # noqa: BLE001
        info["torch_error"] = str(exc)
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        info["triton"] = None
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,"
                "clocks.mem,power.limit,temperature.gpu", "--format=csv,noheader"])
    if smi:
        info["nvidia_smi"] = smi.splitlines()
        parts = [p.strip() for p in smi.splitlines()[0].split(",")]
        if len(parts) > 1:
            info["driver"] = parts[1]
    info["env"] = {k: v for k, v in os.environ.items()
                   if k.startswith(("VLLM_", "VFA_", "CUDA_", "TORCH_CUDA_ARCH", "NVIDIA_TF32"))}
    return info


# --------------------------------------------------------------------------------------
# Output


def write_json(path: Path, payload: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=_json_default) + "\n")
    return path


def _json_default(obj):
    if hasattr(obj, "as_dict"):
        return obj.as_dict()
    if hasattr(obj, "__dataclass_fields__"):
        return asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def fmt(value, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return "-"
    if isinstance(value, int):
        return f"{value}{unit}"
    return f"{value:.{digits}f}{unit}"


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]],
                notes: Sequence[str] = (), plain: bool = False) -> str:
    """Prints with rich when importable (and ``plain`` is false), else aligned text.
    Returns the plain-text rendering (also useful for logs)."""
    rows = [[fmt(c) if not isinstance(c, str) else c for c in row] for row in rows]
    text = render_plain(title, columns, rows, notes)
    if not plain:
        try:
            from rich.console import Console
            from rich.table import Table

            table = Table(title=title, show_lines=False)
            for i, col in enumerate(columns):
                table.add_column(col, justify="left" if i < 2 else "right")
            for row in rows:
                styled = []
                for cell in row:
                    if cell.startswith("PASS"):
                        styled.append(f"[green]{cell}[/green]")
                    elif cell.startswith("FAIL"):
                        styled.append(f"[red]{cell}[/red]")
                    else:
                        styled.append(cell.replace("[", "\\["))
                table.add_row(*styled)
            console = Console(width=max(100, shutil.get_terminal_size((160, 40)).columns))
            console.print(table)
            for note in notes:
                console.print(note.replace("[", "\\["), highlight=False)
            return text
        except ImportError:
            pass
    print(text)
    return text


def render_plain(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]],
                 notes: Sequence[str] = ()) -> str:
    widths = [len(c) for c in columns]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    sep = "  "
    lines = [title, sep.join(c.ljust(w) for c, w in zip(columns, widths)),
             sep.join("-" * w for w in widths)]
    for row in rows:
        lines.append(sep.join((cell.ljust(w) if i < 2 else cell.rjust(w))
                              for i, (cell, w) in enumerate(zip(row, widths))))
    lines.extend(notes)
    return "\n".join(lines)


def bar_verdict(value: Optional[float], threshold: float, higher_is_better: bool = True) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    ok = value >= threshold if higher_is_better else value <= threshold
    return "PASS" if ok else "FAIL"


def matches_filter(name: str, patterns: Optional[Sequence[str]]) -> bool:
    """Case filter: no patterns = all; else any pattern is a substring or fnmatch glob."""
    import fnmatch

    if not patterns:
        return True
    return any(p in name or fnmatch.fnmatch(name, p) for p in patterns)


@dataclass
class Stopwatch:
    budget_s: Optional[float] = None
    start: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def over(self) -> bool:
        return self.budget_s is not None and self.elapsed() > self.budget_s


# --------------------------------------------------------------------------------------
# FP8 quantisation (torch needed at call time)

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_fp8_per_seq_head(x, token_seq, num_seqs: int, heads_kv: int):
    """Quantise ``x`` (tokens, heads, d) to float8_e4m3fn with one scale per
    (sequence, KV head), as FA3's descales take them: shape (num_seqs, heads_kv).

    ``token_seq`` (tokens,) int64 gives the sequence of every token row. Query heads are
    grouped onto their KV head (head h -> h // (heads / heads_kv)), so a q descale
    covers the query heads sharing one KV head. Returns (x_fp8, descale float32) with
    real value ~= x_fp8 * descale."""
    import torch

    tokens, heads, _ = x.shape
    group = heads // heads_kv
    amax_tok = x.abs().amax(dim=-1).float().view(tokens, heads_kv, group).amax(dim=-1)
    amax = torch.zeros(num_seqs, heads_kv, device=x.device, dtype=torch.float32)
    index = token_seq.view(-1, 1).expand(tokens, heads_kv)
    amax = amax.scatter_reduce(0, index, amax_tok, reduce="amax", include_self=True)
    descale = (amax / FP8_MAX).clamp_min(1e-12)
    per_tok = descale[token_seq].repeat_interleave(group, dim=1).unsqueeze(-1)  # (tokens, heads, 1)
    out = torch.empty(x.shape, device=x.device, dtype=torch.float8_e4m3fn)
    chunk = max(1, (1 << 27) // max(1, heads * x.shape[-1]))
    for s in range(0, tokens, chunk):
        out[s:s + chunk] = (x[s:s + chunk].float() / per_tok[s:s + chunk]).clamp(-FP8_MAX, FP8_MAX).to(
            torch.float8_e4m3fn)
    return out, descale.contiguous()


def relative_l2(out, ref) -> float:
    """||out - ref||_2 / ||ref||_2 in float64."""
    o = out.double()
    r = ref.double()
    return float((o - r).norm() / r.norm().clamp_min(1e-300))
