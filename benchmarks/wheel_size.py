"""The `full` wheel's size from the measured modules of its slices.

    python benchmarks/wheel_size.py [--out wheel_size.json]
    python benchmarks/wheel_size.py --record RESULTS_DIR --run "what, where, when"

Each slice of `full` (benchmarks/full_slices.json) builds its own `_vendored_fa3_C` and
`_vendored_fa2_C`; tests/gpu/slice_h200.sh's `test` step writes their sizes to
RESULTS_DIR/sizes.txt: each module in the build dir (`ls -l`) and, per .so member of the
wheel, its size and its compressed size there (a wheel is a zip: the modules are stored
deflated). --record reads that file (and slice.txt) into benchmarks/module_sizes_h200.json;
a build of several slices together (hd128-256 was one, before it was cut in two for the
15-minute bar) is recorded with --covers naming the slices its modules hold.

The projection sums, over the measured slices, the modules' compressed sizes in their
wheels (the compression ratio is each module's own, measured: compressed / stored size)
and adds the package (the wheel minus its modules, measured on the same wheels). Slices
not measured yet are listed with their instantiations and left out of the sum: the
printed total is what is measured, the gap is named, nothing is scaled up. Each slice's
module also holds the module's fixed units (FA3 combine, scheduler and C++ API; FA2's
C++ API), which one `full` module holds once: the sum counts them once per slice, an
upper bound by that much (slice_h200.sh now lists per-object sizes in objects.txt).

The slices build FA2 Hopper-only (sm_90 SASS, no PTX); the default wheel has FA2 as sm_80
SASS + compute_80 PTX. --record-objects keeps the object sizes of FA2 units built each way
(an objects.txt: "bytes path" per object) under an arch label; over the units both hold,
the ratio of their sizes scales the measured FA2 modules into an estimate of the default
wheel, printed beside the measured Hopper-only one (an estimate: one ratio for all head dims).
A build of some slices' FA2 with the default gencode, recorded with --record RESULTS_DIR
--default-fa2 (under "default_fa2"), replaces the scaled module of the Hopper-only record that
covers the same slices: those slices are measured, the others stay scaled, and the command
prints the object ratio's prediction beside each such measurement (a check of the ratio).

Release wheels also hold FA4's precompiled kernels (VFA_FA4_PRECOMPILE): --record-fa4-kernels
DIR stores the size of a precompile's output folder (cmake/vfa_build/fa4/precompile.py compile --out DIR,
with `full`'s selection), each file deflated as a wheel stores it; the command adds it to the
default wheel's figure as the release wheel.
"""

from __future__ import annotations

# Why this file names the compiled modules (_vendored_fa2_C, _vendored_fa3_C): it reads the
# sizes of those modules as the slices' builds recorded them (sizes.txt, objects.txt), by name.

import argparse
import json
import re
import statistics
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES_FILE = HERE / "module_sizes_h200.json"
AIM_MB = 100.0  # PyPI's default per-file limit (docs/wheel-size.md)
MB = 1e6
HOPPER_FA2, DEFAULT_FA2 = "sm_90", "sm_80+compute_80"  # FA2's gencode in the slices / by default
FA2_UNIT = re.compile(r"(flash_fwd_\w+_sm80)\.cu\.o$")


def parse_sizes(text: str) -> dict:
    """sizes.txt -> {"wheel_bytes", "modules": {module: {"built", "stored", "zipped"}}}."""
    wheel_bytes, modules = None, {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0].startswith("-") and len(parts) >= 9:  # ls -l: mode links user group size ... path
            path, size = parts[-1], int(parts[4])
            name = path.rsplit("/", 1)[-1]
            if name.endswith(".whl"):
                wheel_bytes = size
            elif name.startswith("_vendored_fa"):
                modules.setdefault(name.split(".")[0], {})["built"] = size
        elif len(parts) == 3 and parts[0].endswith(".so"):  # wheel member: name, size, compressed
            name = parts[0].rsplit("/", 1)[-1].split(".")[0]
            modules.setdefault(name, {}).update(stored=int(parts[1]), zipped=int(parts[2]))
    if wheel_bytes is None or not modules:
        raise ValueError("sizes.txt has no wheel or no module line (tests/gpu/slice_h200.sh test writes it)")
    return {"wheel_bytes": wheel_bytes, "modules": modules}


def record(results: Path, run: str, path: Path = SIZES_FILE, covers: list[str] | None = None,
           default_fa2: bool = False) -> dict:
    """Merge one build's measured sizes (RESULTS_DIR/slice.txt, sizes.txt) into the table;
    ``covers``: the slices that build's modules hold, where it is not the one slice it names;
    ``default_fa2``: a build whose FA2 has the default gencode, kept under "default_fa2" with its
    FA2 module only (the slices' own records stay the Hopper-only wheel)."""
    name = (results / "slice.txt").read_text().split()[0]
    entry = {**parse_sizes((results / "sizes.txt").read_text()), "run": run}
    if covers:
        entry["covers"] = list(covers)
    key = "slices"
    if default_fa2:
        fa2 = entry["modules"].get("_vendored_fa2_C", {})
        if "zipped" not in fa2:
            raise ValueError(f"{results}/sizes.txt: no _vendored_fa2_C member in the wheel (stored, zipped)")
        entry["modules"], key = {"_vendored_fa2_C": fa2}, "default_fa2"
    data = json.loads(path.read_text()) if path.is_file() else {
        "about": "Measured sizes of each slice's modules and wheel (tests/gpu/slice_h200.sh test, sizes.txt; "
                 "benchmarks/wheel_size.py --record). Bytes; zipped = the member's compressed size in the wheel.",
        "slices": {}}
    data.setdefault(key, {})[name] = entry
    data[key] = dict(sorted(data[key].items()))
    path.write_text(json.dumps(data, indent=1) + "\n")
    return entry


def deflated_size(folder: Path) -> dict:
    """Every file under ``folder`` as a wheel stores it (zip, deflate): count, stored and zipped bytes."""
    files = sorted(f for f in folder.rglob("*") if f.is_file())
    if not files:
        raise ValueError(f"{folder}: no file (the --out folder of cmake/vfa_build/fa4/precompile.py compile)")
    with tempfile.TemporaryFile() as handle:
        with zipfile.ZipFile(handle, "w", zipfile.ZIP_DEFLATED) as archive:
            for f in files:
                archive.write(f, f.relative_to(folder).as_posix())
        handle.seek(0)
        with zipfile.ZipFile(handle) as archive:
            members = archive.infolist()
    return {"files": len(members), "stored": sum(m.file_size for m in members),
            "zipped": sum(m.compress_size for m in members)}


def record_fa4_kernels(folder: Path, run: str, path: Path = SIZES_FILE) -> dict:
    """Merge the size of FA4's precompiled kernels for `full`'s selection into the table."""
    entry = {**deflated_size(folder), "run": run}
    data = json.loads(path.read_text())
    data["fa4_kernels"] = entry
    path.write_text(json.dumps(data, indent=1) + "\n")
    return entry


def record_objects(objects: Path, arch: str, run: str, path: Path = SIZES_FILE) -> dict:
    """Merge the FA2 unit objects of one build (objects.txt) into the table under ``arch``."""
    units = {}
    for line in objects.read_text().splitlines():
        size, _, name = line.strip().partition(" ")
        match = FA2_UNIT.search(name)
        if match and "/_vendored_fa2_C.dir/" in name:
            units[match[1]] = int(size)
    if not units:
        raise ValueError(f"{objects}: no FA2 unit object (flash_fwd_*_sm80.cu.o of _vendored_fa2_C)")
    data = json.loads(path.read_text())
    data.setdefault("fa2_objects", {})[arch] = {"run": run, "units": dict(sorted(units.items()))}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data["fa2_objects"][arch]


def fa2_arch_ratio(fa2_objects: dict) -> dict | None:
    """Default-arch FA2 objects over Hopper-only ones, on the units both builds hold."""
    hopper = fa2_objects.get(HOPPER_FA2, {}).get("units", {})
    default = fa2_objects.get(DEFAULT_FA2, {}).get("units", {})
    common = sorted(set(hopper) & set(default))
    if not common:
        return None
    return {"units": common, "ratio": round(sum(default[u] for u in common) / sum(hopper[u] for u in common), 3)}


def default_fa2_wheel(rows: list[dict], total: int, fa2_objects: dict, default_fa2: dict[str, dict]) -> dict | None:
    """The default wheel (FA2 as sm_80 SASS + compute_80 PTX) from the Hopper-only rows: each
    row's FA2 module as measured with the default gencode where a default_fa2 record covers the
    same slices, else scaled by the object ratio; None when a row has neither."""
    arch = fa2_arch_ratio(fa2_objects)
    by_covers = {tuple(sorted(e.get("covers", [n]))): {**e, "name": n} for n, e in default_fa2.items()}
    parts = []
    for r in rows:
        hopper = r["modules"].get("_vendored_fa2_C")
        if hopper is None:
            continue
        measured = by_covers.get(tuple(sorted(r["covers"])))
        predicted = round(hopper["zipped"] * arch["ratio"]) if arch else None
        if measured is None and predicted is None:
            return None
        parts.append({"covers": r["covers"], "hopper_zipped_bytes": hopper["zipped"], "predicted_bytes": predicted,
                      "zipped_bytes": measured["modules"]["_vendored_fa2_C"]["zipped"] if measured else predicted,
                      "how": "measured" if measured else "scaled", "record": measured["name"] if measured else "",
                      "run": measured["run"] if measured else ""})
    if not parts:
        return None
    used = {p["record"] for p in parts}
    fa2_hopper = sum(p["hopper_zipped_bytes"] for p in parts)
    fa2_default = sum(p["zipped_bytes"] for p in parts)
    return {**(arch or {}), "parts": parts, "fa2_zipped_bytes": fa2_hopper, "default_fa2_zipped_bytes": fa2_default,
            "wheel_bytes": total - fa2_hopper + fa2_default, "estimate": any(p["how"] == "scaled" for p in parts),
            # a record whose slices no Hopper-only record covers alike (a typo'd --covers) is named, not summed
            "unused_records": sorted(set(default_fa2) - used)}


def two_wheels(rows: list[dict], package_bytes: int, default: dict | None) -> dict | None:
    """The lever "FA2 and FA3 as two wheels" from the same measured modules: each family's
    modules summed, each wheel with the package; None when a row kept no member sizes."""
    if any(not r["modules"] for r in rows):
        return None
    fa3 = sum(r["modules"]["_vendored_fa3_C"]["zipped"] for r in rows if "_vendored_fa3_C" in r["modules"])
    fa2 = sum(r["modules"]["_vendored_fa2_C"]["zipped"] for r in rows if "_vendored_fa2_C" in r["modules"])
    return {"fa3_wheel_bytes": fa3 + package_bytes, "fa2_hopper_wheel_bytes": fa2 + package_bytes,
            "fa2_default_wheel_bytes": default["default_fa2_zipped_bytes"] + package_bytes if default else None,
            "fa2_default_estimate": default["estimate"] if default else None}


def project(measured: dict[str, dict], slices: dict[str, dict], fa2_objects: dict | None = None,
            default_fa2: dict[str, dict] | None = None, fa4_kernels: dict | None = None) -> dict:
    """The full wheel from the measured slices: per slice, per module, the total and the gap."""
    package = [e["wheel_bytes"] - sum(m["zipped"] for m in e["modules"].values())
               for e in measured.values() if all("zipped" in m for m in e["modules"].values())]
    package_bytes = round(statistics.mean(package)) if package else None
    # Each slice's record: the one named after it, or the build that covers it with others.
    record_of: dict[str, str] = {}
    for name, entry in measured.items():
        for covered in entry.get("covers", [name]):
            if covered in record_of:
                raise ValueError(f"slice {covered} is in two measured builds: {record_of[covered]} and {name}")
            record_of[covered] = name
    gaps = [{"slice": n, "what": spec.get("what", "")} for n, spec in slices.items() if n not in record_of]
    rows = []
    for name, entry in measured.items():
        covered = [n for n in entry.get("covers", [name]) if n in slices]
        if not covered:
            continue  # a build of slices the table no longer has
        members = {m: v for m, v in entry["modules"].items() if "zipped" in v}
        if members:
            zipped = sum(v["zipped"] for v in members.values())
            how = "the wheel's members"
        else:  # only the wheel's total was recorded: the modules are the wheel minus the package
            if package_bytes is None:
                raise ValueError(f"{name}: no member sizes and no package size measured to subtract")
            zipped = entry["wheel_bytes"] - package_bytes
            how = "wheel minus the package"
        rows.append({"slice": name, "covers": covered, "zipped_bytes": zipped, "how": how, "run": entry.get("run", ""),
                     "wheel_bytes": entry["wheel_bytes"],
                     "modules": {m: {**v, "ratio": round(v["zipped"] / v["stored"], 3)} for m, v in members.items()}})
    modules_bytes = sum(r["zipped_bytes"] for r in rows)
    total = modules_bytes + (package_bytes or 0)
    stored = sum(v["stored"] for r in rows for v in r["modules"].values())
    zipped_members = sum(v["zipped"] for r in rows for v in r["modules"].values())
    default = default_fa2_wheel(rows, total, fa2_objects or {}, default_fa2 or {})
    return {"rows": rows, "unmeasured": gaps, "package_bytes": package_bytes, "modules_zipped_bytes": modules_bytes,
            "measured_wheel_bytes": total, "aim_mb": AIM_MB,
            "ratio_of_members": round(zipped_members / stored, 3) if stored else None,
            "complete": not gaps, "default_fa2_wheel": default,
            "two_wheels": two_wheels(rows, package_bytes or 0, default), "fa4_kernels": fa4_kernels,
            "release_wheel_bytes": default["wheel_bytes"] + fa4_kernels["zipped"] if default and fa4_kernels else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--record", type=Path, metavar="RESULTS_DIR", help="a slice's results folder to record")
    p.add_argument("--run", help="(--record) what, where and when that build ran")
    p.add_argument("--default-fa2", action="store_true",
                   help="(--record) that build's FA2 has the default gencode (sm_80 SASS + compute_80 PTX): its FA2 "
                        "module replaces the scaled one of the slices it covers in the default wheel's figure")
    p.add_argument("--covers", help="(--record) the slices that build holds, comma-separated, where it built "
                                    "several together (default: the one slice.txt names)")
    p.add_argument("--record-objects", type=Path, metavar="OBJECTS_TXT",
                   help="a build's per-object sizes (slice_h200.sh's objects.txt, or `find BUILD -name '*.o' "
                        "-printf '%%s %%P\\n'`): record its FA2 units under --arch")
    p.add_argument("--record-fa4-kernels", type=Path, metavar="DIR",
                   help="FA4's precompiled kernels for `full`'s selection (fa4/precompile.py compile --out DIR): "
                        "record their size as the wheel would store them")
    p.add_argument("--arch", choices=(HOPPER_FA2, DEFAULT_FA2), help="(--record-objects) FA2's gencode in that build")
    p.add_argument("--sizes", type=Path, default=SIZES_FILE, help="the measured sizes (default %(default)s)")
    p.add_argument("--out", type=Path, help="write the projection as JSON")
    args = p.parse_args(argv)
    if args.record_fa4_kernels:
        if not args.run:
            p.error("--record-fa4-kernels needs --run (what, where and when the precompile ran)")
        entry = record_fa4_kernels(args.record_fa4_kernels, args.run, args.sizes)
        print(f"recorded FA4's kernels: {entry['files']} files, {entry['zipped'] / MB:.2f} MB deflated, in {args.sizes}")
        return 0
    if args.record_objects:
        if not (args.run and args.arch):
            p.error("--record-objects needs --arch and --run (what, where and when the build ran)")
        entry = record_objects(args.record_objects, args.arch, args.run, args.sizes)
        print(f"recorded {len(entry['units'])} FA2 unit object(s) ({args.arch}) in {args.sizes}")
        return 0
    if args.record:
        if not args.run:
            p.error("--record needs --run (what, where and when the build ran)")
        if args.covers:
            sys.path.insert(0, str(HERE))
            import dist_model

            unknown = sorted(set(args.covers.split(",")) - set(dist_model.load_slices()))
            if unknown:
                p.error(f"--covers names no slice of benchmarks/full_slices.json: {', '.join(unknown)}")
        entry = record(args.record, args.run, args.sizes, args.covers.split(",") if args.covers else None,
                       args.default_fa2)
        print(f"recorded {len(entry['modules'])} module(s) in {args.sizes}"
              + (" (FA2 with the default gencode)" if args.default_fa2 else ""))
        return 0
    sys.path.insert(0, str(HERE))
    import dist_model

    table = json.loads(args.sizes.read_text()) if args.sizes.is_file() else {}
    result = project(table.get("slices", {}), dist_model.load_slices(), table.get("fa2_objects"),
                     table.get("default_fa2"), table.get("fa4_kernels"))
    print(f"`full` wheel from measured slice modules ({args.sizes.name}); zipped = compressed size in the wheel "
          "(deflate), ratio = zipped / stored. The slices are built as slice_h200.sh builds them: FA3 sm_90a, FA2 "
          "sm_90 SASS without PTX, --compress-mode=size: a Hopper-only wheel, not the default sm_80 + PTX one")
    print("| slice | module | stored (MB) | zipped (MB) | ratio | source |\n|---|---|---|---|---|---|")
    for r in result["rows"]:
        for m, v in sorted(r["modules"].items()):
            print(f"| {' + '.join(r['covers'])} | {m} | {v['stored'] / MB:.2f} | {v['zipped'] / MB:.2f} | "
                  f"{v['ratio']:.3f} | {r['run']} |")
        if not r["modules"]:
            print(f"| {' + '.join(r['covers'])} | both | — | {r['zipped_bytes'] / MB:.2f} | — | {r['how']}: {r['run']} |")
    package = result["package_bytes"]
    print(f"package (wheel minus its modules, mean of the measured wheels): "
          f"{package / MB:.3f} MB" if package is not None else "package: not measured")
    if result["ratio_of_members"] is not None:
        print(f"compression of the measured members: {result['ratio_of_members']:.3f} of their stored size")
    total = result["measured_wheel_bytes"] / MB
    print(f"measured so far: modules {result['modules_zipped_bytes'] / MB:.2f} MB + package = **{total:.2f} MB** "
          f"(aim {AIM_MB:g} MB); each slice's modules hold their fixed units once per slice (an upper bound)")
    if result["unmeasured"]:
        print("NOT measured yet, left out of the sum (the full wheel is larger by their modules): "
              + "; ".join(f"{g['slice']} ({g['what']})" for g in result["unmeasured"]))
    else:
        print(f"every slice measured: the Hopper-only full wheel {'over' if total > AIM_MB else 'within'} the "
              f"{AIM_MB:g} MB aim")
    default = result["default_fa2_wheel"]
    if default is not None:
        if "ratio" in default:
            print(f"FA2's {len(default['units'])} units built both ways weigh {default['ratio']:.3f}x as objects "
                  f"({DEFAULT_FA2} / {HOPPER_FA2})")
        print(f"the default wheel (FA2 as {DEFAULT_FA2}), per FA2 module:\n"
              "| slices | Hopper-only FA2 (MB) | default FA2 (MB) | how | scaled by the object ratio (MB) |\n"
              "|---|---|---|---|---|")
        for part in default["parts"]:
            predicted = "—" if part["predicted_bytes"] is None else f"{part['predicted_bytes'] / MB:.2f}"
            how = f"measured ({part['record']})" if part["how"] == "measured" else "scaled"
            print(f"| {' + '.join(part['covers'])} | {part['hopper_zipped_bytes'] / MB:.2f} | "
                  f"{part['zipped_bytes'] / MB:.2f} | {how} | {predicted} |")
        kind = "an ESTIMATE, some FA2 modules scaled" if default["estimate"] else "every FA2 module measured"
        if default["unused_records"]:
            print("NOT used (their --covers match no Hopper-only record's slices): "
                  + ", ".join(default["unused_records"]))
        print(f"the default wheel: FA2 {default['fa2_zipped_bytes'] / MB:.2f} -> {default['default_fa2_zipped_bytes'] / MB:.2f} MB, "
              f"**{default['wheel_bytes'] / MB:.1f} MB** ({kind}; aim {AIM_MB:g} MB)")
    else:
        print(f"the default wheel (FA2 as {DEFAULT_FA2}): neither a default-gencode FA2 build (--record "
              "--default-fa2) nor FA2 objects of both gencodes (--record-objects) for every FA2 module: no figure")
    fa4 = result["fa4_kernels"]
    if fa4 is None:
        print("FA4's precompiled kernels (release wheels): not recorded (--record-fa4-kernels)")
    elif result["release_wheel_bytes"] is not None:
        print(f"with FA4's precompiled kernels for `full`'s selection ({fa4['files']} files, {fa4['stored'] / MB:.2f} MB, "
              f"{fa4['zipped'] / MB:.2f} MB deflated; {fa4['run']}): the release wheel **{result['release_wheel_bytes'] / MB:.1f}"
              f" MB** ({'over' if result['release_wheel_bytes'] / MB > AIM_MB else 'within'} the {AIM_MB:g} MB aim)")
    two = result["two_wheels"]
    if two is not None:
        fa2_default = ("not measured" if two["fa2_default_wheel_bytes"] is None else
                       f"{two['fa2_default_wheel_bytes'] / MB:.1f} MB with the default gencode"
                       + (" (an ESTIMATE)" if two["fa2_default_estimate"] else ""))
        print(f"lever \"FA2 and FA3 as two wheels\" (the same modules, each wheel with the package): FA3 "
              f"{two['fa3_wheel_bytes'] / MB:.1f} MB; FA2 {two['fa2_hopper_wheel_bytes'] / MB:.1f} MB Hopper-only, "
              f"{fa2_default}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
