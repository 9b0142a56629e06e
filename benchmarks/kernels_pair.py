#!/usr/bin/env python3
"""Two builds of the package, one kernels benchmark: `benchmarks/kernels.py` run against each,
alternating (A B, then B A, ...) in one invocation on one GPU, and each row's time compared.

    python benchmarks/kernels_pair.py A=DIR_A B=DIR_B --out R [--rounds 2] [--impls fa2 fa3 ...]
        [--slower-pct 1.0] [-- more kernels.py arguments]

DIR is a folder holding an installed `vendored_flash_attn` (`pip install --no-deps --target DIR
WHEEL`); each run gets it first on PYTHONPATH. Made for a build choice that must not change the
kernels' speed (issue 46: units compiled with nvcc --split-compile against the same units
compiled whole): for each (case, row) both builds ran, the median over rounds of each build's
median time, the ratio B/A, and whether B is slower than A by more than --slower-pct. Prints a
table and writes R/kernels-pair.json (each run's kernels.json stays under R/<label>-<round>/).
Exit status 1 when a row is slower beyond the bound or a build has a row the other lacks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def compare(runs_a: list[dict], runs_b: list[dict], slower_pct: float) -> dict:
    """The rows of two builds' kernels.json results (several runs each), compared by median."""
    def medians(runs: list[dict]) -> dict[tuple[str, str], list[float]]:
        found: dict[tuple[str, str], list[float]] = {}
        for run in runs:
            for row in run["rows"]:
                if row.get("status") == "ok" and row.get("median_ms") is not None:
                    found.setdefault((row["case"], row["impl"]), []).append(row["median_ms"])
        return found

    a, b = medians(runs_a), medians(runs_b)
    rows, slower = [], []
    for key in sorted(a.keys() | b.keys()):
        if key not in a or key not in b:
            rows.append({"case": key[0], "impl": key[1], "missing_in": "A" if key not in a else "B"})
            continue
        ma, mb = statistics.median(a[key]), statistics.median(b[key])
        ratio = mb / ma
        row = {"case": key[0], "impl": key[1], "a_ms": ma, "b_ms": mb, "b_over_a": ratio,
               "a_runs": a[key], "b_runs": b[key], "slower": ratio > 1 + slower_pct / 100}
        rows.append(row)
        if row["slower"]:
            slower.append(f"{key[0]}/{key[1]}")
    missing = [f"{r['case']}/{r['impl']} (not in {r['missing_in']})" for r in rows if "missing_in" in r]
    return {"rows": rows, "slower": slower, "missing": missing, "slower_pct": slower_pct,
            "ok": not slower and not missing}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", help="LABEL=DIR: the reference build")
    parser.add_argument("b", help="LABEL=DIR: the build compared with it")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--impls", nargs="*", default=["fa2", "fa3", "fa3_fp8"])
    parser.add_argument("--slower-pct", type=float, default=1.0)
    # What follows "--" goes to kernels.py as it is (argparse's REMAINDER would also take the
    # options given after A and B).
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    sides = [tuple(spec.split("=", 1)) for spec in (args.a, args.b)]
    if any(len(side) != 2 or not Path(side[1]).is_dir() for side in sides):
        parser.error("A and B are LABEL=DIR, DIR a folder with an installed vendored_flash_attn")
    results: dict[str, list[dict]] = {label: [] for label, _ in sides}
    for round_ in range(args.rounds):
        for label, folder in (sides if round_ % 2 == 0 else sides[::-1]):
            out = args.out / f"{label}-{round_}"
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")]))}
            cmd = [sys.executable, str(HERE / "kernels.py"), "--out", str(out), "--plain", "--impls", *args.impls, *extra]
            print(f"[kernels_pair] round {round_ + 1}/{args.rounds}: {label}", file=sys.stderr, flush=True)
            done = subprocess.run(cmd, env=env, cwd="/", stdout=subprocess.DEVNULL)
            if done.returncode != 0 or not (out / "kernels.json").is_file():
                print(f"[kernels_pair] kernels.py failed for {label} (exit {done.returncode})", file=sys.stderr)
                return 2
            results[label].append(json.loads((out / "kernels.json").read_text()))
    (label_a, _), (label_b, _) = sides
    result = compare(results[label_a], results[label_b], args.slower_pct)
    result.update({"a": label_a, "b": label_b, "rounds": args.rounds})
    print(f"{'case':22} {'row':8} {label_a + ' ms':>12} {label_b + ' ms':>12} {label_b + '/' + label_a:>10}")
    for row in result["rows"]:
        if "missing_in" in row:
            print(f"{row['case']:22} {row['impl']:8} {'not in ' + row['missing_in']:>36}")
        else:
            flag = "  SLOWER" if row["slower"] else ""
            print(f"{row['case']:22} {row['impl']:8} {row['a_ms']:12.4f} {row['b_ms']:12.4f} {row['b_over_a']:10.4f}{flag}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernels-pair.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'ok' if result['ok'] else 'NOT ok'}: {len(result['slower'])} row(s) slower than "
          f"{label_a} by more than {args.slower_pct}%, {len(result['missing'])} missing")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
