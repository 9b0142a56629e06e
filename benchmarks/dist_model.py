"""A model of a cold build against the number of sccache-dist build servers.

    python benchmarks/dist_model.py --ninja-log LOCAL.ninja_log [--dist-ninja-log DIST.ninja_log] \\
        --client-cores 32 --client-memory-gb 256 --server 32x256 [--preset full] [--out model.json]

Per-unit compile times come from a ninja log (`.ninja_log` of a cold, uncached local
build: wall time per unit, at the parallelism it ran with) and are averaged per kind:
FA3 instantiation, other FA3 CUDA (combine, scheduler), FA2 CUDA, C++. The client-side
cost of a remote unit (preprocessing, cudafe++, transfers) is the mean extra time of the
same units in a distributed build's ninja log (--dist-ninja-log), or --client-overhead-s.

The build is simulated as greedy list scheduling, longest units first: the client runs
min(cores, memory / unit memory) units itself, each build server min(cores, memory /
unit memory) more (what dist-compile/cluster.py gives it as slots), a remote unit costs
its compile time plus the client overhead, and the client's own cores bound the
overheads (at most one client-side step per client core: sccache's job limit). Units
per kind for `full`: 190 FA3 instantiations + combine + scheduler + 2 C++ and 76 FA2
CUDA + 3 C++ (docs/PERFORMANCE.md). It prints a table and writes JSON.

Slices of `full` (benchmarks/full_slices.json, docs/full-preset-slices.md):

    python benchmarks/dist_model.py --slices [--client-cores 16 --client-memory-gb 125]
    python benchmarks/dist_model.py --slice-defines NAME       (the slice's -C defines, one a line)
    python benchmarks/dist_model.py --record-unit-times NINJA_LOG --run "what, where, when"
    python benchmarks/dist_model.py --slice-forbid-skips BUILD_INFO_JSON   (check_gpu_junit.py's --forbid-skip
                                                                          arguments for a slice's wheel)

The whole `full` build from the measured units (docs/PERFORMANCE.md, docs/full-preset-slices.md):

    python benchmarks/dist_model.py --full-build [--out full_build.json]

models a cold `full` build on a 16-core / 125 GB and a 32-core / 251 GB machine, alone and
with build servers (--server, --servers, --client-overhead-s): each of its 273 units costs
its measured time where benchmarks/unit_times_h200.json has one (instantiations under
"units", the module units every build compiles under "module_units"), else the mean of
the measured units of its kind, and the table says how many units are measured and lists
the ones that are not (modelled).

--slices models each slice's cold build on one machine (no build servers): its units come
from the build's own selection rule (cmake/kernel_units.cmake), each unit costs its
measured time (benchmarks/unit_times_h200.json, filled by --record-unit-times from the
ninja log of a cold build on the 16-core H200 machine) or, where none was measured, the
mean of its kind (--unit-s, else the mean of the measured units of that kind, else
KIND_S_16_CORE), plus the build's steps outside ninja (--fixed-s: pip, configure, wheel).
"""

from __future__ import annotations

# Why this file names families ("fa2"/"fa3" modules and unit kinds): its inputs are measured
# per-unit compile times of the two compiled families' real units (FA3's instantiations, FA2's
# forward files, each module's fixed .cpp units), and its kinds are keys of those measurements.

import argparse
import heapq
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SLICES_FILE = HERE / "full_slices.json"
UNIT_TIMES_FILE = HERE / "unit_times_h200.json"

PRESETS = {  # units per kind
    "full": {"fa3_inst": 190, "fa3_other": 2, "fa2_cuda": 76, "cxx": 5},
    "minimal": {"fa3_inst": 8, "fa3_other": 2, "fa2_cuda": 8, "cxx": 5},
}
UNIT_MEMORY_GB = {"fa3_inst": 8.0, "fa3_other": 8.0, "fa2_cuda": 4.5, "cxx": 1.0}
# Per-kind means of a cold build on the 16-core H200 machine, for units with no time of
# their own: the `minimal` preset, 2026-11-29 (docs/PERFORMANCE.md, "Per translation
# unit, minimal build"): FA3 instantiations mean 153 s, combine 89 s + scheduler 18 s,
# FA2 instantiations (sm_90 SASS) mean 189 s, .cpp 2-5 s.
KIND_S_16_CORE = {"fa3_inst": 153.0, "fa3_other": 53.5, "fa2_cuda": 189.0, "cxx": 3.5}
# What every build of a module compiles beside its selected instantiations
# (each compiled family's build.sources in cmake/knobs.json): name -> kind.
MODULE_UNITS = {
    "fa3": {"flash_fwd_combine.cu": "fa3_other", "flash_prepare_scheduler.cu": "fa3_other",
            "flash_api.cpp (fa3)": "cxx", "flash_api_torch_lib.cpp (fa3)": "cxx"},
    "fa2": {"flash_api.cpp (fa2)": "cxx", "flash_api_sparse.cpp": "cxx", "flash_api_torch_lib.cpp (fa2)": "cxx"},
}
FA2_STUBS = "fa2_missing_kernels.cpp"
# Seconds of a cold build outside ninja's span (pip, configure with its probe compiles,
# the wheel): build wall - ninja span, measured on the 16-core H200 machine 2026-12-01:
# 8.2 s (slice fa3-hd96-fa2-hd96-192: 699.3 - 691.1) and 4.8 s (slice fa2-hd32-64).
FIXED_S = 8.2
# Client-side seconds per remote unit (preprocessing, cudafe++, transfers): measured on the
# H200 x2 host 2026-11-30 against the same units compiled locally (docs/PERFORMANCE.md,
# "Build on a cluster": FA3 +12.8 s, FA2 +31.1 s, C++ +0.4 s; 18 s the mean per unit).
CLIENT_OVERHEAD_S = 18.0
# The machines the full-build table models: (cores, memory GB) of the 16-core H200 machine
# and the 32-core x2 host (docs/PERFORMANCE.md).
FULL_BUILD_MACHINES = ((16, 125.0), (32, 251.0))


def kind_of(output: str) -> str | None:
    name = output.rsplit("/", 1)[-1]
    if output.endswith((".cpp.o", ".cc.o")):
        return "cxx"
    if not output.endswith(".cu.o"):
        return None
    if "instantiations" in output or (name.startswith("flash_fwd_") and "_sm90" in name):
        return "fa3_inst"
    if "fa3" in output or "hopper" in output:
        return "fa3_other"
    return "fa2_cuda"


def unit_times(ninja_log: Path) -> dict[str, list[float]]:
    """{output: seconds} from a ninja log (v5/v6/v7: start end mtime output hash), last entry per output."""
    last: dict[str, float] = {}
    for line in ninja_log.read_text().splitlines():
        if line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) >= 4:
            last[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000
    return last


def unit_name(output: str) -> str:
    """The source file name of a ninja output (".../flash_fwd_hdim96_bf16_sm90.cu.o" -> "...cu")."""
    name = output.rsplit("/", 1)[-1]
    return name[:-2] if name.endswith(".o") else name


def name_kind(module: str, name: str) -> str:
    if name.endswith(".cu"):
        return "fa3_inst" if module == "fa3" else "fa2_cuda"
    return "cxx"


def cmake_tool() -> str:
    local = Path(sys.executable).parent / "cmake"
    return str(local) if local.exists() else (shutil.which("cmake") or "cmake")


def load_slices(path: Path = SLICES_FILE) -> dict[str, dict]:
    return json.loads(path.read_text())["slices"]


def slice_knobs(spec: dict) -> dict[str, str]:
    """A slice's build knobs: the `full` preset narrowed by the slice's own."""
    return {"VFA_PRESET": "full", **spec["knobs"]}


def slice_defines(spec: dict) -> list[str]:
    return [f"-Ccmake.define.{k}={v}" for k, v in slice_knobs(spec).items()]


def kernel_units(knobs: dict[str, str]) -> list[tuple[str, str]]:
    """(module, file name) of each instantiation the build compiles for these knobs, from
    the build's own rule (cmake/kernel_units.cmake); no VFA_* from this environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VFA_", "MAX_JOBS", "TORCH_CUDA_ARCH_LIST"))}
    cmd = [cmake_tool(), *[f"-D{k}={v}" for k, v in knobs.items()], "-P", str(HERE.parent / "cmake/kernel_units.cmake")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return [tuple(line.split(" ", 1)) for line in proc.stdout.splitlines() if line.strip()]


def build_units(knobs: dict[str, str], all_fa2: set[str]) -> list[tuple[str, str, str]]:
    """(module, name, kind) of every compile of a build: its instantiations and the units
    each module built always compiles (FA2 adds its stubs unless every kernel is in)."""
    units = [(m, n, name_kind(m, n)) for m, n in kernel_units(knobs)]
    fa2_selected = {n for m, n, _ in units if m == "fa2"}
    for module in ("fa3", "fa2"):
        if str(knobs.get(f"VFA_BUILD_{module.upper()}", "auto")).lower() in ("off", "0", "false", "no"):
            continue
        units += [(module, n, k) for n, k in MODULE_UNITS[module].items()]
        if module == "fa2" and fa2_selected != all_fa2:
            units.append(("fa2", FA2_STUBS, "cxx"))
    return units


def load_unit_times(path: Path = UNIT_TIMES_FILE) -> dict[str, dict]:
    return json.loads(path.read_text())["units"] if path.is_file() else {}


def load_module_unit_times(path: Path = UNIT_TIMES_FILE) -> dict[str, dict]:
    """Measured times of the units every build of a module compiles (MODULE_UNITS names)."""
    return json.loads(path.read_text()).get("module_units", {}) if path.is_file() else {}


def module_unit_key(output: str) -> str | None:
    """The MODULE_UNITS (or FA2_STUBS) name of a ninja output, None for other outputs."""
    module = "fa3" if "_vendored_fa3_C.dir" in output else "fa2" if "_vendored_fa2_C.dir" in output else None
    if module is None or kind_of(output) in (None, "fa3_inst") or "instantiations" in output:
        return None
    name = unit_name(output)
    if module == "fa2" and name.startswith("fa2_missing_kernels"):
        return FA2_STUBS
    for key in (name, f"{name} ({module})"):
        if key in MODULE_UNITS[module]:
            return key
    return None


def record_unit_times(ninja_log: Path, run: str, path: Path = UNIT_TIMES_FILE) -> dict[str, dict]:
    """Merge the instantiations' times of a cold build's ninja log into the per-unit table."""
    data = json.loads(path.read_text()) if path.is_file() else {
        "about": "Per-unit cold compile seconds of kernel instantiations on the 16-core H200 "
                 "machine (nvidia-h200: 16 cores, 128 GiB), from a slice build's .ninja_log "
                 "(tests/gpu/slice_h200.sh; benchmarks/dist_model.py --record-unit-times).",
        "units": {}}
    added, modules = {}, {}
    for output, seconds in unit_times(ninja_log).items():
        key = module_unit_key(output)
        if key is not None:
            modules[key] = {"s": round(seconds, 1), "run": run}
        elif kind_of(output) in ("fa3_inst", "fa2_cuda"):
            added[unit_name(output)] = {"s": round(seconds, 1), "run": run}
    data["units"].update(added)
    data["units"] = dict(sorted(data["units"].items()))
    if modules:
        data["module_units"] = dict(sorted({**data.get("module_units", {}), **modules}.items()))
    path.write_text(json.dumps(data, indent=1) + "\n")
    return added


def measured_kind_means(measured: dict[str, dict], fallback: dict[str, float]) -> dict[str, float]:
    """Per-kind cost of a unit with no time of its own: the mean of the measured units of its
    kind where there are some, else the fallback's."""
    kinds: dict[str, list[float]] = {}
    for name, entry in measured.items():
        kinds.setdefault(name_kind("fa3" if name.endswith("_sm90.cu") else "fa2", name), []).append(entry["s"])
    return {k: round(statistics.mean(kinds[k]), 1) if kinds.get(k) else v for k, v in fallback.items()}


def model_slices(slices: dict[str, dict], measured: dict[str, dict], kind_s: dict[str, float], cores: int,
                 memory_gb: float, fixed_s: float) -> list[dict]:
    """Each slice's cold build on one machine: its units longest first over the job slots."""
    all_fa2 = {n for m, n in kernel_units({"VFA_PRESET": "full", "VFA_BUILD_FA3": "OFF"}) if m == "fa2"}
    rows = []
    for name, spec in slices.items():
        units = build_units(slice_knobs(spec), all_fa2)
        costs = [(kind, measured[n]["s"] if n in measured else kind_s[kind]) for _m, n, kind in units]
        slots = slots_of(cores, memory_gb, max(UNIT_MEMORY_GB[k] for _m, _n, k in units))
        seconds = simulate(costs, slots, [], 0.0, cores) + fixed_s
        inst = [n for _m, n, k in units if k in ("fa3_inst", "fa2_cuda")]
        rows.append({"slice": name, "fa3_inst": sum(k == "fa3_inst" for *_, k in units),
                     "fa2_inst": sum(k == "fa2_cuda" for *_, k in units), "units": len(units), "jobs": slots,
                     "measured_units": sum(n in measured for n in inst), "minutes": round(seconds / 60, 1),
                     "done": spec.get("done"), "instantiations": inst})
    return rows


def model_full_build(measured: dict[str, dict], module_measured: dict[str, dict], machines, servers: list[int],
                     server: tuple[int, float], overhead_s: float, fixed_s: float) -> dict:
    """A cold `full` build from measured units: per machine and number of build servers,
    the modelled minutes; which units have a measured time and which are modelled."""
    full = {"VFA_PRESET": "full"}
    all_fa2 = {n for m, n in kernel_units({**full, "VFA_BUILD_FA3": "OFF"}) if m == "fa2"}
    units = build_units(full, all_fa2)
    inst_means = {k: v for k, v in measured_kind_means(measured, {"fa3_inst": None, "fa2_cuda": None}).items()
                  if v is not None}
    module_kinds: dict[str, list[float]] = {}
    for name, entry in module_measured.items():
        kind = {**MODULE_UNITS["fa3"], **MODULE_UNITS["fa2"], FA2_STUBS: "cxx"}[name]
        module_kinds.setdefault(kind, []).append(entry["s"])
    kind_s = {**{k: round(statistics.mean(v), 1) for k, v in module_kinds.items()}, **inst_means}
    costs, modelled = [], []
    for module, name, kind in units:
        entry = measured.get(name) if kind in ("fa3_inst", "fa2_cuda") else module_measured.get(name)
        if entry is not None:
            costs.append((kind, entry["s"]))
            continue
        if kind not in kind_s:
            raise ValueError(f"no measured unit of kind {kind} to model {name} ({module}) with")
        costs.append((kind, kind_s[kind]))
        modelled.append({"module": module, "unit": name, "kind": kind, "s": kind_s[kind]})
    heaviest = max(UNIT_MEMORY_GB[k] for k, _ in costs)
    per_server = slots_of(server[0], server[1], heaviest)
    rows = []
    for cores, memory in machines:
        local = slots_of(cores, memory, heaviest)
        for n in servers:
            seconds = simulate(costs, local, [per_server] * n, overhead_s, cores) + fixed_s
            rows.append({"cores": cores, "memory_gb": memory, "servers": n, "slots": local + n * per_server,
                         "minutes": round(seconds / 60, 1)})
    runs = sorted({e["run"] for e in [*measured.values(), *module_measured.values()]})
    return {"units": len(units), "measured_units": len(units) - len(modelled), "modelled_units": modelled,
            "kind_s_for_modelled": kind_s, "fixed_s": fixed_s, "client_overhead_s": overhead_s,
            "server": {"cores": server[0], "memory_gb": server[1], "slots": per_server}, "runs": runs,
            "rows": rows}


def modelled_groups(modelled: list[dict]) -> dict[str, int]:
    """Modelled units counted by module and head dim (pair): "FA3 hdim64_512": 20, ..."""
    import re

    groups: dict[str, int] = {}
    for unit in modelled:
        match = re.search(r"hdim(\d+(?:_\d+)?)", unit["unit"])
        label = f"{unit['module'].upper()} " + (f"hdim{match[1]}" if match else unit["unit"])
        groups[label] = groups.get(label, 0) + 1
    return dict(sorted(groups.items()))


def forbid_skips(build_info: dict) -> list[str]:
    """check_gpu_junit.py's arguments for a wheel: the FA versions its build info says are
    built must run (a skip "FAn not usable" fails the step); one a slice leaves out is
    skipped with the build info's reason ("this wheel was built without FAn")."""
    # The families come from their declaration (cmake/knobs.json, read by the package's own
    # registry): those recorded in build_info.json. FA4's record is a file of its own and its
    # tests need dependencies a slice's machine may lack; fa4_h200.sh forbids its skips itself.
    sys.path.insert(0, str(HERE.parent / "python"))
    from vendored_flash_attn.declaration import families

    args = []
    for family in families.registry():
        if family.record_key and (build_info.get(family.record_key) or {}).get("built"):
            args += ["--forbid-skip", f"{family.title} not usable"]
    return args


def per_kind(times: dict[str, float]) -> dict[str, float]:
    kinds: dict[str, list[float]] = {}
    for output, seconds in times.items():
        kind = kind_of(output)
        if kind:
            kinds.setdefault(kind, []).append(seconds)
    return {k: statistics.mean(v) for k, v in kinds.items()}


def simulate(units: list[tuple[str, float]], local_slots: int, server_slots: list[int], overhead_s: float,
             client_cores: int) -> float:
    slots = [(0.0, False)] * max(local_slots, 0) + [(0.0, True)] * sum(server_slots)
    if not slots:
        raise ValueError("no slot to run a unit in")
    heap = [(t, i, remote) for i, (t, remote) in enumerate(slots)]
    heapq.heapify(heap)
    remote_units = 0
    for _kind, seconds in sorted(units, key=lambda u: -u[1]):
        free, i, remote = heapq.heappop(heap)
        cost = seconds + (overhead_s if remote else 0.0)
        remote_units += remote
        heapq.heappush(heap, (free + cost, i, remote))
    makespan = max(t for t, _, _ in heap)
    client_bound = remote_units * overhead_s / max(client_cores, 1)
    return max(makespan, client_bound)


def parse_server(spec: str) -> tuple[int, float]:
    cores, memory = spec.lower().split("x")
    return int(cores), float(memory)


def slots_of(cores: int, memory_gb: float, unit_gb: float) -> int:
    return max(1, min(cores, int(memory_gb // unit_gb)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ninja-log", type=Path, help="ninja log of a cold local build (per-unit times)")
    p.add_argument("--unit-s", action="append", default=[], metavar="KIND=SECONDS",
                   help="per-unit time of a kind (fa3_inst, fa3_other, fa2_cuda, cxx) instead of/over the log")
    p.add_argument("--dist-ninja-log", type=Path, help="ninja log of the same build through sccache-dist")
    p.add_argument("--client-overhead-s", type=float, help="client-side seconds per remote unit")
    p.add_argument("--client-cores", type=int)
    p.add_argument("--client-memory-gb", type=float)
    p.add_argument("--server", default="32x256", help="one build server: CORESxMEMORY_GB")
    p.add_argument("--servers", default="0,1,2,4,8,16", help="numbers of build servers to model")
    p.add_argument("--preset", choices=sorted(PRESETS), default="full")
    p.add_argument("--out", type=Path)
    p.add_argument("--slices", action="store_true", help="model each slice of `full` (full_slices.json)")
    p.add_argument("--fixed-s", type=float, default=FIXED_S, help="(--slices) seconds outside the compiles")
    p.add_argument("--slice-defines", metavar="NAME", help="print a slice's -C defines, one a line")
    p.add_argument("--record-unit-times", type=Path, metavar="NINJA_LOG",
                   help=f"merge a cold build's per-unit times into {UNIT_TIMES_FILE.name}")
    p.add_argument("--run", help="(--record-unit-times) what, where and when that build ran")
    p.add_argument("--slice-forbid-skips", type=Path, metavar="BUILD_INFO_JSON",
                   help="print check_gpu_junit.py's --forbid-skip arguments for the FA versions built")
    p.add_argument("--full-build", action="store_true",
                   help="model the cold `full` build from the measured units (16 and 32 cores, build servers)")
    args = p.parse_args(argv)

    if args.slice_forbid_skips:
        print("\n".join(forbid_skips(json.loads(args.slice_forbid_skips.read_text()))))
        return 0
    if args.full_build:
        overhead = CLIENT_OVERHEAD_S if args.client_overhead_s is None else args.client_overhead_s
        machines = ([(args.client_cores, args.client_memory_gb or 125.0)] if args.client_cores
                    else list(FULL_BUILD_MACHINES))
        result = model_full_build(load_unit_times(), load_module_unit_times(), machines,
                                  [int(x) for x in args.servers.split(",")], parse_server(args.server), overhead,
                                  args.fixed_s)
        modelled = result["modelled_units"]
        print(f"cold `full` build, {result['units']} units: {result['measured_units']} with a measured time "
              f"({UNIT_TIMES_FILE.name}), {len(modelled)} modelled as the mean of the measured units of their kind "
              f"({', '.join(f'{k} {v:g} s' for k, v in result['kind_s_for_modelled'].items())}); "
              f"+ {args.fixed_s:g} s outside the compiles; a remote unit + {overhead:g} s on the client; "
              f"each server {result['server']['cores']} cores / {result['server']['memory_gb']:g} GB "
              f"({result['server']['slots']} slots)")
        if modelled:
            print("modelled (not measured yet): " + ", ".join(f"{k} {n}" for k, n in
                                                              modelled_groups(modelled).items()))
        machines_seen = list(dict.fromkeys((r["cores"], r["memory_gb"]) for r in result["rows"]))
        print("| build servers | " + " | ".join(f"{c} cores / {m:g} GB (min)" for c, m in machines_seen) + " |")
        print("|---|" + "---|" * len(machines_seen))
        for n in dict.fromkeys(r["servers"] for r in result["rows"]):
            cells = [next(r for r in result["rows"] if r["servers"] == n and (r["cores"], r["memory_gb"]) == m)
                     for m in machines_seen]
            print(f"| {n} | " + " | ".join(f"{c['minutes']} ({c['slots']} slots)" for c in cells) + " |")
        if args.out:
            args.out.write_text(json.dumps(result, indent=1) + "\n")
        return 0

    if args.slice_defines:
        slices = load_slices()
        if args.slice_defines not in slices:
            p.error(f"no slice {args.slice_defines!r} in {SLICES_FILE.name}; slices: {', '.join(slices)}")
        print("\n".join(slice_defines(slices[args.slice_defines])))
        return 0
    if args.record_unit_times:
        if not args.run:
            p.error("--record-unit-times needs --run (what, where and when the build ran)")
        added = record_unit_times(args.record_unit_times, args.run)
        print(f"{len(added)} unit times recorded in {UNIT_TIMES_FILE}")
        return 0
    if args.slices:
        measured = load_unit_times()
        kind_s = measured_kind_means(measured, KIND_S_16_CORE)
        for item in args.unit_s:
            kind, seconds = item.split("=")
            kind_s[kind] = float(seconds)
        cores, memory = args.client_cores or 16, args.client_memory_gb or 125.0
        rows = model_slices(load_slices(), measured, kind_s, cores, memory, args.fixed_s)
        print(f"cold build of each slice of `full` on one {cores}-core / {memory:g} GB machine; units without a "
              f"measured time cost their kind's mean ({', '.join(f'{k} {v:g} s' for k, v in kind_s.items())}); "
              f"+ {args.fixed_s:g} s outside the compiles")
        print("| slice | FA3 inst. | FA2 inst. | compiles | jobs | inst. with measured times | cold build (min) |"
              " done |\n|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['slice']} | {r['fa3_inst']} | {r['fa2_inst']} | {r['units']} | {r['jobs']} | "
                  f"{r['measured_units']} / {r['fa3_inst'] + r['fa2_inst']} | {r['minutes']} | {r['done'] or ''} |")
        if args.out:
            args.out.write_text(json.dumps({"cores": cores, "memory_gb": memory, "kind_s": kind_s,
                                            "fixed_s": args.fixed_s, "slices": rows}, indent=1) + "\n")
        return 0
    if args.client_cores is None or args.client_memory_gb is None:
        p.error("--client-cores and --client-memory-gb are required")

    times = per_kind(unit_times(args.ninja_log)) if args.ninja_log else {}
    for item in args.unit_s:
        kind, seconds = item.split("=")
        times[kind] = float(seconds)
    counts = PRESETS[args.preset]
    missing = [k for k in counts if k not in times]
    if missing:
        p.error(f"no per-unit time for {', '.join(missing)}: give --ninja-log or --unit-s KIND=SECONDS")
    overhead = args.client_overhead_s
    if overhead is None and args.dist_ninja_log and args.ninja_log:
        local, dist = unit_times(args.ninja_log), unit_times(args.dist_ninja_log)
        extra = [dist[o] - local[o] for o in dist if o in local and kind_of(o) in ("fa3_inst", "fa2_cuda")]
        overhead = max(statistics.mean(extra), 0.0) if extra else None
    if overhead is None:
        p.error("no client overhead: give --dist-ninja-log with --ninja-log, or --client-overhead-s")

    units = [(kind, times[kind]) for kind, n in counts.items() for _ in range(n)]
    heaviest = max(UNIT_MEMORY_GB[k] for k in counts)
    local_slots = slots_of(args.client_cores, args.client_memory_gb, heaviest)
    cores, memory = parse_server(args.server)
    per_server = slots_of(cores, memory, heaviest)
    rows = []
    for n in [int(x) for x in args.servers.split(",")]:
        seconds = simulate(units, local_slots, [per_server] * n, overhead, args.client_cores)
        rows.append({"servers": n, "slots": local_slots + n * per_server, "minutes": round(seconds / 60, 1)})
    result = {"preset": args.preset, "units": counts, "unit_s": {k: round(v, 1) for k, v in times.items()},
              "client_overhead_s": round(overhead, 1), "client": {"cores": args.client_cores,
              "memory_gb": args.client_memory_gb, "slots": local_slots},
              "server": {"cores": cores, "memory_gb": memory, "slots": per_server}, "rows": rows}
    print(f"cold `{args.preset}` build, {sum(counts.values())} units; per unit (s): "
          + ", ".join(f"{k} {v:.0f}" for k, v in result["unit_s"].items())
          + f"; client overhead per remote unit {overhead:.1f} s")
    print(f"client {args.client_cores} cores / {args.client_memory_gb:g} GB ({local_slots} slots); "
          f"each server {cores} cores / {memory:g} GB ({per_server} slots)")
    print("| build servers | slots | cold build (min) |\n|---|---|---|")
    for row in rows:
        print(f"| {row['servers']} | {row['slots']} | {row['minutes']} |")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
