#!/usr/bin/env python3
"""The interface's per-call Python work on the CPU, two source trees side by side in one run:
``--before REV`` (a git revision of this repository) against the working tree (or ``--after
REV``), so that a change to the call path is measured against the code it replaces under the
same load, round by round.

Each tree runs in a process of its own (two trees cannot share one ``vendored_flash_attn``);
the parent asks the two in turn, alternating which goes first, for one sample of every variant,
so drift in the machine's load hits both alike. Setup in each process: benchmarks/overhead.py's
``--cpu`` setup (fake ops with upstream's schemas on a described GPU of compute capability 9.0,
a full build), decode-sized paged calls (overhead.py's DecodeInputs), every op a stub: the
difference between a variant and its raw row is the Python the interface adds per call.

Variants (µs per call; "over raw" subtracts the raw stub call with the arguments the interface
passed it, as overhead.py's isolated mode does):
  none_harness   flash_attn_varlen_func(q, k, v, fa_version=None, **kwargs): overhead.py's call
  none_keywords  the same call with its keywords written out, as vLLM's backend writes it (no
                 dict built and unpacked per call)
  fa3 / fa2      fa_version=3 / 2, overhead.py's call
  upstream_fa3 / upstream_fa2   upstream's wrapper at the pin (--upstream-file), same stubs
  upstream_fa3_keywords         upstream's FA3 called as none_keywords is
  metadata_reads the 25 tensor-metadata reads the quick path's checks make for this call on a
                 CPU runtime, alone (absolute µs): the floor of a Python check of this call
Two modes:
  isolated       the stub returns at once (overhead.py's isolated mode)
  polluted       the stub first copies --pollute-kib KiB between two buffers (a torch op, so the
                 dispatcher's C++ runs too): like a real op's 40-70 µs of host code, it leaves the
                 interpreter's caches cold for the next call, as the GPU's "stalled" mode does.
                 Both sides of each difference pay the same copy.

Output: a table per mode (before, after, after - before; the minimum over the rounds, over raw) and overhead-compare.json in
--out. Example: ``python benchmarks/overhead_compare.py --before main --upstream-file
.upstream-tests/flash_attn_interface.py``.
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import common  # noqa: E402

VARIANTS = ("none_harness", "none_keywords", "fa3", "fa2", "upstream_fa3", "upstream_fa3_keywords", "upstream_fa2",
            "metadata_reads")
RAW = {"none_harness": "raw_fa3", "none_keywords": "raw_fa3", "fa3": "raw_fa3", "fa2": "raw_fa2",
       "upstream_fa3": "raw_fa3", "upstream_fa3_keywords": "raw_fa3", "upstream_fa2": "raw_fa2",
       "metadata_reads": None}
MODES = ("isolated", "polluted")


# --- one tree's process ---------------------------------------------------------------------

def _child(package_root: str, upstream_file: str, pollute_kib: int) -> None:
    """Set up the calls of one tree, then answer ``<mode> <calls>`` lines with one JSON line of
    µs per call per variant."""
    sys.path[:0] = [package_root, str(ROOT / "tests" / "unit")]
    import dataclasses
    import types

    import torch

    import overhead
    import runtime_fakes
    from vendored_flash_attn import flash_attn_varlen_func, interface
    from vendored_flash_attn.selection.environment import StaticEnvironment, set_environment

    set_environment(StaticEnvironment(build=runtime_fakes.make_build("full"), capabilities=(runtime_fakes.HOPPER,),
                                      device_type="cpu"))
    runtime_fakes.register_fake_ops()
    inp = overhead.DecodeInputs(256, [overhead.PAGE_SIZE] * 256, device="cpu")
    q, k, v = inp.q, inp.k, inp.v
    kwargs = overhead.call_kwargs(inp)
    cu, used, table = inp.cu_seqlens_q, inp.seqused_k, inp.block_table
    for version in (3, None, 2):
        flash_attn_varlen_func(q, k, v, fa_version=version, **kwargs)  # resolved with the fake ops
    empty = q.new_empty(0)
    source, sink = torch.zeros(pollute_kib * 256), torch.zeros(pollute_kib * 256)
    state = {"pollute": False}
    recorded: dict = {}

    def make(version, results, record):
        def stub(*args):
            if state["pollute"]:
                sink.copy_(source)
            if record:
                recorded.setdefault(version, args)
            return results
        return stub

    ours = {2: make(2, [empty, empty], True), 3: make(3, [empty] * 4, True)}
    for key, entry in list(interface._resolved.items()):
        interface._resolved[key] = dataclasses.replace(entry, op=ours[entry.family.version])
    calls = {
        "none_harness": lambda: flash_attn_varlen_func(q, k, v, fa_version=None, **kwargs),
        "none_keywords": overhead.keyword_call(flash_attn_varlen_func, q, k, v, kwargs, None),
        "fa3": lambda: flash_attn_varlen_func(q, k, v, fa_version=3, **kwargs),
        "fa2": lambda: flash_attn_varlen_func(q, k, v, fa_version=2, **kwargs),
    }
    for call in calls.values():
        call()
    def metadata_reads():
        # The tensor metadata the quick path reads for this call on a CPU runtime (interface._quick,
        # every check it makes, none of its logic): its floor in Python.
        q.shape, q.get_device(), q.dtype, q.is_cpu, q.is_contiguous()
        k.shape, k.dtype, k.is_cpu, k.is_contiguous()
        v.shape, v.dtype, v.is_cpu, v.is_contiguous()
        cu.is_cpu, cu.shape, cu.dtype, cu.is_contiguous()
        used.is_cpu, used.shape, used.dtype, used.is_contiguous()
        table.is_cpu, table.shape, table.dtype, table.stride(-1)  # one column: stride(-1), not is_contiguous()

    calls["metadata_reads"] = metadata_reads
    for version, name in ((3, "raw_fa3"), (2, "raw_fa2")):
        calls[name] = lambda stub=ours[version], args=recorded[version]: stub(*args)
    if upstream_file:
        import upstream_interface

        data, info = upstream_interface.read_source(Path(upstream_file))
        upstream_interface.op_aliases().__enter__()  # for this process's life
        upstream = upstream_interface.load(data, info["commit"][:12])
        torch.ops._vllm_fa2_C = types.SimpleNamespace(varlen_fwd=make(2, [empty, empty], False))
        torch.ops._vllm_fa3_C = types.SimpleNamespace(fwd=make(3, [empty] * 4, False))
        for version in (3, 2):
            calls[f"upstream_fa{version}"] = (
                lambda version=version: upstream.flash_attn_varlen_func(q, k, v, fa_version=version, **kwargs))
        calls["upstream_fa3_keywords"] = overhead.keyword_call(upstream.flash_attn_varlen_func, q, k, v, kwargs, 3)
    full_path = [0]
    real_check = interface.check_varlen_call

    def counted(*args, **kw):
        full_path[0] += 1
        return real_check(*args, **kw)

    interface.check_varlen_call = counted
    print(json.dumps({"ready": sorted(calls)}), flush=True)
    for line in sys.stdin:
        mode, count = line.split()
        state["pollute"] = mode == "polluted"
        sample = {}
        gc.collect()
        gc.disable()
        for name, call in calls.items():
            t0 = time.perf_counter()
            for _ in range(int(count)):
                call()
            sample[name] = (time.perf_counter() - t0) / int(count) * 1e6
        gc.enable()
        sample["_full_path_calls"] = full_path[0]
        print(json.dumps(sample), flush=True)


# --- the parent -----------------------------------------------------------------------------

def _tree(rev: str, dest: Path) -> Path:
    """``rev``'s python/ folder (and the declaration it reads from a checkout), extracted under
    ``dest``; its package root."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "python", "cmake/knobs.json",
                              "pyproject.toml"],
                             capture_output=True, check=True, timeout=60).stdout
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "python"


def _spawn(package_root: Path, args) -> subprocess.Popen:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", str(package_root),
               "--pollute-kib", str(args.pollute_kib)]
    if args.upstream_file:
        command += ["--upstream-file", str(args.upstream_file)]
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    ready = json.loads(process.stdout.readline() or "{}")
    if "ready" not in ready:
        raise SystemExit(f"overhead_compare: the process for {package_root} did not start (see its error above)")
    return process


def _ask(process: subprocess.Popen, mode: str, calls: int) -> dict:
    process.stdin.write(f"{mode} {calls}\n")
    process.stdin.flush()
    return json.loads(process.stdout.readline())


def summarize(samples: dict) -> dict:
    """{tree: {mode: [sample, ...]}} -> per mode and variant: each tree's minimum over the rounds
    minus its raw row's minimum (the raw row itself for raw_*), the same of the medians, and
    after - before of the minima. The minimum is the figure: on a shared, loaded machine a
    sample is only ever slowed (another process took the core), and the least disturbed sample
    of each is what the code costs."""
    result: dict = {}
    for mode in MODES:
        rows = {}
        for name in VARIANTS + ("raw_fa3", "raw_fa2"):  # raw_* and metadata_reads: absolute µs
            row = {}
            for tree, by_mode in samples.items():
                found = by_mode.get(mode, [])
                if not found or name not in found[0]:
                    continue
                for label, pick in ((tree, min), (f"{tree}_median", statistics.median)):
                    row[label] = pick(s[name] for s in found) - (
                        0.0 if RAW.get(name) is None else pick(s[RAW[name]] for s in found))
            if "before" in row and "after" in row:
                row["after_minus_before"] = row["after"] - row["before"]
            if row:
                rows[name] = row
        result[mode] = rows
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", help="git revision of the code before (required unless --child)")
    p.add_argument("--after", default=None, help="git revision of the code after (default: the working tree)")
    p.add_argument("--rounds", type=int, default=21, help="rounds; each asks both trees for one sample per mode")
    p.add_argument("--calls", type=int, default=500, help="calls per variant per sample")
    p.add_argument("--pollute-kib", type=int, default=64, help="KiB the polluted mode's stub copies per call")
    p.add_argument("--upstream-file", type=Path, default=None,
                   help="upstream's vllm_flash_attn/flash_attn_interface.py at the pin (blob checked)")
    p.add_argument("--out", type=Path, default=Path("bench-results"))
    p.add_argument("--plain", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.child, str(args.upstream_file or ""), args.pollute_kib)
        return 0
    if not args.before:
        p.error("--before REV is required")
    with tempfile.TemporaryDirectory(prefix="overhead-compare-") as tmp:
        roots = {"before": _tree(args.before, Path(tmp) / "before"),
                 "after": _tree(args.after, Path(tmp) / "after") if args.after else ROOT / "python"}
        processes = {tree: _spawn(root, args) for tree, root in roots.items()}
        samples: dict = {tree: {mode: [] for mode in MODES} for tree in processes}
        load = []
        try:
            for number in range(args.rounds):
                order = ("before", "after") if number % 2 == 0 else ("after", "before")
                for mode in MODES:
                    for tree in order:
                        samples[tree][mode].append(_ask(processes[tree], mode, args.calls))
                load.append(os.getloadavg()[0])
        finally:
            for process in processes.values():
                process.stdin.close()
                process.wait(timeout=60)
    summary = summarize(samples)
    full_path = {tree: by_mode["polluted"][-1]["_full_path_calls"] for tree, by_mode in samples.items()}
    result = {"benchmark": "overhead-compare", "machine": common.machine_info(gpu=False),
              "before": args.before, "after": args.after or "working tree",
              "settings": {"rounds": args.rounds, "calls": args.calls, "pollute_kib": args.pollute_kib},
              "load_average": {"min": min(load), "max": max(load)}, "full_path_calls": full_path,
              "upstream_file": str(args.upstream_file) if args.upstream_file else None,
              "modes": summary, "samples": samples}
    path = common.write_json(args.out / "overhead-compare.json", result)
    print(f"[overhead_compare] wrote {path}", file=sys.stderr)
    for mode in MODES:
        rows = [[name, common.fmt(row.get("before"), 2), common.fmt(row.get("after"), 2),
                 common.fmt(row.get("after_minus_before"), 2)] for name, row in summary[mode].items()]
        notes = [f"before = {args.before}, after = {args.after or 'the working tree'}; minimum over {args.rounds} "
                 f"interleaved rounds of {args.calls} calls (medians in the JSON); rows but raw_*: µs over the raw "
                 "stub call's minimum; upstream_*: the same code in both trees (the noise)",
                 f"load average {min(load):.1f}-{max(load):.1f}; calls that reached the full path after "
                 f"warm-up: {full_path} (0: every timed call took the quick path)"]
        common.print_table(f"{mode}: µs per call (CPU, fake ops, stubbed)", ["variant", "before", "after",
                                                                            "after - before"], rows, notes,
                           plain=args.plain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
