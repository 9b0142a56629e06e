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
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
from pathlib import Path

PRESETS = {  # units per kind
    "full": {"fa3_inst": 190, "fa3_other": 2, "fa2_cuda": 76, "cxx": 5},
    "minimal": {"fa3_inst": 8, "fa3_other": 2, "fa2_cuda": 8, "cxx": 5},
}
UNIT_MEMORY_GB = {"fa3_inst": 8.0, "fa3_other": 8.0, "fa2_cuda": 4.5, "cxx": 1.0}


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
    p.add_argument("--client-cores", type=int, required=True)
    p.add_argument("--client-memory-gb", type=float, required=True)
    p.add_argument("--server", default="32x256", help="one build server: CORESxMEMORY_GB")
    p.add_argument("--servers", default="0,1,2,4,8,16", help="numbers of build servers to model")
    p.add_argument("--preset", choices=sorted(PRESETS), default="full")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

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
