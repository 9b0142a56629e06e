#!/usr/bin/env python3
"""Kernel benchmark: FA2, FA3 bf16, FA3 FP8, FA4 bf16 and torch SDPA on Llama-3.1-8B attention
shapes (32 query heads, 8 KV heads, head dim 128) and the project's seed workload.

Seed workload: 2048-token prompts, 128 output tokens, 16384 batched tokens per step.
  paged_prefill_seed   8 sequences x 2048 new tokens, page 16, block_table + seqused_k,
                       causal (one scheduler step of chunked prefill: 8 x 2048 = 16384)
  paged_decode_seed    256 sequences x 1 token, context 2048..2175 (uniform spread: the
                       requests are at every point of their 128 output tokens)
  paged_decode_64x4k   64 sequences x 1 token, context 4096 (K/V read bandwidth)
Plain varlen prefill: 8 x 2048 and 2 x 8192, causal and not (packed K/V, cu_seqlens_k).

Rows: FA2 (fa_version=2), FA3 bf16 (fa_version=3), FA3 FP8 (q/k/v float8_e4m3fn with
per-(sequence, KV head) descales), FA4 bf16 (fa_version=4: the CuTe DSL kernels; its first
call per kernel compiles unless the wheel ships or the user cache holds it, so the first
call is timed apart and never enters the median), torch SDPA (bf16, varlen cases only: the batch is
padded to (b, h, s, d) - all sequences have equal length here, so no padding waste -
and K/V are expanded to 32 heads outside the timed region; default backend choice).

Columns: median time; TFLOP/s (varlen: 4*b*s^2*h*d, halved for causal, as in
docs/anchors.md; paged: exact (query, key) pairs) or GB/s (decode: K+V bytes read + q + out);
% of the card's ceiling measured in the same run (bf16 8192^3 matmul; FP8 rows against
the FP8 matmul ceiling when torch._scaled_mm works; decode rows against a device copy);
time ratios FA2/row ("vs FA2") and FA3/row ("vs FA3", e.g. FA4's speed over FA3's). The bars
of issue 5 are checked at the end, and whether FA4 is at least as fast as FA3 on every case
(issue 17: that answer decides whether FA3 stays the default on Hopper).
A family this machine cannot run (not built, FA4's dependencies missing, ...) gets no rows in
the tables: a note says why it is absent (the JSON keeps its rows with the reason).

Runs in < 3 minutes on an H200 unless FA2 needs the driver's PTX JIT (FA2 built as
sm80 SASS + PTX on Hopper: 7 s or more per kernel variant on a cold JIT cache; see
first_call_s in the JSON). --budget-s stops starting new rows once spent.
"""

from __future__ import annotations

# One file over 500 lines, on purpose: one benchmark's cases, calls, rows, table and plot, all
# over the rows and cases declared at its top.

# Why this file names families (its rows fa2, fa3, fa3_fp8, fa4, sdpa): a row is a family
# measured by name, with the expected figures of earlier runs per row; the row names are the
# keys of the JSON it writes, which measured.json and the docs cite.

import argparse
import gc
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import LLAMA_8B, PAGE_SIZE  # noqa: E402

IMPLS = ("fa2", "fa3", "fa3_fp8", "fa4", "sdpa")
IMPL_LABEL = {"fa2": "FA2", "fa3": "FA3 bf16", "fa3_fp8": "FA3 FP8", "fa4": "FA4 bf16", "sdpa": "torch SDPA"}
# Family names in notes and ratio columns ("FA4 absent: ...", "FA4 vs FA3").
IMPL_SHORT = {"fa2": "FA2", "fa3": "FA3", "fa3_fp8": "FA3 FP8", "fa4": "FA4", "sdpa": "SDPA"}
# The fa_version= each FlashAttention row passes (SDPA has none).
IMPL_VERSION = {"fa2": 2, "fa3": 3, "fa3_fp8": 3, "fa4": 4}


def compiles_at_first_use(impl: str) -> bool:
    """The row's family is the CuTe DSL one (its declaration's ``made``): loaded before the
    rows are timed, and its user cache counted around the first call."""
    from vendored_flash_attn.declaration.families import CUTE_DSL, registry

    return impl in IMPL_VERSION and registry()[IMPL_VERSION[impl]].made == CUTE_DSL
# Order of the rows within one case: FA4 right after FA3 (same inputs, same GPU state), FA2
# after them (its first call may wait for the driver's PTX JIT).
RUN_ORDER = ("fa3", "fa4", "fa2", "fa3_fp8", "sdpa")
# FA4's first call of a kernel compiles it (seconds) when no cache holds it.
FIRST_CALL_NOTE_S = {"fa4": 1.0}
FIRST_CALL_CAUSE = {"fa2": "PTX JIT?", "fa4": "CuTe DSL compile?"}

BARS = {
    # case: (minimum FA3/FA2 speed-up, description)
    "paged_prefill_seed": (1.7, "FA3 >= 1.7x FA2 on the seed-shaped paged prefill"),
    "paged_decode_seed": (1.2, "FA3 >= 1.2x FA2 on paged decode"),
}

# docs/anchors.md (upstream build, H200, 2026-11-29), as printed in the table.
ANCHORS = {
    ("varlen_2k_full", "fa2"): "374 TF", ("varlen_2k_full", "fa3"): "603 TF",
    ("varlen_2k_full", "fa3_fp8"): "632 TF", ("varlen_2k_full", "sdpa"): "589 TF",
    ("varlen_2k_causal", "fa2"): "317 TF", ("varlen_2k_causal", "fa3"): "487-503 TF",
    ("varlen_2k_causal", "fa3_fp8"): "485 TF", ("varlen_2k_causal", "sdpa"): "486 TF",
    ("varlen_8k_full", "fa2"): "378 TF", ("varlen_8k_full", "fa3"): "607-654 TF",
    ("varlen_8k_full", "fa3_fp8"): "680 TF", ("varlen_8k_full", "sdpa"): "607 TF",
    ("varlen_8k_causal", "fa2"): "359 TF", ("varlen_8k_causal", "fa3"): "619-624 TF",
    ("varlen_8k_causal", "fa3_fp8"): "640 TF", ("varlen_8k_causal", "sdpa"): "552 TF",
    ("paged_prefill_seed", "fa2"): "1010 us", ("paged_prefill_seed", "fa3"): "569 us",
    ("paged_decode_seed", "fa2"): "668 us", ("paged_decode_seed", "fa3"): "535 us",
    ("paged_decode_64x4k", "fa3"): "262 us",
}


@dataclass(frozen=True)
class Case:
    name: str
    kind: str                 # "varlen" (packed K/V) or "paged"
    q_lens: tuple[int, ...]
    k_lens: tuple[int, ...]
    causal: bool
    description: str
    metric: str = "tflops"    # what % of ceiling is computed from: "tflops" or "gbs"
    flop_convention: str = "exact"
    impls: tuple[str, ...] = ("fa2", "fa3", "fa3_fp8", "fa4")

    @property
    def num_seqs(self) -> int:
        return len(self.q_lens)

    def flops(self, model=LLAMA_8B) -> float:
        return common.attention_flops(self.q_lens, self.k_lens, model.heads_q, model.head_dim,
                                      self.causal, convention=self.flop_convention)

    def bytes_moved(self, impl: str, model=LLAMA_8B) -> int:
        elem = 1 if impl == "fa3_fp8" else 2
        if self.kind == "paged" and max(self.q_lens) == 1:
            return common.decode_bytes(self.k_lens, model.heads_q, model.heads_kv, model.head_dim,
                                       kv_elem=elem, q_elem=elem, out_elem=2)
        # prefill: every input read once, output written once (a lower bound)
        tq, tk = sum(self.q_lens), sum(self.k_lens)
        return (tq * model.heads_q * model.head_dim * (elem + 2)
                + 2 * tk * model.heads_kv * model.head_dim * elem)


def all_cases() -> list[Case]:
    decode_ctx = tuple(common.seed_decode_context_lengths(256))
    cases = []
    for label, b, s in (("2k", 8, 2048), ("8k", 2, 8192)):
        for causal in (False, True):
            cases.append(Case(
                f"varlen_{label}_{'causal' if causal else 'full'}", "varlen", (s,) * b, (s,) * b,
                causal, f"varlen prefill {b} x {s}, {'causal' if causal else 'full'}",
                flop_convention="half", impls=IMPLS))
    cases.append(Case("paged_prefill_seed", "paged", (2048,) * 8, (2048,) * 8, True,
                      "paged prefill 8 x 2048 (page 16, seqused_k, causal)"))
    cases.append(Case("paged_decode_seed", "paged", (1,) * 256, decode_ctx, True,
                      "paged decode 256 x 1, ctx 2048-2175", metric="gbs"))
    cases.append(Case("paged_decode_64x4k", "paged", (1,) * 64, (4096,) * 64, True,
                      "paged decode 64 x 1, ctx 4096", metric="gbs"))
    return cases


@dataclass
class Row:
    case: str
    impl: str
    status: str = "ok"         # ok | not built | unsupported | error | skipped
    note: str = ""
    median_ms: Optional[float] = None
    p20_ms: Optional[float] = None
    p80_ms: Optional[float] = None
    timing_method: str = ""
    first_call_s: Optional[float] = None
    flops: float = 0.0
    bytes: int = 0
    tflops: Optional[float] = None
    gbs: Optional[float] = None
    pct_ceiling: Optional[float] = None
    ceiling: str = ""
    speedup_vs_fa2: Optional[float] = None
    speedup_vs_fa3: Optional[float] = None  # FA3 median / this row's median: > 1 = faster than FA3
    rel_l2_vs_fa3: Optional[float] = None
    input_sets: int = 1
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# Inputs


class Inputs:
    """bf16 inputs of one case, plus lazily built FP8 copies and SDPA layouts."""

    def __init__(self, case: Case, seed: int = 0, model=LLAMA_8B):
        import torch

        self.case = case
        self.model = model
        g = torch.Generator(device="cuda").manual_seed(seed)
        dev = "cuda"
        h, hk, d = model.heads_q, model.heads_kv, model.head_dim
        b = case.num_seqs
        tq = sum(case.q_lens)
        cu_q = [0]
        for n in case.q_lens:
            cu_q.append(cu_q[-1] + n)
        self.cu_seqlens_q = torch.tensor(cu_q, dtype=torch.int32, device=dev)
        self.max_seqlen_q = max(case.q_lens)
        self.max_seqlen_k = max(case.k_lens)
        self.q = torch.randn(tq, h, d, generator=g, device=dev, dtype=torch.bfloat16)
        self.q_token_seq = torch.repeat_interleave(
            torch.arange(b, device=dev), torch.tensor(case.q_lens, device=dev))
        if case.kind == "varlen":
            tk = sum(case.k_lens)
            cu_k = [0]
            for n in case.k_lens:
                cu_k.append(cu_k[-1] + n)
            self.cu_seqlens_k = torch.tensor(cu_k, dtype=torch.int32, device=dev)
            self.k = torch.randn(tk, hk, d, generator=g, device=dev, dtype=torch.bfloat16)
            self.v = torch.randn(tk, hk, d, generator=g, device=dev, dtype=torch.bfloat16)
            self.k_token_seq = torch.repeat_interleave(
                torch.arange(b, device=dev), torch.tensor(case.k_lens, device=dev))
            self.block_table = self.seqused_k = None
        else:
            blocks = [math.ceil(n / PAGE_SIZE) for n in case.k_lens]
            total = sum(blocks)
            # Blocks of a sequence are scattered over the cache, as an allocator leaves them.
            perm = torch.randperm(total, generator=g, device=dev).to(torch.int32)
            table = torch.zeros(b, max(blocks), dtype=torch.int32, device=dev)
            owner = torch.empty(total, dtype=torch.int64, device=dev)
            start = 0
            for i, n in enumerate(blocks):
                ids = perm[start:start + n]
                table[i, :n] = ids
                owner[ids.long()] = i
                start += n
            self.block_table = table
            self.block_owner = owner
            self.seqused_k = torch.tensor(case.k_lens, dtype=torch.int32, device=dev)
            self.cu_seqlens_k = None
            self.k = torch.randn(total, PAGE_SIZE, hk, d, generator=g, device=dev, dtype=torch.bfloat16)
            self.v = torch.randn(total, PAGE_SIZE, hk, d, generator=g, device=dev, dtype=torch.bfloat16)
        self._fp8 = None
        self._sdpa = None

    def fp8(self):
        """(q, k, v) in float8_e4m3fn and (q, k, v) descales of shape (num_seqs, num_kv_heads)."""
        if self._fp8 is None:
            m, b = self.model, self.case.num_seqs
            q8, qd = common.quantize_fp8_per_seq_head(self.q, self.q_token_seq, b, m.heads_kv)
            if self.case.kind == "varlen":
                k8, kd = common.quantize_fp8_per_seq_head(self.k, self.k_token_seq, b, m.heads_kv)
                v8, vd = common.quantize_fp8_per_seq_head(self.v, self.k_token_seq, b, m.heads_kv)
            else:
                shape = self.k.shape
                tok_seq = self.block_owner.repeat_interleave(PAGE_SIZE)
                flat = lambda x: x.view(-1, m.heads_kv, m.head_dim)  # noqa: E731
                k8, kd = common.quantize_fp8_per_seq_head(flat(self.k), tok_seq, b, m.heads_kv)
                v8, vd = common.quantize_fp8_per_seq_head(flat(self.v), tok_seq, b, m.heads_kv)
                k8, v8 = k8.view(shape), v8.view(shape)
            self._fp8 = (q8, k8, v8, qd, kd, vd)
        return self._fp8

    def sdpa_layout(self):
        """(q, k, v) as (b, h, s, d) contiguous, K/V expanded to the query heads."""
        if self._sdpa is None:
            c, m = self.case, self.model
            b, s = c.num_seqs, c.q_lens[0]
            group = m.heads_q // m.heads_kv
            q = self.q.view(b, s, m.heads_q, m.head_dim).transpose(1, 2).contiguous()
            k = self.k.view(b, s, m.heads_kv, m.head_dim).transpose(1, 2).repeat_interleave(group, 1).contiguous()
            v = self.v.view(b, s, m.heads_kv, m.head_dim).transpose(1, 2).repeat_interleave(group, 1).contiguous()
            self._sdpa = (q, k, v)
        return self._sdpa

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.k, self.v))


def make_call(impl: str, inp: Inputs):
    """A zero-argument callable running one attention forward, and a function turning its
    result into (total_q, h, d) for comparisons."""
    c = inp.case
    if impl == "sdpa":
        import torch.nn.functional as F

        q, k, v = inp.sdpa_layout()
        b, s = c.num_seqs, c.q_lens[0]
        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=c.causal)  # noqa: E731
        return fn, lambda o: o.transpose(1, 2).reshape(b * s, inp.model.heads_q, inp.model.head_dim)
    from vendored_flash_attn import flash_attn_varlen_func

    version = IMPL_VERSION[impl]
    kwargs = dict(max_seqlen_q=inp.max_seqlen_q, cu_seqlens_q=inp.cu_seqlens_q,
                  max_seqlen_k=inp.max_seqlen_k, cu_seqlens_k=inp.cu_seqlens_k,
                  seqused_k=inp.seqused_k, block_table=inp.block_table, causal=c.causal,
                  fa_version=version)
    if impl == "fa3_fp8":
        q, k, v, qd, kd, vd = inp.fp8()
        kwargs.update(q_descale=qd, k_descale=kd, v_descale=vd)
    else:
        q, k, v = inp.q, inp.k, inp.v
    fn = lambda: flash_attn_varlen_func(q, k, v, **kwargs)  # noqa: E731
    return fn, lambda o: o


def availability(impl: str) -> Optional[str]:
    """None when ``impl`` can run here, else the status text for its row."""
    if impl == "sdpa":
        return None
    import vendored_flash_attn as vfa

    version = IMPL_VERSION[impl]
    try:
        reason = vfa.fa_version_unsupported_reason(version)
    except Exception as exc:  # noqa: BLE001 - an older wheel without this family, a broken install
        return f"unavailable: fa_version_unsupported_reason({version}) failed: {type(exc).__name__}: {exc}"
    if reason is not None:
        return ("not built" if "built without" in reason or "build_info" in reason else "unavailable") + \
            f": {reason}"
    if impl == "fa3_fp8":
        info = vfa.load_build_info()
        if "e4m3" not in info.component(IMPL_VERSION[impl]).dtypes:
            return "not built: this wheel's FA3 has no e4m3 kernels"
    if compiles_at_first_use(impl):
        # Import cutlass and FA4's sources now (seconds), so that a broken install is one
        # clear reason instead of an error per row, and the first call of the first FA4 row
        # times its kernel (shipped, cached or compiled), not the import.
        try:
            from vendored_flash_attn.families.fa4 import adapter as fa4

            fa4.load()
        except Exception as exc:  # noqa: BLE001
            return f"unavailable: FA4 failed to load: {type(exc).__name__}: {exc}".splitlines()[0][:400]
    return None


def fa4_user_cache_kernels() -> Optional[int]:
    """How many kernels (.o) FA4's user cache holds now: a first call that adds one compiled."""
    try:
        from vendored_flash_attn.families.fa4 import cache as fa4_cache

        root = fa4_cache.user_cache_root()
    except Exception:  # noqa: BLE001
        return None
    return sum(1 for _ in root.rglob("*.o")) if root.is_dir() else 0


def plan_visits(cases: list[Case], impls: list[str]) -> list[list[tuple[str, str]]]:
    """The (case, impl) rows in execution order, grouped by case so that each visit builds
    its inputs once: the bar cases first, then the others in declaration order; within a
    case RUN_ORDER (FA4 right after FA3 on the same inputs); FA2 rows of non-bar cases last
    (the driver's PTX JIT may hold them up)."""
    keys = [(c.name, impl) for c in cases for impl in impls if impl in c.impls]
    names = [c.name for c in cases]
    order = sorted(keys, key=lambda key: (key[0] not in BARS, key[1] == "fa2" and key[0] not in BARS,
                                          names.index(key[0]), RUN_ORDER.index(key[1])))
    visits: list[list[tuple[str, str]]] = []
    for key in order:
        if visits and visits[-1][0][0] == key[0]:
            visits[-1].append(key)
        else:
            visits.append([key])
    return visits


def speed_ratios(rows: dict, cases: list[Case], impls: list[str]) -> None:
    """Fill ``speedup_vs_fa2`` / ``speedup_vs_fa3``: the reference's median over the row's
    (> 1: the row is faster), on the same case of the same run."""
    for c in cases:
        fa2, fa3 = rows.get((c.name, "fa2")), rows.get((c.name, "fa3"))
        for impl in impls:
            row = rows.get((c.name, impl))
            if row is None or not row.median_ms:
                continue
            if fa2 is not None and impl != "fa2" and fa2.median_ms:
                row.speedup_vs_fa2 = fa2.median_ms / row.median_ms
            if fa3 is not None and impl != "fa3" and fa3.median_ms:
                row.speedup_vs_fa3 = fa3.median_ms / row.median_ms


def fa4_versus_fa3(rows: list[dict], case_names: list[str], all_case_names: list[str]) -> dict:
    """Is FA4 at least as fast as FA3 (median time) on every case of the benchmark?

    ``answer``: "yes" only when every case of the benchmark (``all_case_names``) ran both
    and FA4's median is <= FA3's on each; "no" when one case that ran both has FA4 slower
    (a single slower case decides it, complete run or not); "undecided" otherwise (FA4 or
    FA3 absent, failed or skipped somewhere, or the run left cases out), with why.
    """
    by_key = {(r["case"], r["impl"]): r for r in rows}
    ratios: dict[str, Optional[float]] = {}
    missing: dict[str, str] = {}
    for name in case_names:
        fa3, fa4 = by_key.get((name, "fa3")), by_key.get((name, "fa4"))
        problem = None
        for label, r in (("FA3", fa3), ("FA4", fa4)):
            if problem is None and (r is None or r.get("status") != "ok" or not r.get("median_ms")):
                status = "not run" if r is None else r.get("status", "?")
                note = f" ({r['note']})" if r is not None and r.get("note") else ""
                problem = f"{label} {status}{note}"
        if problem is not None:
            ratios[name] = None
            missing[name] = problem
        else:
            ratios[name] = fa3["median_ms"] / fa4["median_ms"]
    not_run = [n for n in all_case_names if n not in case_names]
    slower = {n: r for n, r in ratios.items() if r is not None and r < 1.0}
    measured = [r for r in ratios.values() if r is not None]
    if slower:
        answer, why = "no", "FA4 slower on " + ", ".join(f"{n} ({r:.3f}x)" for n, r in slower.items())
    elif missing or not_run or not measured:
        parts = [f"{n}: {p}" for n, p in missing.items()]
        if not_run:
            parts.append("cases not in this run: " + ", ".join(not_run))
        answer, why = "undecided", "; ".join(parts) or "no case ran"
    else:
        answer, why = "yes", f"FA4 >= FA3 on all {len(measured)} cases (lowest {min(measured):.3f}x)"
    return {"question": "FA4 >= FA3 on every case", "answer": answer, "why": why,
            "ratio": "FA3 median time / FA4 median time (> 1: FA4 faster)",
            "ratios": ratios, "lowest": min(measured) if measured else None, "missing": missing,
            "cases_not_run": not_run}


# --------------------------------------------------------------------------------------


def run(args) -> dict:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    machine = common.machine_info()
    build = common.build_info_dict()
    t_start = time.perf_counter()
    print(f"[kernels] GPU: {machine.get('gpu', {}).get('name')}  torch {machine.get('torch')}  "
          f"driver {machine.get('driver')}", file=sys.stderr)
    ceilings = common.measure_ceilings(quick=args.quick, timer="events")
    print(f"[kernels] ceilings: bf16 matmul {ceilings['bf16_matmul_tflops']:.0f} TFLOP/s, "
          f"fp8 matmul {ceilings.get('fp8_matmul_tflops') or 0:.0f} TFLOP/s, "
          f"copy {ceilings['copy_gbs']:.0f} GB/s ({time.perf_counter() - t_start:.1f} s)", file=sys.stderr)

    cases = [c for c in all_cases() if common.matches_filter(c.name, args.cases)]
    impls = [i for i in IMPLS if i in args.impls]
    unavailable: dict[str, Optional[str]] = {}
    availability_s: dict[str, float] = {}
    for impl in impls:  # FA4's includes importing cutlass and its sources (seconds)
        t_impl = time.perf_counter()
        unavailable[impl] = availability(impl)
        availability_s[impl] = time.perf_counter() - t_impl
        if unavailable[impl]:
            print(f"[kernels] {IMPL_LABEL[impl]} absent: {unavailable[impl]}", file=sys.stderr)
    reps = 10 if args.quick else args.reps
    warmup = 3 if args.quick else 10
    l2 = common.l2_bytes()
    watch = common.Stopwatch(args.budget_s)

    rows: dict[tuple[str, str], Row] = {}
    for c in cases:
        for impl in impls:
            if impl in c.impls:
                rows[(c.name, impl)] = Row(c.name, impl, flops=c.flops(), bytes=c.bytes_moved(impl))
    visits = plan_visits(cases, impls)
    case_by_name = {c.name: c for c in cases}
    reference: dict[str, object] = {}
    for visit in visits:
        case = case_by_name[visit[0][0]]
        pending = [k for k in visit if unavailable.get(k[1]) is None]
        for k in visit:
            if unavailable.get(k[1]):
                status, _, note = unavailable[k[1]].partition(": ")
                rows[k].status, rows[k].note = status, note
        if not pending:
            continue
        if watch.over():
            for k in pending:
                rows[k].status, rows[k].note = "skipped", f"time budget ({args.budget_s:.0f} s) spent"
            continue
        try:
            inp = Inputs(case, seed=args.seed)
        except Exception as exc:  # noqa: BLE001
            for k in pending:
                rows[k].status, rows[k].note = "error", f"inputs: {type(exc).__name__}: {exc}"
            continue
        sets = common.input_sets_for(inp.nbytes(), l2)
        for key in pending:
            row = rows[key]
            impl = key[1]
            if watch.over():
                row.status, row.note = "skipped", f"time budget ({args.budget_s:.0f} s) spent"
                continue
            try:
                fn, to_thd = make_call(impl, inp)
                out = None

                def first():
                    nonlocal out
                    out = fn()
                kernels_before = fa4_user_cache_kernels() if compiles_at_first_use(impl) else None
                row.first_call_s = common.time_first_call(first)
                if kernels_before is not None:
                    after = fa4_user_cache_kernels()
                    # > 0: the first call compiled (neither shipped nor in the user cache).
                    row.extra["fa4_user_cache_new_kernels"] = (None if after is None
                                                               else after - kernels_before)
                if impl == "fa3":
                    reference[case.name] = out
                elif case.name in reference:
                    row.rel_l2_vs_fa3 = common.relative_l2(to_thd(out), reference[case.name])
                del out
                fns = [fn]
                if sets > 1:  # extra input sets: independent copies (only for small inputs)
                    extra = [Inputs(case, seed=args.seed + 1 + i) for i in range(sets - 1)]
                    fns += [make_call(impl, e)[0] for e in extra]
                t = common.time_cuda(fns, warmup=warmup, reps=reps, timer=args.timer)
                row.input_sets = len(fns)
                row.median_ms, row.p20_ms, row.p80_ms = t.median_ms, t.p20_ms, t.p80_ms
                row.timing_method = t.method
                row.tflops = row.flops / (t.median_ms * 1e-3) / 1e12
                row.gbs = row.bytes / (t.median_ms * 1e-3) / 1e9
                if case.metric == "gbs":
                    row.pct_ceiling = 100.0 * row.gbs / ceilings["copy_gbs"]
                    row.ceiling = "copy"
                elif impl == "fa3_fp8" and ceilings.get("fp8_matmul_tflops"):
                    row.pct_ceiling = 100.0 * row.tflops / ceilings["fp8_matmul_tflops"]
                    row.ceiling = "fp8 mm"
                else:
                    row.pct_ceiling = 100.0 * row.tflops / ceilings["bf16_matmul_tflops"]
                    row.ceiling = "bf16 mm"
                if row.first_call_s > FIRST_CALL_NOTE_S.get(impl, 5.0):
                    cause = FIRST_CALL_CAUSE.get(impl, "lazy loading?")
                    row.note = f"first call {row.first_call_s:.1f} s ({cause})"
                print(f"[kernels] {case.name:20s} {IMPL_LABEL[impl]:10s} {t.median_ms * 1e3:9.1f} us "
                      f"{row.tflops:7.1f} TFLOP/s {row.gbs:8.1f} GB/s  first {row.first_call_s:.3f} s",
                      file=sys.stderr)
            except Exception as exc:  # noqa: BLE001
                row.status = "error"
                row.note = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                if args.verbose:
                    traceback.print_exc()
                if "CUDA error" in str(exc) or "illegal" in str(exc):
                    print("[kernels] CUDA error: the context may be unusable; stopping", file=sys.stderr)
                    watch.budget_s = 0.0
        del inp
        gc.collect()
        torch.cuda.empty_cache()

    speed_ratios(rows, cases, impls)
    bars = []
    for name, (threshold, text) in BARS.items():
        row = rows.get((name, "fa3"))
        value = row.speedup_vs_fa2 if row else None
        bars.append({"bar": text, "case": name, "threshold": threshold, "value": value,
                     "verdict": common.bar_verdict(value, threshold)})
    return {
        "benchmark": "kernels",
        "machine": machine,
        "build_info": build,
        "ceilings": ceilings,
        "model": {"heads_q": LLAMA_8B.heads_q, "heads_kv": LLAMA_8B.heads_kv,
                  "head_dim": LLAMA_8B.head_dim, "page_size": PAGE_SIZE},
        "seed_workload": {"prompt": common.SEED_PROMPT, "output": common.SEED_OUTPUT,
                          "batched_tokens": common.SEED_BATCH_TOKENS},
        "cases": [{"name": c.name, "description": c.description, "kind": c.kind,
                   "num_seqs": c.num_seqs, "sum_q": sum(c.q_lens), "sum_k": sum(c.k_lens),
                   "max_k": max(c.k_lens), "causal": c.causal, "metric": c.metric,
                   "flop_convention": c.flop_convention} for c in cases],
        "rows": [rows[k].__dict__ for k in rows],
        "bars": bars,
        # Families this machine cannot run: no rows in the tables, this reason instead.
        "absent": {impl: reason for impl, reason in unavailable.items() if reason},
        "fa4_vs_fa3": fa4_versus_fa3([rows[k].__dict__ for k in rows], [c.name for c in cases],
                                     [c.name for c in all_cases()]),
        "settings": {"quick": args.quick, "reps": reps, "warmup": warmup, "timer": args.timer,
                     "triton_available": common.triton_available(), "budget_s": args.budget_s,
                     "l2_bytes": l2, "availability_s": availability_s},
        "elapsed_s": time.perf_counter() - t_start,
        "notes": [
            "TFLOP/s: varlen rows use 4*b*s^2*h*d (halved for causal, the convention of docs/anchors.md); "
            "paged rows count the exact causal (query, key) pairs (bottom-right aligned).",
            "GB/s: decode rows count K+V bytes of every context token once, plus q and out; prefill "
            "rows count every input once (a lower bound).",
            "SDPA: bf16, varlen cases only, batch as (b, h, s, d) with equal lengths (no padding), "
            "K/V expanded to 32 heads outside the timed region, torch's default backend choice.",
            "FP8: q/k/v quantised to float8_e4m3fn with one scale per (sequence, KV head); output bf16.",
        ],
    }


def plot(result: dict, path: Path) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:  # noqa: BLE001
        print(f"[kernels] no chart: matplotlib not importable ({exc})", file=sys.stderr)
        return None
    rows = [r for r in result["rows"] if r["status"] == "ok"]
    cases = [c for c in result["cases"]]
    compute = [c["name"] for c in cases if c["metric"] == "tflops"]
    memory = [c["name"] for c in cases if c["metric"] == "gbs"]
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [max(1, len(compute)), max(1, len(memory))]})
    colors = {"fa2": "#9e9e9e", "fa3": "#1f77b4", "fa3_fp8": "#ff7f0e", "fa4": "#9467bd", "sdpa": "#2ca02c"}
    shown = [impl for impl in IMPLS if any(r["impl"] == impl for r in rows)]
    for ax, names, key, unit, ceiling in (
            (axes[0], compute, "tflops", "TFLOP/s", result["ceilings"]["bf16_matmul_tflops"]),
            (axes[1], memory, "gbs", "GB/s", result["ceilings"]["copy_gbs"])):
        width = 0.8 / max(1, len(shown))
        for j, impl in enumerate(shown):
            xs, ys = [], []
            for i, name in enumerate(names):
                r = next((r for r in rows if r["case"] == name and r["impl"] == impl), None)
                if r:
                    xs.append(i + (j - (len(shown) - 1) / 2) * width)
                    ys.append(r[key])
            if xs:
                ax.bar(xs, ys, width, label=IMPL_LABEL[impl], color=colors[impl])
        ax.axhline(ceiling, color="k", linestyle="--", linewidth=0.8)
        ax.text(len(names) - 0.5, ceiling, f"measured ceiling {ceiling:.0f} ", va="bottom", ha="right", fontsize=8)
        ax.set_xlim(-0.5, len(names) - 0.5)
        ax.set_ylim(bottom=0, top=max([ceiling] + [r[key] for r in rows if r["case"] in names]) * 1.12)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([n.replace("_", "\n", 1) for n in names], fontsize=8)
        ax.set_ylabel(unit)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    gpu = result["machine"].get("gpu", {}).get("name", "GPU")
    fig.suptitle(f"vendored-flash-attn kernels, Llama-3.1-8B attention (32/8 heads, d=128) on {gpu}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def absent_notes(result: dict) -> list[str]:
    """One line per family that has no rows in the tables, with why."""
    return [f"{IMPL_SHORT[impl]} absent: {reason}" for impl, reason in (result.get("absent") or {}).items()]


def fa4_verdict_line(result: dict) -> str:
    v = result.get("fa4_vs_fa3") or {}
    return f"FA4 >= FA3 on every case: {v.get('answer', 'undecided')} ({v.get('why', 'not computed')})"


def side_by_side(result: dict) -> tuple[list[str], list[list[str]]]:
    """Columns per family beside each other, one line per case: median us of every family
    with a result in this run, then FA4 / FA3 and SDPA / FA3 speed ratios. A family absent
    from the machine gets no column (absent_notes says why)."""
    absent = result.get("absent") or {}
    rows = result["rows"]
    by_key = {(r["case"], r["impl"]): r for r in rows}
    impls = [i for i in IMPLS if i not in absent and any(r["impl"] == i for r in rows)]
    ratio_of = [i for i in ("fa4", "sdpa", "fa3_fp8") if i in impls and "fa3" in impls]
    columns = ["case"] + [f"{IMPL_LABEL[i]} us" for i in impls] + [f"{IMPL_SHORT[i]} vs FA3" for i in ratio_of]
    table = []
    for c in result["cases"]:
        line = [c["name"]]
        for impl in impls:
            r = by_key.get((c["name"], impl))
            if r is None:
                line.append("")
            elif r["status"] == "ok":
                line.append(common.fmt(r["median_ms"] * 1e3, 1))
            else:
                line.append(r["status"])
        for impl in ratio_of:
            r = by_key.get((c["name"], impl))
            line.append(common.fmt(r.get("speedup_vs_fa3") if r else None, 3, "x"))
        table.append(line)
    return columns, table


def print_results(result: dict, plain: bool = False) -> None:
    absent = result.get("absent") or {}
    columns = ["case", "impl", "median us", "TFLOP/s", "GB/s", "% ceil", "vs FA2", "vs FA3", "1st call s",
               "anchor", "status"]
    table = []
    case_names = [c["name"] for c in result["cases"]]
    for name in case_names:
        for impl in IMPLS:
            if impl in absent:
                continue  # a note below says why
            r = next((r for r in result["rows"] if r["case"] == name and r["impl"] == impl), None)
            if r is None:
                continue
            ok = r["status"] == "ok"
            pct = f"{r['pct_ceiling']:.0f}% {r['ceiling']}" if ok and r["pct_ceiling"] is not None else "-"
            status = "ok" if ok else r["status"]
            if r.get("note") and r["status"] not in ("not built", "skipped"):
                status += f" ({r['note'][:60]})"  # the JSON has the whole note
            table.append([name, IMPL_LABEL[impl],
                          common.fmt(r["median_ms"] * 1e3 if ok else None, 1),
                          common.fmt(r["tflops"] if ok else None, 1),
                          common.fmt(r["gbs"] if ok else None, 0),
                          pct,
                          common.fmt(r["speedup_vs_fa2"], 2, "x"),
                          common.fmt(r.get("speedup_vs_fa3"), 3, "x"),
                          common.fmt(r.get("first_call_s"), 3),
                          ANCHORS.get((name, impl), ""), status])
    ce = result["ceilings"]
    notes = [f"ceilings (this run): bf16 matmul {ce['bf16_matmul_tflops']:.0f} TFLOP/s, fp8 matmul "
             f"{common.fmt(ce.get('fp8_matmul_tflops'), 0)} TFLOP/s, device copy {ce['copy_gbs']:.0f} GB/s",
             "vs FA2 / vs FA3: that family's median time over the row's (> 1: the row is faster); "
             "1st call: the row's first call, timed apart (FA4: a compile unless shipped or cached)"]
    notes += absent_notes(result)
    for bar in result["bars"]:
        notes.append(f"BAR {bar['verdict']}: {bar['bar']}: measured {common.fmt(bar['value'], 2, 'x')}")
    notes.append(fa4_verdict_line(result))
    notes.append(f"elapsed {result['elapsed_s']:.0f} s; timing: {result['settings']['timer']}")
    common.print_table("Kernels (median of repeats)", columns, table, notes, plain=plain)
    columns, table = side_by_side(result)
    common.print_table("Side by side, median us (same run, same inputs)", columns, table,
                       absent_notes(result) + [fa4_verdict_line(result)], plain=plain)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repeats (10 instead of --reps)")
    p.add_argument("--reps", type=int, default=30, help="timed repeats per row (default 30)")
    p.add_argument("--out", type=Path, default=Path("bench-results"),
                   help="output folder for kernels.json and kernels.png (default bench-results)")
    p.add_argument("--cases", nargs="*", default=None,
                   help="only cases whose name contains one of these (or matches a glob); names: "
                        + ", ".join(c.name for c in all_cases()))
    p.add_argument("--impls", nargs="*", default=list(IMPLS), choices=IMPLS, help="rows to run")
    p.add_argument("--timer", choices=("auto", "triton", "events"), default="auto",
                   help="auto: triton.testing.do_bench (median, L2 flushed) when importable, else CUDA events")
    p.add_argument("--budget-s", type=float, default=300.0,
                   help="stop starting new rows after this many seconds (default 300: FA4's first calls "
                        "may compile, seconds per kernel)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the rows in execution order and exit (no GPU, no torch)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plain", action="store_true", help="plain-text table even if rich is installed")
    p.add_argument("--verbose", action="store_true", help="print tracebacks of failing rows")
    return p.parse_args(argv)


def print_plan(args) -> None:
    cases = [c for c in all_cases() if common.matches_filter(c.name, args.cases)]
    impls = [i for i in IMPLS if i in args.impls]
    for visit in plan_visits(cases, impls):
        print(f"{visit[0][0]}: " + ", ".join(IMPL_LABEL[impl] for _, impl in visit))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print_plan(args)
        return 0
    # FA2 built as sm80 + PTX is JIT-compiled by the driver on Hopper; a large JIT cache keeps
    # those results for the next run (the driver's default is 256 MiB).
    os.environ.setdefault("CUDA_CACHE_MAXSIZE", str(4 * 2**30))
    import torch

    if not torch.cuda.is_available():
        print("kernels.py needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    result = run(args)
    out = common.write_json(args.out / "kernels.json", result)
    chart = plot(result, args.out / "kernels.png")
    print(f"[kernels] wrote {out}" + (f" and {chart}" if chart else ""), file=sys.stderr)
    print_results(result, plain=args.plain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
