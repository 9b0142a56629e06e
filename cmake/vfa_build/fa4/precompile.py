#!/usr/bin/env python3
"""FA4 (upstream's ``flash_attn/cute``, CuTe DSL) as a subpackage of ours, compiled ahead of time.

The build steps cmake/FA4Package.cmake runs, and the checks around them (docs/fa4.md says
why each choice was made and what was measured). This file is their command line; each
concern is a module of its own beside it:

``probe`` (fa4/probe.py)
    What the build's Python can do: stage FA4? precompile its kernels? (JSON, for CMake.)

``stage`` (fa4/stage.py)
    Copies the pinned ``flash_attn/cute`` sources into ``<dest>/<package path>`` and rewrites
    their absolute ``flash_attn.cute`` imports to our subpackage
    (``vendored_flash_attn._fa4.cute``), so the copy never shadows, and is never shadowed
    by, a real ``flash_attn`` install; writes FA4's build record into the stage. Needs
    nothing but the standard library (+ packaging).

``plan`` (python/vendored_flash_attn/families/fa4/plan.py: the installed wheel's check reads it too)
    Prints the kernels of FA4's selection (its knobs' head dims, dtypes, features and GQA
    ratios, LSE) that vLLM's calls reach through the adapter on an arch, one per compile key.

``compile`` (fa4/compile.py; ``--jobs N``: fa4/workers.py; ``--share FILE``: fa4/share.py)
    Makes those calls through FA4's adapter (``vendored_flash_attn.families.fa4.adapter.run``) on fake CUDA
    tensors (torch ``FakeTensorMode``), so each call compiles one real kernel (SASS for
    ``--arch``) with the compile key a run-time call gets, and launches nothing: no GPU is
    needed. Needs torch and the ``fa4`` extra in the interpreter that runs it (one kernel set
    per Python: upstream's fingerprint holds the Python minor). The kernels land in
    ``<out>/<dsl flavour>/<upstream fingerprint>/<kernel kind>/<key hash>.o``: upstream's
    fingerprint covers the sources, Python minor, cutlass and tvm-ffi versions but not which
    CUDA build of the DSL compiled (cu12 and cu13 builds of ``nvidia-cutlass-dsl`` have one
    version string), so the flavour directory above it keeps kernels of one flavour from
    ever loading in the other. ``--jobs N`` compiles in N supervised worker processes;
    ``--share FILE`` ships one kernel set for every Python whose kernels are the same bytes
    (fa4/share.py says how); ``--best-effort`` (VFA_FA4_PRECOMPILE=auto) turns any failure
    into one warning and ships none of the run's kernels.

``verify``
    Loads them back as the installed wheel does; a kernel that compiles instead fails it.

``check-installed``
    On a GPU, with the wheel installed: every kernel it precompiled for this Python and GPU
    runs through the public call on real data with nothing compiled. The check lives beside
    the other wheel checks (``python -m vendored_flash_attn.release.wheel_check fa4-kernels``,
    python/vendored_flash_attn/release/fa4_kernels.py); this subcommand runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[3]
# The build uses this checkout's package (fa4_deps, fa4_cache, fa4_plan, the adapter);
# `check-installed` tests the installed wheel, so it must not put the checkout first.
if sys.argv[1:2] != ["check-installed"]:
    sys.path.insert(0, str(PROJECT / "python"))
from vfa_build.fa4 import compile as fa4_compile  # noqa: E402
from vfa_build.fa4 import probe as fa4_probe  # noqa: E402
from vfa_build.fa4 import share as fa4_share  # noqa: E402
from vfa_build.fa4 import stage as fa4_stage  # noqa: E402
from vfa_build.fa4 import workers as fa4_workers  # noqa: E402
from vendored_flash_attn.families.fa4 import cache as fa4_cache, plan as fa4_plan  # noqa: E402  (standard library only)


def selection_from_args(args: argparse.Namespace) -> fa4_plan.Selection:
    def words(text):
        return tuple(x for x in re.split(r"[,;\s]+", text.strip()) if x)

    lse = {"no": (False,), "yes": (True,), "both": (False, True)}[args.lse]
    return fa4_plan.Selection(tuple(int(x) for x in words(args.head_dims)), words(args.dtypes),
                              words(args.features), tuple(int(x) for x in words(args.gqa_ratios)), lse)


def produce(args: argparse.Namespace, calls: list[fa4_plan.KernelCall]) -> dict:
    """The kernels of ``compile``: another Python's files where ``--share`` finds every one of
    them the same, else this Python's own (then recorded in ``--share`` for the next Python)."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if args.share:
        report, why = fa4_share.share_run(args.stage, args.out, args.arch, calls, args.share, args.jobs,
                                          bounds(args))
        if report is not None:
            if why:
                print(f"Python {python} ships its own FA4 kernels for {args.arch}: {why}", flush=True)
            return report
        print(f"Python {python} compiles its own FA4 kernels for {args.arch}: {why}", flush=True)
    return fa4_workers.compile_in_workers(args.stage, args.out, args.arch, calls, args.jobs, bounds(args))


def bounds(args: argparse.Namespace) -> "fa4_workers.Bounds":
    return fa4_workers.Bounds(kernel_seconds=args.kernel_timeout)


def keep_share_record(args: argparse.Namespace, report: dict) -> None:
    """After a run that compiled every kernel it was asked for: the record the next Python shares."""
    if args.share and "same_as" not in report:
        args.share.parent.mkdir(parents=True, exist_ok=True)
        args.share.write_text(json.dumps(fa4_share.share_record(report), indent=1, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p_stage = sub.add_parser("stage", help="copy flash_attn/cute as our subpackage, imports rewritten")
    p_stage.add_argument("--cute-src", type=Path, required=True, help="upstream's flash_attn/cute directory")
    p_stage.add_argument("--dest", type=Path, required=True, help="import root to stage into")
    p_stage.add_argument("--record", type=Path,
                         help="JSON of configure-time facts: write FA4's build record into the stage")
    p_probe = sub.add_parser("probe", help="print what the build's Python can do (JSON)")
    p_probe.add_argument("--named", action="store_true",
                       help="this is an interpreter of VFA_FA4_PRECOMPILE_PYTHONS: reasons name it")
    p_check = sub.add_parser("check-installed", help="on a GPU: the installed wheel's precompiled kernels run "
                             "with no compile (FLASH_ATTENTION_CUTE_DSL_CACHE_DIR: an empty folder)")
    p_check.add_argument("--report", type=Path, help="write the result as JSON here")
    defaults = fa4_plan.Selection()  # the minimal preset's (cmake/knobs.json)
    for name in ("plan", "compile", "verify"):
        p = sub.add_parser(name)
        for axis, knob in fa4_plan.KNOBS.items():
            p.add_argument(f"--{axis.replace('_', '-')}", default=",".join(map(str, getattr(defaults, axis))),
                           help=f"FA4's selection: {knob} (default: the minimal preset's)")
        p.add_argument("--lse", choices=("no", "yes", "both"), default="both")
        p.add_argument("--arch", default="sm_90a")
        if name in ("compile", "verify"):
            p.add_argument("--stage", type=Path, required=True, help="import root made by `stage`")
            p.add_argument("--out", type=Path, required=True,
                           help="cache root to compile into (verify: to load from; nothing may compile)")
            p.add_argument("--report", type=Path, help="write the report as JSON here")
        if name == "compile":
            p.add_argument("--jobs", type=int, default=1,
                           help="worker processes (each imports the DSL: about 1.4 GB); the build passes its job count")
            p.add_argument("--kernel-timeout", type=float, default=None,
                           help="seconds a worker may go without finishing a kernel (the build passes "
                                "VFA_FA4_PRECOMPILE_KERNEL_TIMEOUT); given, every job runs in a supervised worker")
            p.add_argument("--record", type=Path, help="FA4's build record in the stage: add this run to it")
            p.add_argument("--share", type=Path,
                           help="one kernel set for every Python: absent, compile and record the keys here; "
                                "written by another Python, ship its kernels for this one where they are the same bytes")
            p.add_argument("--best-effort", action="store_true",
                           help="a build that did not ask for kernels: on any failure warn, ship none of "
                                "this run's kernels, exit 0")
    p_worker = sub.add_parser("compile-worker", help=argparse.SUPPRESS)
    for flag in ("--stage", "--out", "--calls", "--report", "--progress"):
        p_worker.add_argument(flag, type=Path, required=True)
    p_worker.add_argument("--arch", required=True)
    args = parser.parse_args(argv)
    if args.command == "compile-worker":  # one share of `compile --jobs N` (compile_in_workers)
        todo = [fa4_plan.KernelCall(**c) for c in json.loads(args.calls.read_text(encoding="utf-8"))]
        args.report.write_text(json.dumps(fa4_compile.compile_selection(args.stage, args.out, args.arch, todo,
                                                                        progress=args.progress)), encoding="utf-8")
        return 0
    if args.command == "probe":
        print(json.dumps(fa4_probe.probe(named=args.named)))
        return 0
    if args.command == "check-installed":
        from vendored_flash_attn.release.fa4_kernels import check_installed

        return check_installed(args.report)
    if args.command == "stage":
        summary = fa4_stage.stage(args.cute_src, args.dest)
        if args.record:
            fa4_stage.write_record(args.dest, json.loads(args.record.read_text(encoding="utf-8")), summary)
        print(f"staged {summary['files']} files ({summary['bytes']} bytes, {len(summary['rewritten'])} "
              f"with imports rewritten) as {summary['package']}")
        return 0
    selection = selection_from_args(args)
    calls = fa4_plan.plan(selection, args.arch)
    if args.command == "plan":
        for call in calls:
            print(call.name)
        return 0
    if args.command == "compile" and args.best_effort:
        return compile_best_effort(args, calls)
    verify = args.command == "verify"
    report = (fa4_compile.compile_selection(args.stage, args.out, args.arch, calls, verify=True) if verify
              else produce(args, calls))
    if args.report:
        args.report.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    failed = [c["call"] for c in report["calls"] if c["error"] or (verify and c["objects"])]
    refused = sorted({c["call"] for c in report["calls"] if c["refused"]})
    if verify:
        print(f"{len(calls) - len(set(failed)) - len(refused)} of {len(calls)} kernels loaded from "
              f"{args.out / report['flavour']} without compiling ({len(refused)} refused by FA4)")
        return 1 if failed else 0
    if not failed:
        keep_share_record(args, report)
    if args.record:
        fa4_stage.add_precompile_run(args.record, _run_summary(args.arch, report, failed, selection_from_args(args)))
    how = (f"shipped once: Python {report['same_as']['python']}'s files, {report['aliases']} listed in this "
           f"Python's {fa4_cache.ALIASES_FILE}" if "same_as" in report else "compiled")
    print(f"{len(calls) - len(failed) - len(refused)} of {len(calls)} kernels {how} into "
          f"{args.out / report['flavour']} for Python {report['python']} ({len(refused)} refused by FA4; import "
          f"{report['import_seconds']} s, peak RSS {report['peak_rss_mb']} MB)")
    return 1 if failed else 0


def _shipped_objects(report: dict) -> dict[str, int]:
    """The kernel files a run wrote (each once: with workers, a call's before/after listing
    of the folder can also hold another worker's kernel)."""
    return {path: size for call in report["calls"] for path, size in call["objects"].items()}


def compile_best_effort(args: argparse.Namespace, calls: list[fa4_plan.KernelCall]) -> int:
    """``compile`` for a build that did not ask for kernels (VFA_FA4_PRECOMPILE=auto): any
    failure is one warning, the kernels of this run are removed (those of other Pythons or
    archs in the same folder stay), the build goes on."""
    before = set(fa4_cache.kernel_files(args.out))
    try:
        report = produce(args, calls)
        failed = [c["call"] for c in report["calls"] if c["error"]]
    except Exception as exc:  # noqa: BLE001 - an import error deep in cutlass included
        # Not BaseException: Ctrl-C and SIGTERM stop the build (non-zero), never a warning.
        # The workers have all stopped by now (compile_in_workers), so the clean-up below
        # sees every file this run wrote.
        report, failed = None, [f"{type(exc).__name__}: {exc}"]
    if not failed:
        keep_share_record(args, report)
    if failed:
        for rel in set(fa4_cache.kernel_files(args.out)) - before:
            (args.out / rel).unlink()
        print(f"WARNING: vendored-flash-attn: FA4 kernels for {args.arch} (Python {sys.version_info.major}."
              f"{sys.version_info.minor}) not precompiled (VFA_FA4_PRECOMPILE=auto): {'; '.join(failed)[:2000]}. "
              "The wheel compiles them at first use; set VFA_FA4_PRECOMPILE=on to make this an error, off to "
              "skip it.", flush=True)
    if args.record:
        fa4_stage.add_precompile_run(args.record, _run_summary(args.arch, report, failed, selection_from_args(args)))
    return 0


def _run_summary(arch: str, report: dict | None, failed: list[str], selection: fa4_plan.Selection) -> dict:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    chosen = dataclasses.asdict(selection)
    if report is None or failed:
        return {"arch": arch, "python": python, "kernels": 0, "selection": chosen,
                "error": fa4_stage.portable("; ".join(failed))[:2000]}
    calls = report["calls"]
    shipped = {**_shipped_objects(report), **report.get("aliased", {})}
    # A Python sharing another's kernels: its kernels are the aliases its index lists.
    kernels = report["aliases"] if "same_as" in report else len(shipped)
    same_as = ({"same_as": {k: report["same_as"][k] for k in ("python", "fingerprint", "index_sha256")
                            if k in report["same_as"]}} if "same_as" in report else {})
    return {"arch": arch, "kernels": kernels, "selection": chosen, "jobs": report.get("jobs", 1),
            "calls": len(calls), "refused": sorted({c["call"] for c in calls if c["refused"]}),
            "bytes": sum(shipped.values()), **same_as,
            **{k: report[k] for k in ("flavour", "python", "cutlass", "tvm_ffi", "fingerprint")}}


if __name__ == "__main__":
    if sys.argv[1:2] == ["compile-worker"]:  # its supervisor stops it (fa4_workers)
        sys.exit(main())
    try:
        # Ctrl-C or SIGTERM at any moment of the step (before, during or after its workers'
        # run) stops it with the line below, never a traceback or a warning.
        with fa4_workers.stop_signals():
            code = main()
        sys.exit(code)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM: stop the build
        print("fa4/precompile.py: interrupted; every FA4 compile worker it started has stopped", file=sys.stderr)
        sys.exit(130)
