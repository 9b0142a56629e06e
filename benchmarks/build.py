#!/usr/bin/env python3
"""Build benchmark: cold build, warm rebuild from another checkout path and build dir,
compiler-cache hit rates, per-translation-unit compile time and peak memory, the job
count the build chose, module sizes, and a projection of the full-preset build time.

Two modes.

Experiment (default): copies the project's tracked and new files (as a fresh clone has
them, like tests/build/test_wheel.py) to WORK/checkout-a and WORK/checkout-b and runs
    python -m pip wheel --no-build-isolation --no-deps -v -Cbuild-dir=WORK/build-X
        -Cbuild.verbose=true -Ccmake.define.K=V ... WORK/checkout-X
twice: A cold (a private sccache server with an empty cache dir under WORK), then B
warm (same sccache cache, statistics zeroed, other checkout path, other build dir).
--isolated adds C: the same warm build from a third checkout path and build dir, but with
pip's default build isolation (no --no-build-isolation: pip installs the build
requirements, torch included, into a throwaway environment first), so the cost of
isolation and its cache hits are measured side by side with B.
--synthetic builds the synthetic upstream of the tests (tests/support/synthetic_upstream.py:
upstream's layout and switches, one-line kernels; made under WORK/synthetic) instead of
the pinned one: seconds per unit instead of minutes, for measuring the build machinery
itself (compiler cache, isolation) anywhere. Otherwise the upstream sources are fetched
(or taken from FLASH_ATTN_SRC_DIR / CUTLASS_SRC_DIR /
VFA_SOURCE_CACHE, which both builds share: the design keeps them at one stable absolute
path, which is what lets sccache hit across checkouts). Pass knobs with --define (CMake
cache variables) or --env. While a build runs, /proc is sampled for compiler processes
(nvcc, cicc, ptxas, cudafe++, cc1plus, ...): peak RSS per translation unit (largest
single process, as /usr/bin/time reports it, and the sum of the unit's processes) and
the peak RSS of all compiles together.

Analyse: --analyse BUILD_DIR [...] reads an existing build dir: .ninja_log (per-unit
wall time), build_info.json (build.jobs), the modules' sizes, optionally sccache
statistics (--sccache-stats FILE with `sccache --show-stats --stats-format=json` output,
or --live-stats to ask the running server) and a VFA_TIME_LOG written by
benchmarks/timed_compile.sh.

sccache 0.16 splits an nvcc call into cached steps; the statistics have rows "CUDA"
(the outer nvcc call), "CUDA (Device code)", "PTX", "CUBIN" (inner steps) and "C/C++".
The hit rate is reported over all rows and over the inner rows: the outer "CUDA" row can
read 0% while every inner step hits.

Projection of the full preset (FA3: 190 instantiations + 2 .cu + 2 .cpp; FA2: 76 .cu +
3 .cpp) on N parallel jobs, from the per-unit wall times measured on this build (by
class: FA3 instantiation, FA3 other .cu, FA2 instantiation, .cpp):
    lpt         longest-processing-time-first list schedule of the full unit set on N
                workers (makespan), plus the link time measured here
    lower bound sum(unit costs) / N + link
    homogeneous ceil(units / N) x mean unit cost + link
Assumptions: one core per job (NVCC_THREADS=1), enough memory for N jobs (see the
memory cap printed from the measured per-unit peak RSS), per-unit cost independent of N
(the measured build ran with its own job count: if it oversubscribed cores, its unit
times include that contention), and the full preset's extra head dims / softcap variants
cost what the minimal ones cost (hdim 192/256 units are heavier: the projection is
then a lower estimate). The model is checked against this build: its own unit set
scheduled on its own job count vs the measured ninja span.
"""

from __future__ import annotations

# One file over 500 lines, on purpose: one experiment (two builds, and their ninja log, sccache
# statistics and build info read back into one JSON); its readers serve only it and its tests.

# Why this file names families ("fa2"/"fa3" unit classes, _vendored_fa2_C/_vendored_fa3_C in
# object paths): it classifies the units of a real build by the module folder and source layout
# CMake gives each compiled family (FA3's hopper/instantiations/, FA2's generated stubs), and its
# class names are the keys of the JSON it writes and of the figures docs cite from it.

import argparse
import heapq
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

FULL_PRESET_UNITS = {
    # class: count
    "fa3_instantiation": 190,
    "fa3_cuda_other": 2,     # flash_fwd_combine.cu, flash_prepare_scheduler.cu
    "fa3_cpp": 2,            # flash_api.cpp, flash_api_torch_lib.cpp
    "fa2_instantiation": 76,
    "fa2_cpp": 3,            # flash_api.cpp, flash_api_sparse.cpp, flash_api_torch_lib.cpp
}
INNER_SCCACHE_ROWS = ("CUDA (Device code)", "PTX", "CUBIN")
OUTER_SCCACHE_ROWS = ("CUDA",)
HOST_SCCACHE_ROWS = ("C/C++",)

# --------------------------------------------------------------------------------------
# Pure parsing and modelling (unit-tested on CPU)


@dataclass
class NinjaEntry:
    start_ms: int
    end_ms: int
    output: str
    cmd_hash: str = ""

    @property
    def seconds(self) -> float:
        return (self.end_ms - self.start_ms) / 1000.0


def parse_ninja_log(text: str, session: str = "all") -> list[NinjaEntry]:
    """Entries of a .ninja_log (format v5..v7: start, end, mtime, output, hash; tab
    separated); the last entry per output wins. Ninja appends one line per finished
    output, so end times do not decrease within one build and a decrease marks a new
    build: session="last" keeps only the lines after the last decrease (for a build dir
    that was built more than once; not after ninja recompacted its log, which reorders
    it). The experiment always starts from an empty build dir: one session."""
    sessions: list[list[NinjaEntry]] = [[]]
    prev_end = -1
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) < 4:
            continue
        try:
            start, end = int(parts[0]), int(parts[1])
        except ValueError:
            continue
        entry = NinjaEntry(start, end, parts[3], parts[4] if len(parts) > 4 else "")
        if end < prev_end and sessions[-1]:
            sessions.append([])
        prev_end = end
        sessions[-1].append(entry)
    lines = sessions[-1] if session == "last" else [e for s in sessions for e in s]
    latest: dict[str, NinjaEntry] = {}
    for e in lines:
        latest[e.output] = e
    return list(latest.values())


def classify_output(output: str) -> str:
    """The unit class of one ninja output path (see FULL_PRESET_UNITS), or link / other."""
    o = output.replace("\\", "/")
    name = o.rsplit("/", 1)[-1]
    component = "fa3" if "_vendored_fa3_C" in o else "fa2" if "_vendored_fa2_C" in o else None
    if name.endswith((".so", ".pyd", ".dylib")) and component:
        return f"{component}_link"
    if component is None:
        return "other"
    if "fa2_missing_kernels" in name:
        return "fa2_stubs"
    if name.endswith(".cu.o"):
        if component == "fa3":
            return "fa3_instantiation" if "/instantiations/" in o else "fa3_cuda_other"
        return "fa2_instantiation"
    if name.endswith((".cpp.o", ".cc.o", ".cxx.o")):
        return f"{component}_cpp"
    return "other"


def unit_stats(entries: Iterable[NinjaEntry]) -> dict:
    """Per-class count/sum/mean/min/max seconds, the ninja span, and the units."""
    entries = list(entries)
    classes: dict[str, list[float]] = {}
    units = []
    for e in entries:
        cls = classify_output(e.output)
        classes.setdefault(cls, []).append(e.seconds)
        units.append({"output": e.output, "class": cls, "seconds": e.seconds,
                      "start_s": e.start_ms / 1000.0, "end_s": e.end_ms / 1000.0})
    summary = {cls: {"count": len(xs), "sum_s": sum(xs), "mean_s": sum(xs) / len(xs),
                     "min_s": min(xs), "max_s": max(xs)} for cls, xs in classes.items()}
    span = (max(e.end_ms for e in entries) - min(e.start_ms for e in entries)) / 1000.0 if entries else 0.0
    compile_s = sum(u["seconds"] for u in units if not u["class"].endswith("_link") and u["class"] != "other")
    units.sort(key=lambda u: -u["seconds"])
    return {"classes": summary, "span_s": span, "compile_sum_s": compile_s, "units": units}


def _rate(hits: int, misses: int) -> Optional[float]:
    return hits / (hits + misses) if hits + misses else None


def parse_sccache_stats(data) -> dict:
    """Hit rates from `sccache --show-stats --stats-format=json` (a dict or its text)."""
    if isinstance(data, str):
        data = json.loads(data)
    stats = data.get("stats", data)
    hits = (stats.get("cache_hits") or {}).get("counts") or {}
    misses = (stats.get("cache_misses") or {}).get("counts") or {}
    rows = {}
    for lang in sorted(set(hits) | set(misses)):
        h, m = int(hits.get(lang, 0)), int(misses.get(lang, 0))
        rows[lang] = {"hits": h, "misses": m, "rate": _rate(h, m)}

    def total(names: Optional[Iterable[str]]):
        keys = list(rows) if names is None else [n for n in names if n in rows]
        h = sum(rows[k]["hits"] for k in keys)
        m = sum(rows[k]["misses"] for k in keys)
        return {"hits": h, "misses": m, "rate": _rate(h, m), "rows": keys}

    return {
        "rows": rows,
        "all": total(None),
        "inner": total(INNER_SCCACHE_ROWS),
        "outer_cuda": total(OUTER_SCCACHE_ROWS),
        "host": total(HOST_SCCACHE_ROWS),
        "compile_requests": stats.get("compile_requests"),
        "requests_executed": stats.get("requests_executed"),
        "non_cacheable_compilations": stats.get("non_cacheable_compilations"),
        "compile_fails": stats.get("compile_fails"),
        "cache_errors": sum(((stats.get("cache_errors") or {}).get("counts") or {}).values()),
        "cache_location": data.get("cache_location"),
        "version": data.get("version"),
    }


def lpt_makespan(costs: Iterable[float], workers: int) -> float:
    """Makespan of a longest-processing-time-first list schedule on ``workers``."""
    if workers < 1:
        raise ValueError("workers must be >= 1")
    loads = [0.0] * workers
    heapq.heapify(loads)
    for c in sorted(costs, reverse=True):
        heapq.heappush(loads, heapq.heappop(loads) + c)
    return max(loads) if loads else 0.0


def class_costs(classes: dict) -> dict[str, float]:
    """Mean seconds per unit class, filling classes this build lacked: FA3 .cpp from FA2
    .cpp and back, FA3 other .cu from the FA3 .cpp (both are small)."""
    mean = {cls: v["mean_s"] for cls, v in classes.items() if v.get("count")}
    out = {}
    for cls in FULL_PRESET_UNITS:
        if cls in mean:
            out[cls] = mean[cls]
    if "fa3_cpp" not in out and "fa2_cpp" in out:
        out["fa3_cpp"] = out["fa2_cpp"]
    if "fa2_cpp" not in out and "fa3_cpp" in out:
        out["fa2_cpp"] = out["fa3_cpp"]
    if "fa3_cuda_other" not in out and "fa3_cpp" in out:
        out["fa3_cuda_other"] = out["fa3_cpp"]
    return out


def project_build(costs: dict[str, float], units: dict[str, int], workers: Iterable[int],
                  link_s: float = 0.0) -> list[dict]:
    """Projected wall seconds of building ``units`` (class: count) on N workers."""
    missing = [cls for cls, n in units.items() if n and cls not in costs]
    unit_costs = [costs[cls] for cls, n in units.items() if cls in costs for _ in range(n)]
    total_units = len(unit_costs)
    mean = sum(unit_costs) / total_units if total_units else 0.0
    rows = []
    for n in workers:
        rows.append({
            "workers": n,
            "lpt_s": lpt_makespan(unit_costs, n) + link_s,
            "lower_bound_s": sum(unit_costs) / n + link_s,
            "homogeneous_s": math.ceil(total_units / n) * mean + link_s if total_units else link_s,
            "units": total_units,
            "missing_classes": missing,
        })
    return rows


def parse_time_log(text: str) -> dict[str, dict]:
    """Lines of timed_compile.sh: OUTPUT<TAB>WALL_S MAXRSS_KB -> {output: {...}}."""
    out = {}
    for line in text.splitlines():
        if "\t" not in line:
            continue
        output, _, rest = line.partition("\t")
        parts = rest.split()
        if len(parts) < 2:
            continue
        try:
            out[output] = {"wall_s": float(parts[0]), "max_rss_mb": int(parts[1]) / 1024.0}
        except ValueError:
            continue
    return out


_SOURCE_RE = re.compile(r"([\w.+-]+?)\.(?:cu|cpp|cc|cxx)(?:\.o)?$")
_TMP_RE = re.compile(r"tmpxft_[0-9a-f]+_[0-9a-f]+-\d+_([\w+-]+?)\.")
_NV_TMP_RE = re.compile(r"([\w+-]+?)\.(?:cpp\d\.ii|cudafe1\.\w+|module_id|fatbin(?:\.c)?|stub\.c|ptx|cubin)$")


def unit_key_from_cmdline(args: list[str]) -> Optional[str]:
    """The translation unit a compiler process works on, from its arguments: the stem of
    its .cu/.cpp source (or .o output), or of nvcc's intermediate files (x.cpp1.ii,
    tmpxft_..._x.cudafe1.cpp, x.ptx, ...). A link (output *.so) is "(link NAME)", not the
    unit of its first object file. None when nothing looks like one."""
    for prev, a in zip(args, args[1:]):
        if prev == "-o" and a.endswith((".so", ".dylib")):
            return f"(link {a.rsplit('/', 1)[-1]})"
    for a in args:
        base = a.rsplit("/", 1)[-1]
        m = _TMP_RE.search(base)
        if m:
            return m.group(1)
    for a in args:
        base = a.rsplit("/", 1)[-1]
        m = _SOURCE_RE.search(base)
        if m:
            return m.group(1)
    for a in args:
        base = a.rsplit("/", 1)[-1]
        m = _NV_TMP_RE.search(base)
        if m:
            return m.group(1).split(".")[0]
    return None


# --------------------------------------------------------------------------------------
# /proc sampler of compiler processes

COMPILER_COMMS = {"nvcc", "cicc", "ptxas", "cudafe++", "cc1plus", "cc1", "fatbinary", "nvlink", "gcc", "g++",
                  "c++", "cc", "clang", "clang++", "collect2", "ld", "as", "nvdisasm", "cu++filt"}


class RssSampler(threading.Thread):
    """Samples /proc every ``interval`` s while a build runs (Linux only)."""

    def __init__(self, interval: float = 0.25):
        super().__init__(daemon=True)
        self.interval = interval
        self._halt = threading.Event()
        self.page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self.unit_peak_tree: dict[str, float] = {}
        self.unit_peak_single: dict[str, float] = {}
        self.peak_total_mb = 0.0
        self.peak_concurrent_units = 0
        self.samples = 0
        self.available = Path("/proc").is_dir()

    def stop(self):
        self._halt.set()
        self.join(timeout=5)

    def run(self):
        while self.available and not self._halt.is_set():
            try:
                self._sample()
            except Exception:  # noqa: BLE001 - a sampler must never break the build
                pass
            self._halt.wait(self.interval)

    def _sample(self):
        procs = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
                comm = stat[stat.index("(") + 1: stat.rindex(")")]
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
                if comm not in COMPILER_COMMS:
                    procs[int(d)] = (ppid, comm, None, 0.0)
                    continue
                with open(f"/proc/{d}/statm") as f:
                    rss = int(f.read().split()[1]) * self.page / 2**20
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    args = f.read().decode(errors="replace").split("\0")
                procs[int(d)] = (ppid, comm, unit_key_from_cmdline(args), rss)
            except (OSError, ValueError, IndexError):
                continue
        per_unit: dict[str, float] = {}
        total = 0.0
        for pid, (ppid, comm, key, rss) in procs.items():
            if comm not in COMPILER_COMMS:
                continue
            total += rss
            k, p, hops = key, ppid, 0
            while k is None and p in procs and hops < 8:  # inherit the unit of an ancestor
                k, p, hops = procs[p][2], procs[p][0], hops + 1
            k = k or f"(unattributed {comm})"
            per_unit[k] = per_unit.get(k, 0.0) + rss
            self.unit_peak_single[k] = max(self.unit_peak_single.get(k, 0.0), rss)
        for k, v in per_unit.items():
            self.unit_peak_tree[k] = max(self.unit_peak_tree.get(k, 0.0), v)
        self.peak_total_mb = max(self.peak_total_mb, total)
        self.peak_concurrent_units = max(self.peak_concurrent_units,
                                         sum(1 for k in per_unit if not k.startswith("(")))
        self.samples += 1

    def result(self) -> dict:
        units = {k: {"peak_single_mb": self.unit_peak_single.get(k, 0.0), "peak_tree_mb": v}
                 for k, v in sorted(self.unit_peak_tree.items(), key=lambda kv: -kv[1])}
        return {"available": self.available, "interval_s": self.interval, "samples": self.samples,
                "peak_total_mb": self.peak_total_mb, "peak_concurrent_units": self.peak_concurrent_units,
                "units": units}


# --------------------------------------------------------------------------------------
# Analysis of a build dir


def module_sizes(paths: Iterable[Path]) -> dict[str, int]:
    sizes = {}
    for p in paths:
        p = Path(p)
        if p.suffix == ".whl" and p.is_file():
            with zipfile.ZipFile(p) as z:
                for info in z.infolist():
                    if info.filename.endswith(".so"):
                        sizes[info.filename.rsplit("/", 1)[-1]] = info.file_size
        elif p.is_dir():
            for so in p.rglob("_vendored_fa*_C*.so"):
                sizes.setdefault(so.name, so.stat().st_size)
    return sizes


def analyse_build_dir(build_dir: Path, stats: Optional[dict] = None, time_log: Optional[Path] = None,
                      cores: Iterable[int] = (16, 32, 64, 128), memory_gb: Optional[float] = None,
                      rss: Optional[dict] = None) -> dict:
    build_dir = Path(build_dir)
    out: dict = {"build_dir": str(build_dir)}
    log = build_dir / ".ninja_log"
    if log.is_file():
        entries = parse_ninja_log(log.read_text(errors="replace"))
        out["ninja"] = unit_stats(entries)
    else:
        out["ninja"] = None
        out["ninja_error"] = f"{log} not found"
    info_path = build_dir / "build_info.json"
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        out["build_info"] = info
        out["jobs"] = (info.get("build") or {}).get("jobs")
        out["jobs_reason"] = (info.get("build") or {}).get("jobs_reason")
        out["nvcc_threads"] = (info.get("build") or {}).get("nvcc_threads")
        out["preset"] = info.get("preset")
        out["fa2_gencode"] = (info.get("fa2") or {}).get("gencode")
    out["module_sizes"] = module_sizes([build_dir])
    if stats is not None:
        out["sccache"] = parse_sccache_stats(stats)
    if time_log is not None and Path(time_log).is_file():
        out["time_log"] = parse_time_log(Path(time_log).read_text())
    if rss is not None:
        out["rss"] = rss
    if out["ninja"]:
        classes = out["ninja"]["classes"]
        costs = class_costs(classes)
        link = max((classes[c]["max_s"] for c in ("fa2_link", "fa3_link") if c in classes), default=0.0)
        out["projection"] = projection(out, costs, link, cores, memory_gb)
    return out


def projection(analysis: dict, costs: dict, link_s: float, cores: Iterable[int],
               memory_gb: Optional[float]) -> dict:
    ninja = analysis["ninja"]
    jobs = analysis.get("jobs")
    result: dict = {"model": "lpt list schedule of the full preset's units with per-class mean costs "
                             "measured on this build, + link; lower bound sum/N; homogeneous ceil(n/N)*mean",
                    "class_costs_s": costs, "link_s": link_s, "full_preset_units": FULL_PRESET_UNITS}
    result["rows"] = project_build(costs, FULL_PRESET_UNITS, list(cores), link_s)
    core_seconds = sum(costs.get(c, 0.0) * n for c, n in FULL_PRESET_UNITS.items())
    result["full_preset_core_hours"] = core_seconds / 3600.0
    if jobs:
        measured_units = [u["seconds"] for u in ninja["units"]
                          if not u["class"].endswith("_link") and u["class"] != "other"]
        predicted = lpt_makespan(measured_units, int(jobs)) + link_s
        result["self_check"] = {"jobs": jobs, "predicted_span_s": predicted, "measured_span_s": ninja["span_s"],
                                "error": (predicted - ninja["span_s"]) / ninja["span_s"] if ninja["span_s"] else None}
    rss = analysis.get("rss") or {}
    peaks = [u["peak_tree_mb"] for k, u in (rss.get("units") or {}).items() if not k.startswith("(")]
    if analysis.get("time_log"):
        peaks += [v["max_rss_mb"] for v in analysis["time_log"].values()]
    if peaks:
        per_job_gb = max(peaks) / 1024.0
        result["peak_unit_rss_gb"] = per_job_gb
        if memory_gb:
            result["memory_gb"] = memory_gb
            result["max_jobs_by_memory"] = max(1, int(memory_gb // per_job_gb))
    return result


# --------------------------------------------------------------------------------------
# The cold / warm experiment


def tool(name: str) -> Optional[str]:
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    return shutil.which(name)


def checkout_copy(project: Path, dest: Path, exclude: Iterable[Path] = ()) -> Path:
    """The project's tracked and new (not ignored) files, as a fresh clone has them,
    minus anything under ``exclude`` (the benchmark's own work and output folders)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=project,
                            capture_output=True, check=True).stdout.decode().split("\0")
    skip = [Path(p).resolve() for p in exclude]
    if dest.exists():
        shutil.rmtree(dest)
    for rel in listed:
        if not rel:
            continue
        src = project / rel
        if rel.split("/", 1)[0] in ("bench-results", "bench-build") or any(
                src.resolve().is_relative_to(p) for p in skip):
            continue
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sccache_stats(env: dict) -> Optional[dict]:
    exe = tool("sccache")
    if not exe:
        return None
    proc = subprocess.run([exe, "--show-stats", "--stats-format=json"], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        return None


def pip_wheel_command(checkout: Path, build_dir: Path, dist: Path, defines: dict, isolated: bool) -> list[str]:
    """The pip command of one build: without --no-build-isolation when `isolated`."""
    return [sys.executable, "-m", "pip", "wheel", *([] if isolated else ["--no-build-isolation"]), "--no-deps", "-v",
            "-w", str(dist), f"-Cbuild-dir={build_dir}", "-Cbuild.verbose=true",
            *[f"-Ccmake.define.{k}={v}" for k, v in defines.items()], str(checkout)]


def synthetic_upstream(root: Path) -> dict:
    """The tests' synthetic upstream, made anew under `root`: the defines that build it."""
    sys.path.insert(0, str(common.ROOT / "tests"))
    from support.synthetic_upstream import make_synthetic_upstream

    if root.exists():
        shutil.rmtree(root)
    upstream = make_synthetic_upstream(root / "repos")
    return {"VFA_PIN_FILE": str(upstream.write_pin(root / "pin.json")), "VFA_SOURCE_CACHE": str(root / "cache")}


def run_build(label: str, checkout: Path, build_dir: Path, dist: Path, env: dict, defines: dict,
              log_dir: Path, sample_interval: float, timeout: float, isolated: bool = False) -> dict:
    if build_dir.exists():
        shutil.rmtree(build_dir)
    cmd = pip_wheel_command(checkout, build_dir, dist, defines, isolated)
    log_path = log_dir / f"pip-{label}.log"
    sampler = RssSampler(sample_interval)
    sampler.start()
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = -1
    wall = time.perf_counter() - t0
    sampler.stop()
    wheels = sorted(dist.glob("vendored_flash_attn-*.whl"))
    result = {"label": label, "isolated": isolated, "checkout": str(checkout), "build_dir": str(build_dir),
              "command": cmd,
              "returncode": rc, "wall_s": wall, "log": str(log_path), "wheel": str(wheels[-1]) if wheels else None,
              "rss": sampler.result()}
    if rc != 0:
        result["log_tail"] = log_path.read_text(errors="replace")[-4000:]
    return result


def experiment(args) -> dict:
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    project = args.project.resolve()
    defines = dict(kv.split("=", 1) for kv in args.define)
    if args.synthetic:
        defines.update(synthetic_upstream(work / "synthetic"))
    env = dict(os.environ)
    env.update(dict(kv.split("=", 1) for kv in args.env))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    private = not args.sccache_env
    if private:
        for k in [k for k in env if k.startswith("SCCACHE_")]:
            env.pop(k)
        cache_dir = work / "sccache"
        if cache_dir.exists() and not args.keep_cache:
            shutil.rmtree(cache_dir)
        env.update(SCCACHE_DIR=str(cache_dir), SCCACHE_SERVER_PORT=str(free_port()), SCCACHE_IDLE_TIMEOUT="0",
                   SCCACHE_CACHE_SIZE=args.sccache_size, SCCACHE_ERROR_LOG=str(work / "sccache-server.log"))
    exe = tool("sccache")
    result: dict = {"benchmark": "build", "label": args.label, "machine": common.machine_info(gpu=False),
                    "project": str(project), "work": str(work), "synthetic_upstream": args.synthetic,
                    "isolated_build": args.isolated, "defines": defines,
                    "env_knobs": {k: v for k, v in env.items() if k.startswith(("VFA_", "MAX_JOBS", "NVCC_THREADS",
                                                                                   "TORCH_CUDA_ARCH_LIST",
                                                                                   "FLASH_ATTN_", "CUTLASS_",
                                                                                   "CUDA_HOME", "SCCACHE_"))},
                    "sccache": {"binary": exe, "private_server": private}, "builds": {}}
    try:
        plan = [("cold", "a", False)] + ([] if args.skip_warm else [("warm", "b", False)])
        if args.isolated:
            plan.append(("warm-isolated", "c", True))
        for label, suffix, isolated in plan:
            checkout = checkout_copy(project, work / f"checkout-{suffix}", exclude=(work, args.out))
            if exe:
                subprocess.run([exe, "--zero-stats"], env=env, capture_output=True)
            print(f"[build] {label} build in {checkout} ...", file=sys.stderr, flush=True)
            b = run_build(label, checkout, work / f"build-{suffix}", work / f"dist-{suffix}", env, defines, work,
                          args.sample_interval, args.timeout, isolated)
            stats = sccache_stats(env) if exe else None
            b["analysis"] = analyse_build_dir(Path(b["build_dir"]), stats=stats, cores=args.cores,
                                              memory_gb=args.memory_gb, rss=b["rss"])
            if b.get("wheel"):
                b["analysis"]["module_sizes"] = module_sizes([Path(b["wheel"])]) or b["analysis"]["module_sizes"]
            result["builds"][label] = b
            print(f"[build] {label}: rc {b['returncode']}, {b['wall_s']:.0f} s", file=sys.stderr, flush=True)
            if b["returncode"] != 0:
                print(b.get("log_tail", ""), file=sys.stderr)
                break
    finally:
        if private and exe:
            subprocess.run([exe, "--stop-server"], env=env, capture_output=True)
    result["summary"] = summarise(result["builds"])
    return result


def build_figures(prefix: str, b: dict) -> dict:
    """One build's wall time, ninja span and (with sccache statistics) hits as
    <prefix>_s, <prefix>_ninja_span_s, <prefix>_hit_rate_all / _inner, <prefix>_hits / _misses."""
    analysis = b.get("analysis") or {}
    figures = {f"{prefix}_s": b["wall_s"], f"{prefix}_ninja_span_s": (analysis.get("ninja") or {}).get("span_s")}
    sc = analysis.get("sccache")
    if sc:
        figures.update({f"{prefix}_hit_rate_all": sc["all"]["rate"], f"{prefix}_hit_rate_inner": sc["inner"]["rate"],
                        f"{prefix}_hits": sc["all"]["hits"], f"{prefix}_misses": sc["all"]["misses"]})
    return figures


def summarise(builds: dict) -> dict:
    """Warm/cold ratio, hit rates and the bars (pure function of the per-build analyses)."""
    cold, warm, isolated = builds.get("cold"), builds.get("warm"), builds.get("warm-isolated")
    s: dict = {}
    if cold:
        s.update(build_figures("cold", cold))
        s["jobs"] = (cold.get("analysis") or {}).get("jobs")
    if warm:
        s.update(build_figures("warm", warm))
    if isolated:
        s.update(build_figures("warm_isolated", isolated))
        if warm and warm["wall_s"]:
            s["isolated_over_warm"] = isolated["wall_s"] / warm["wall_s"]
    bars = []
    if cold and warm and cold["wall_s"]:
        ratio = warm["wall_s"] / cold["wall_s"]
        s["warm_over_cold"] = ratio
        bars.append({"bar": "warm rebuild (other checkout path) <= 5% of cold", "value": ratio, "threshold": 0.05,
                     "verdict": common.bar_verdict(ratio, 0.05, higher_is_better=False)})
    if "warm_hit_rate_all" in s:
        bars.append({"bar": ">= 95% cache hits on the warm rebuild (all sccache rows)", "value": s["warm_hit_rate_all"],
                     "threshold": 0.95, "verdict": common.bar_verdict(s["warm_hit_rate_all"], 0.95)})
    s["bars"] = bars
    return s


# --------------------------------------------------------------------------------------
# Output


def print_analysis(name: str, a: dict, plain: bool = False) -> None:
    ninja = a.get("ninja")
    if ninja:
        rows = [[cls, "", v["count"], common.fmt(v["mean_s"], 1), common.fmt(v["min_s"], 1),
                 common.fmt(v["max_s"], 1), common.fmt(v["sum_s"], 0)]
                for cls, v in sorted(ninja["classes"].items())]
        notes = [f"ninja span {ninja['span_s']:.0f} s; jobs {a.get('jobs')} ({a.get('jobs_reason')}); "
                 f"nvcc threads {a.get('nvcc_threads')}; preset {a.get('preset')}; FA2 gencode {a.get('fa2_gencode')}"]
        if a.get("module_sizes"):
            notes.append("modules: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in a["module_sizes"].items()))
        common.print_table(f"{name}: compile time per unit class (s)",
                           ["class", "", "units", "mean", "min", "max", "sum"], rows, notes, plain=plain)
    rss = a.get("rss")
    if rss and rss.get("units"):
        rows = [[k[:60], "", common.fmt(v["peak_single_mb"] / 1024, 2), common.fmt(v["peak_tree_mb"] / 1024, 2)]
                for k, v in list(rss["units"].items())[:20]]
        common.print_table(f"{name}: peak RSS per unit (GB, sampled every {rss['interval_s']} s)",
                           ["unit", "", "largest process", "all its processes"], rows,
                           [f"peak RSS of all compiles together {rss['peak_total_mb'] / 1024:.1f} GB, "
                            f"up to {rss['peak_concurrent_units']} units at once"], plain=plain)
    sc = a.get("sccache")
    if sc:
        rows = [[lang, "", r["hits"], r["misses"], common.fmt(None if r["rate"] is None else 100 * r["rate"], 1)]
                for lang, r in sc["rows"].items()]
        for key, label in (("all", "ALL rows"), ("inner", "inner (device code, PTX, CUBIN)")):
            r = sc[key]
            rows.append([label, "", r["hits"], r["misses"], common.fmt(None if r["rate"] is None else 100 * r["rate"], 1)])
        common.print_table(f"{name}: sccache", ["row", "", "hits", "misses", "hit %"], rows, plain=plain)


def print_results(result: dict, plain: bool = False) -> None:
    if result.get("mode") == "analyse":
        for a in result["analyses"]:
            print_analysis(a["build_dir"], a, plain)
        last = result["analyses"][-1] if result["analyses"] else None
    else:
        for label, b in result["builds"].items():
            print_analysis(f"{label} build", b["analysis"], plain)
        last = (result["builds"].get("cold") or {}).get("analysis")
    if last and last.get("projection"):
        p = last["projection"]
        rows = [[f"{r['workers']} jobs", "", common.fmt(r["lpt_s"] / 60, 1), common.fmt(r["lower_bound_s"] / 60, 1),
                 common.fmt(r["homogeneous_s"] / 60, 1), r["units"]] for r in p["rows"]]
        notes = ["class costs (s): " + ", ".join(f"{k} {v:.0f}" for k, v in p["class_costs_s"].items())
                 + f"; link {p['link_s']:.0f} s; full preset {p['full_preset_core_hours']:.1f} core-hours"]
        if p.get("self_check"):
            sc = p["self_check"]
            notes.append(f"model check on this build: predicted {sc['predicted_span_s']:.0f} s on {sc['jobs']} jobs, "
                         f"measured {sc['measured_span_s']:.0f} s ({100 * (sc['error'] or 0):+.0f}%)")
        if p.get("peak_unit_rss_gb"):
            notes.append(f"peak RSS per unit {p['peak_unit_rss_gb']:.1f} GB"
                         + (f": {p['max_jobs_by_memory']} jobs fit in {p['memory_gb']} GB" if p.get("max_jobs_by_memory") else ""))
        if any(r["missing_classes"] for r in p["rows"]):
            notes.append(f"classes with no measured cost (left out): {p['rows'][0]['missing_classes']}")
        common.print_table("Projected full-preset build time (minutes)",
                           ["N", "", "LPT", "lower bound", "homogeneous", "units"], rows, notes, plain=plain)
    s = result.get("summary")
    if s:
        rows = [build_row(BUILD_TITLES.get(label, label), b) for label, b in result.get("builds", {}).items()]
        notes = [f"jobs chosen by the build: {s.get('jobs')}",
                 f"warm hit rate: all rows {common.fmt(_pct(s.get('warm_hit_rate_all')), 1)}%, inner rows "
                 f"{common.fmt(_pct(s.get('warm_hit_rate_inner')), 1)}% ({s.get('warm_hits')} hits, "
                 f"{s.get('warm_misses')} misses)"]
        if "warm_isolated_s" in s:
            notes.append(f"isolated warm build: {common.fmt(s['warm_isolated_s'], 0)} s, "
                         f"{common.fmt(s.get('isolated_over_warm'), 1)}x the non-isolated one; "
                         f"{s.get('warm_isolated_hits')} hits, {s.get('warm_isolated_misses')} misses")
        notes += [f"BAR {b['verdict']}: {b['bar']}: measured {b['value']:.3f}" for b in s.get("bars", [])]
        common.print_table("Build: cold vs warm (seconds)",
                           ["build", "", "isolation", "wall", "ninja span", "sccache hits / misses"],
                           rows, notes, plain=plain)


BUILD_TITLES = {"cold": "cold build", "warm": "warm build (other checkout + build dir)",
                "warm-isolated": "warm build, isolated (third checkout + build dir)"}


def build_row(title: str, b: dict) -> list:
    """One row of the cold/warm table: wall, ninja span, and the build's sccache hits."""
    analysis = b.get("analysis") or {}
    sc = (analysis.get("sccache") or {}).get("all")
    hits = f"{sc['hits']} / {sc['misses']}" if sc else "-"
    return [title, "", "isolated" if b.get("isolated") else "--no-build-isolation", common.fmt(b.get("wall_s"), 0),
            common.fmt((analysis.get("ninja") or {}).get("span_s"), 0), hits]


def _pct(x):
    return None if x is None else 100 * x


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--analyse", "--analyze", nargs="+", type=Path, metavar="BUILD_DIR",
                   help="analyse existing build dir(s) instead of building")
    p.add_argument("--sccache-stats", type=Path, help="(analyse) a saved `sccache --show-stats --stats-format=json`")
    p.add_argument("--live-stats", action="store_true", help="(analyse) ask the running sccache server")
    p.add_argument("--time-log", type=Path, help="(analyse) a VFA_TIME_LOG written by timed_compile.sh")
    p.add_argument("--project", type=Path, default=common.ROOT, help="project to build (default: this checkout)")
    p.add_argument("--work", type=Path, default=Path("/tmp/vfa-bench-build"),
                   help="work folder: checkouts, build dirs, wheels, private sccache cache, logs "
                        "(default /tmp/vfa-bench-build; a few GB for the minimal preset)")
    p.add_argument("--define", action="append", default=[], metavar="K=V",
                   help="CMake define for both builds (-C cmake.define.K=V); default VFA_PRESET=minimal")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="environment variable for both builds")
    p.add_argument("--label", default="", help="tag for the output file (build-LABEL.json)")
    p.add_argument("--skip-warm", action="store_true", help="cold build only")
    p.add_argument("--synthetic", action="store_true",
                   help="build the tests' synthetic upstream (made under WORK/synthetic) instead of the pinned one")
    p.add_argument("--isolated", action="store_true",
                   help="add a third build, warm like B but with pip's default build isolation (needs the build "
                        "requirements, torch included, from the package index or pip's cache)")
    p.add_argument("--sccache-env", action="store_true",
                   help="use the environment's sccache settings (e.g. Redis) instead of a private empty cache")
    p.add_argument("--keep-cache", action="store_true", help="do not empty the private cache first")
    p.add_argument("--sccache-size", default="50G")
    p.add_argument("--cores", nargs="+", type=int, default=[2, 8, 16, 32, 64, 128],
                   help="job counts to project the full preset for")
    p.add_argument("--memory-gb", type=float, default=None, help="memory of the projected machine (job cap)")
    p.add_argument("--sample-interval", type=float, default=0.25, help="/proc sampling period, s")
    p.add_argument("--timeout", type=float, default=3 * 3600, help="seconds per build")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for build.json")
    p.add_argument("--plain", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    name = f"build-{args.label}.json" if args.label else "build.json"
    if args.analyse:
        stats = None
        if args.sccache_stats:
            stats = json.loads(args.sccache_stats.read_text())
        elif args.live_stats:
            stats = sccache_stats(dict(os.environ))
        result = {"benchmark": "build", "mode": "analyse", "machine": common.machine_info(gpu=False),
                  "analyses": [analyse_build_dir(d, stats=stats, time_log=args.time_log, cores=args.cores,
                                                 memory_gb=args.memory_gb) for d in args.analyse]}
    else:
        if not any(d.startswith("VFA_PRESET=") for d in args.define):
            args.define.append("VFA_PRESET=minimal")
        result = experiment(args)
        result["mode"] = "experiment"
    path = common.write_json(args.out / name, result)
    print(f"[build] wrote {path}", file=sys.stderr)
    print_results(result, plain=args.plain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
