"""Summary of tests/gpu/run_dist_h200.sh's results folder: where compiles ran, what the
client-side steps and transfers add per unit, and the second build's cache hits.

    python tests/gpu/dist_summary.py RESULTS_DIR      (prints it; writes RESULTS_DIR/summary.json)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from dist_model import kind_of, unit_times  # noqa: E402


def counts(stats: dict) -> dict:
    s = stats["stats"]
    remote = sum(s.get("dist_compiles", {}).values())
    return {"compilations": s["compilations"], "remote": remote, "local": s["compilations"] - remote,
            "fell_back": s.get("dist_errors", 0), "hits": sum(s["cache_hits"]["counts"].values()),
            "misses": sum(s["cache_misses"]["counts"].values()), "by_step": s["cache_misses"]["adv_counts"]}


def max_in_flight(slot_log: Path) -> int:
    events = sorted((float(t), 1 if kind == "start" else -1)
                    for kind, _slot, t, _pid in (line.split() for line in slot_log.read_text().splitlines()))
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def main(res: Path) -> int:
    load = lambda name: json.loads((res / name).read_text())  # noqa: E731
    summary = {**load("times-dist.json"), **load("times-local.json"),
               "dist_cold": counts(load("sccache-dist-cold.json")), "dist_second": counts(load("sccache-dist-warm.json")),
               "local_cold": counts(load("sccache-local-cold.json"))}
    local, dist = unit_times(res / "ninja-local-cold.log"), unit_times(res / "ninja-dist-cold.log")
    added: dict[str, list[float]] = {}
    for output, seconds in dist.items():
        kind = kind_of(output)
        if kind and output in local:
            added.setdefault(kind, []).append(seconds - local[output])
    summary["added_s_per_unit"] = {k: {"mean": round(statistics.mean(v), 1), "median": round(statistics.median(v), 1),
                                       "units": len(v)} for k, v in added.items()}
    if (res / "slots.log").exists():
        summary["server_max_in_flight"] = max_in_flight(res / "slots.log")
    second = summary["dist_second"]
    # sccache takes every nvcc call apart into cached steps (cudafe++, cicc, ptxas) and
    # counts the outer "cuda [nvcc]" call as a miss even when every step hit: the hit
    # rate is the steps'.
    outer = second["by_step"].get("cuda [nvcc]", 0)
    summary["second_build_hit_rate"] = round(
        second["hits"] / max(second["hits"] + second["misses"] - outer, 1), 3)
    (res / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
