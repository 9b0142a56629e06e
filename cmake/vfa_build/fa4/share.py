"""One FA4 kernel set for every Python (``compile --share``): cross-Python sharing.

``--share FILE`` (the build passes one per arch to every Python). When FILE is absent, this
Python compiles and writes there the key hash of every kernel each call looked up. When
another Python wrote it, this one compiles every call too, into a scratch folder, and
compares every kernel byte for byte with the other Python's file for the same call (the cost
is the same as compiling its own set: docs/fa4.md measured both); all equal: only
``<flavour>/<its fingerprint>/aliases.json`` ships for it (its key hashes -> the other
Python's files, read by fa4_cache); else its own set ships and the log says why.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from vfa_build.fa4 import workers as fa4_workers
from vendored_flash_attn.families.fa4 import cache as fa4_cache
from vendored_flash_attn.families.fa4.plan import KernelCall


SHARE_SCHEMA = 1


def share_record(report: dict) -> dict:
    """What ``--share`` keeps of a run that compiled: its Python, DSL flavour, upstream
    fingerprint, arch and, for each call that gave kernels, the ``[kind, key hash]`` of each
    kernel it looked up, in order."""
    return {"schema": SHARE_SCHEMA, **{k: report[k] for k in ("arch", "python", "flavour", "fingerprint")},
            "calls": {c["call"]: c["lookups"] for c in report["calls"]
                      if c["attempt"] == 1 and not c["error"] and not c["refused"] and c["lookups"]}}


def _kernel_file(out: Path, record: dict, kind: str, digest: str) -> Path:
    return fa4_cache.kernel_dir(out, record["flavour"], record["fingerprint"], kind) / f"{digest}.o"


def alias_table(first: dict, own: dict, out: Path) -> tuple[dict, list[str]]:
    """This Python's key hashes (``own``: the share_record of a keys-only run) mapped to the
    kernel files another Python compiled (``first``: its share_record), per kind:
    ``({kind: {own hash: first hash}}, problems)``. Calls match by name, lookups by position;
    a call whose lookups differ in number or kind, or whose file is missing, is a problem."""
    table: dict = {}
    problems = []
    for name, theirs in first["calls"].items():
        mine = own["calls"].get(name)
        if mine is None or [k for k, _ in mine] != [k for k, _ in theirs]:
            problems.append(f"{name} looks up {mine} here, {theirs} with Python {first['python']}")
            continue
        for (kind, own_hash), (_, first_hash) in zip(mine, theirs):
            if not _kernel_file(out, first, kind, first_hash).is_file():
                problems.append(f"{name}: {kind}/{first_hash}.o is not among Python {first['python']}'s kernels")
            else:
                table.setdefault(kind, {})[own_hash] = first_hash
    return table, problems


def byte_differences(first: dict, compiled: dict, out: Path, compiled_out: Path) -> list[str]:
    """Kernels this Python compiled (``compiled``: the report of a compile into ``compiled_out``)
    that are not byte for byte the other Python's files for the same calls; [] when all are."""
    differences, seen = [], set()
    own = share_record(compiled)
    for name, mine in own["calls"].items():
        theirs = first["calls"].get(name, [])
        if len(mine) != len(theirs):
            differences.append(f"{name}: {len(mine)} kernels here, {len(theirs)} with Python {first['python']}")
            continue
        for (kind, own_hash), (_, first_hash) in zip(mine, theirs):
            if (kind, own_hash) in seen:  # a kernel several calls reach (the split-KV combine)
                continue
            seen.add((kind, own_hash))
            here, there = _kernel_file(compiled_out, own, kind, own_hash), _kernel_file(out, first, kind, first_hash)
            if not here.is_file() or not there.is_file() or here.read_bytes() != there.read_bytes():
                differences.append(f"{name}: {kind} kernel {own_hash[:12]} differs from Python {first['python']}'s "
                                   f"{first_hash[:12]}")
    if not own["calls"]:
        differences.append("no call compiled a kernel here: " + "; ".join(
            str(c["error"] or c["refused"]) for c in compiled["calls"]))
    return differences


def share_run(stage_root: Path, out: Path, arch: str, calls: list[KernelCall], share: Path,
              jobs: int = 1, bounds: fa4_workers.Bounds = fa4_workers.Bounds()) -> tuple[dict | None, str]:
    """``--share`` with another Python's record. This Python compiles every call too, into a
    scratch folder, and compares each kernel it made byte for byte with the other Python's
    file for the same call and position (all of them: one sample would trust the rest).
    Returns ``(report, "")`` when every kernel is the same: nothing of this Python's ships
    but its aliases.json (its key hashes -> the other Python's files); ``(report, why)``
    when any differs: its own set, moved into ``out``; ``(None, why)`` when there is no
    record to compare with (compile as usual)."""
    import tempfile

    if not share.is_file():
        return None, "no other Python has compiled these kernels"
    first = json.loads(share.read_text(encoding="utf-8"))
    if first.get("schema") != SHARE_SCHEMA or first.get("arch") != arch:
        return None, f"{share} is not a record of this step for {arch}"
    with tempfile.TemporaryDirectory(prefix="vfa-fa4-share-") as tmp:
        scratch = Path(tmp)
        compiled = fa4_workers.compile_in_workers(stage_root, scratch, arch, calls, jobs, bounds)
        own = share_record(compiled)
        why = ""
        if compiled["flavour"] != first["flavour"]:
            why = f"its DSL is the {compiled['flavour']} build, Python {first['python']}'s the {first['flavour']}"
        table, problems = ({}, []) if why else alias_table(first, own, out)
        if problems:
            why = f"{len(problems)} calls do not match: {problems[0]}"
        differences = [] if why else byte_differences(first, compiled, out, scratch)
        if differences:
            why = f"{len(differences)} of its kernels differ: {differences[0]}"
        if why or any(c["error"] for c in compiled["calls"]):
            if compiled["fingerprint"] == first["fingerprint"] and why:
                raise RuntimeError(f"Python {compiled['python']} and {first['python']} share upstream's fingerprint "
                                   f"{first['fingerprint'][:12]} but not their kernels: {why}")
            # Its own set, compiled already: into the output, as a run without --share would leave it.
            shutil.copytree(scratch, out, dirs_exist_ok=True)
            return compiled, why or "some of its kernels failed to compile"
    compared = sum(len(lookups) for lookups in own["calls"].values())
    for call in compiled["calls"]:
        call["objects"] = {}  # compiled to compare, not shipped
    same_as = {"python": first["python"], "fingerprint": first["fingerprint"], "compared": compared}
    if compiled["fingerprint"] == first["fingerprint"]:  # another interpreter of the same minor and versions
        compiled.update(aliases=0, aliased={}, same_as=same_as)
        return compiled, ""
    # One index per fingerprint, for every arch: an earlier arch's entries stay.
    index = out / compiled["flavour"] / compiled["fingerprint"] / fa4_cache.ALIASES_FILE
    entries = sum(len(t) for t in table.values())
    if index.is_file():
        earlier_same_as, earlier = fa4_cache.parse_aliases(index.read_bytes())
        if earlier_same_as != first["fingerprint"]:
            raise RuntimeError(f"{index} already names the kernels of another build Python ({earlier_same_as[:12]})")
        for kind, more in earlier.items():
            table[kind] = {**more, **table.get(kind, {})}
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(fa4_cache.aliases_text(first["fingerprint"], compiled["python"], table), encoding="utf-8")
    # The run time believes the index only with this digest from the build record (fa4_cache).
    same_as["index_sha256"] = hashlib.sha256(index.read_bytes()).hexdigest()
    compiled.update(aliases=entries, aliased={str(index.relative_to(out)): index.stat().st_size}, same_as=same_as)
    return compiled, ""
