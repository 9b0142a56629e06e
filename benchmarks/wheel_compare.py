#!/usr/bin/env python3
"""Two wheels, member by member: which members only one holds, which hold the same bytes, which
differ, and whether the compiled modules (``*.so``) are byte-identical.

    python benchmarks/wheel_compare.py BEFORE.whl AFTER.whl [--json OUT.json]

Made for a change that must not change what builds (issue 42's layout move: a wheel built
before and after holds the same members apart from moved Python files, its modules
byte-identical). A member that only one wheel holds is listed with its kind (Python source,
compiled module, other); a member both hold with other bytes is listed too (a data file such
as the declaration, or METADATA, whose long description is the README, may change with such a
change; the listing says which did). Exit status 0 when every compiled module is in both wheels
with the same bytes and every member that only one wheel holds is a Python file, else 1.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zipfile
from pathlib import Path


def _members(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        return {info.filename: hashlib.sha256(zf.read(info)).hexdigest()
                for info in zf.infolist() if not info.is_dir()}


def _kind(name: str) -> str:
    if name.endswith(".so"):
        return "module"
    if name.endswith(".py"):
        return "python"
    if ".dist-info/" in name:
        return "metadata"
    return "other"


def compare(before: Path, after: Path) -> dict:
    a, b = _members(before), _members(after)
    same = sorted(n for n in a.keys() & b.keys() if a[n] == b[n])
    differ = sorted(n for n in a.keys() & b.keys() if a[n] != b[n])
    only_a, only_b = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
    modules = sorted(n for n in a.keys() | b.keys() if _kind(n) == "module")
    modules_identical = all(n in a and n in b and a[n] == b[n] for n in modules)
    # Members only one wheel holds may be Python files alone (moved by the change); a module's
    # bytes are compared above; a data file's or the metadata's changed bytes are listed.
    unexpected = [n for n in only_a + only_b if _kind(n) != "python"]
    return {
        "before": str(before), "after": str(after),
        "members": {"before": len(a), "after": len(b), "same": len(same), "differ": differ,
                    "only_before": only_a, "only_after": only_b},
        "modules": {n: {"before": a.get(n), "after": b.get(n)} for n in modules},
        "modules_identical": modules_identical and bool(modules),
        "unexpected": unexpected,
        "ok": modules_identical and bool(modules) and not unexpected,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--json", type=Path, help="write the comparison here")
    args = parser.parse_args()
    result = compare(args.before, args.after)
    m = result["members"]
    print(f"{'':28} {'before':>8} {'after':>8}")
    print(f"{'members':28} {m['before']:>8} {m['after']:>8}")
    print(f"same bytes: {m['same']}; differ: {len(m['differ'])}; only before: {len(m['only_before'])}; "
          f"only after: {len(m['only_after'])}")
    for label, names in (("differ", m["differ"]), ("only before", m["only_before"]),
                         ("only after", m["only_after"])):
        for name in names:
            print(f"  {label:12} {_kind(name):9} {name}")
    for name, digests in result["modules"].items():
        verdict = "identical" if digests["before"] == digests["after"] else "DIFFER"
        print(f"module {name}: {verdict} ({(digests['before'] or '-')[:16]} / {(digests['after'] or '-')[:16]})")
    for name in result["unexpected"]:
        print(f"unexpected difference (not a Python file): {name}")
    print("ok" if result["ok"] else "NOT ok: see above")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
