"""The pin's trust anchor: what every verified file of the pinned upstream is, kept in this
repository (``anchor.json`` beside the pin), never asked of the source cache.

The anchor lists, for each pinned repository, the commit and paths it was made from and every
file under those paths: path, mode ("644"/"755") and sha256 of its bytes (the manifest of
cmake/vfa_build/sources/staged_tree.py). It is written by one command from a fresh fetch, and reviewed with the
pin bump that changes it (vendor/flash-attention/README.md):

    python cmake/vfa_build sources.source_anchor anchor        # FLASH_ATTN_MIRROR / CUTLASS_MIRROR honoured

That command fetches each pinned commit into a throwaway repository (git checks the hash of
every object it receives; the commit names its tree, the tree its blobs), reads each blob under
the pin's paths, checks it hashes to its git object id, and records its sha256. A link or a
submodule under the paths is refused: the staged copy holds regular files only.

The build never believes the cache's git: ``stage`` (configure) copies the anchored files from
a source folder into the user's staged store (cmake/vfa_build/sources/staged_tree.py), hashing what it writes,
and refuses a folder whose files differ from the anchor; ``verify`` (the build-time target
vfa_verified_sources, before any compile) hashes the staged copies again, checks the spec it
reads and the generated files against the digests the configure wrote, and records a snapshot
(inode, ctime) of every staged entry; ``unchanged`` (before each module links and before
the wheel is packed) proves from that snapshot that nothing changed since, an edit undone
in between included, and otherwise removes this build's objects so none outlives it.
Standard library only: it runs with ``python -E -s -S``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from vfa_build.sources import staged_tree

ANCHOR_NAME = "anchor.json"
COMPONENTS = {"flash_attention": "FLASH_ATTN", "cutlass": "CUTLASS"}
HOW = "python cmake/vfa_build sources.source_anchor anchor (vendor/flash-attention/README.md, Bumping the pin)"


class AnchorError(Exception):
    pass


def anchor_path(pin_file: Path) -> Path:
    return Path(pin_file).resolve().parent / ANCHOR_NAME


# --- writing the anchor --------------------------------------------------------------------


def _git(args, cwd=None, stdin=None, env=None) -> bytes:
    proc = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, env=env)
    if proc.returncode != 0:
        raise AnchorError(f"git {' '.join(args[:3])} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout


def manifest_from_git(repo: Path, commit: str, paths: list[str], env=None) -> dict:
    """The manifest of ``paths`` at ``commit`` in the repository ``repo``, read from its objects,
    each blob checked against its object id."""
    listed = _git(["-C", str(repo), "ls-tree", "-r", "-z", "--full-tree", commit, "--", *paths], env=env)
    entries = []
    for item in listed.split(b"\0"):
        if not item:
            continue
        meta, path = item.split(b"\t", 1)
        mode, kind, oid = meta.decode().split()
        path = path.decode()
        if kind != "blob" or mode not in ("100644", "100755"):
            raise AnchorError(f"{path} at {commit} is a {kind} of mode {mode}: the staged copy holds regular "
                              f"files only; take it out of the pin's paths")
        entries.append((path, mode, oid))
    batch = _git(["-C", str(repo), "cat-file", "--batch"], stdin="".join(f"{o}\n" for _, _, o in entries).encode(),
                 env=env)
    manifest, at = {}, 0
    for path, mode, oid in entries:
        header_end = batch.index(b"\n", at)
        got_oid, _kind, size = batch[at:header_end].decode().split()
        data = batch[header_end + 1:header_end + 1 + int(size)]
        at = header_end + 2 + int(size)
        if hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() != oid or got_oid != oid:
            raise AnchorError(f"the object of {path} ({oid}) does not hash to its id: a corrupt repository")
        manifest[path] = ("755" if mode == "100755" else "644", hashlib.sha256(data).hexdigest())
    if not manifest:
        raise AnchorError(f"no file under {paths} at {commit}")
    return manifest


def component_entry(commit: str, paths: list[str], manifest: dict) -> dict:
    return {"commit": commit, "paths": list(paths), "digest": staged_tree.digest(manifest),
            "files": staged_tree.manifest_json(manifest)}


def write_anchor(path: Path, entries: dict) -> None:
    """One file per line, so a pin bump's review reads which files changed."""
    lines = ["{", f'  "about": {json.dumps("written by " + HOW + "; do not edit")},']
    for n, (name, entry) in enumerate(entries.items()):
        lines.append(f"  {json.dumps(name)}: {{")
        for key in ("commit", "paths", "digest"):
            lines.append(f"    {json.dumps(key)}: {json.dumps(entry[key])},")
        lines.append('    "files": [')
        files = [f"      {json.dumps(f)}" for f in entry["files"]]
        lines.append(",\n".join(files))
        lines.append("    ]")
        lines.append("  }" + ("," if n < len(entries) - 1 else ""))
    lines.append("}")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def fetch_and_anchor(pin_file: Path, out: Path) -> None:
    pin = json.loads(Path(pin_file).read_text(encoding="utf-8"))
    entries = {}
    env = {**os.environ, "GIT_NO_LAZY_FETCH": "1", "GIT_TERMINAL_PROMPT": "0"}
    for name, prefix in COMPONENTS.items():
        url = os.environ.get(f"{prefix}_MIRROR") or pin[name]["url"]
        commit = pin[name]["commit"]
        with tempfile.TemporaryDirectory(prefix="vfa-anchor-") as tmp:
            _git(["init", "-q", "--bare", "--template=", tmp], env=env)
            with open(Path(tmp) / "config", "a", encoding="utf-8") as config:  # the URL never on a command line
                config.write('[remote "origin"]\n\turl = ' + json.dumps(url) + "\n")
            print(f"fetching {name} {commit}", file=sys.stderr)
            # The commit and its trees, then exactly the blobs under the pin's paths, by id (a
            # mirror may itself be a partial clone that lacks the others).
            _git(["-C", tmp, "fetch", "-q", "--no-tags", "--depth", "1", "--filter=blob:none", "origin", commit],
                 env=env)
            listed = _git(["-C", tmp, "ls-tree", "-r", "-z", "--full-tree", commit, "--", *pin[name]["paths"]],
                          env=env)
            oids = {item.split(b"\t")[0].split()[2].decode() for item in listed.split(b"\0") if item}
            _git(["-C", tmp, "-c", "fetch.negotiationAlgorithm=noop", "fetch", "-q", "--no-tags",
                  "--no-write-fetch-head", "--recurse-submodules=no", "--filter=blob:none", "--stdin", "origin"],
                 stdin="".join(f"{o}\n" for o in sorted(oids)).encode(), env=env)
            manifest = manifest_from_git(Path(tmp), commit, pin[name]["paths"], env=env)
        entries[name] = component_entry(commit, pin[name]["paths"], manifest)
        print(f"{name}: {len(manifest)} files, digest {entries[name]['digest']}", file=sys.stderr)
    write_anchor(out, entries)


# --- reading it ------------------------------------------------------------------------------


def load(pin_file: Path, component: str) -> tuple[dict, dict]:
    """(the anchor's entry for ``component``, its manifest), checked to agree with the pin."""
    pin_file = Path(pin_file)
    path = anchor_path(pin_file)
    if not path.is_file():
        raise AnchorError(f"there is no anchor '{path}' beside the pin file '{pin_file}': it says what every "
                          f"pinned file is. Write it: {HOW}")
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))[component]
        pinned = json.loads(pin_file.read_text(encoding="utf-8"))[component]
        manifest = {p: (m, h) for p, m, h in entry["files"]}
    except (ValueError, KeyError, TypeError) as error:
        raise AnchorError(f"the anchor '{path}' has no readable entry for {component} ({error!r}). Write it "
                          f"again: {HOW}") from None
    for key in ("commit", "paths"):
        if entry.get(key) != pinned.get(key):
            raise AnchorError(f"the anchor '{path}' and the pin file '{pin_file}' disagree: {component}.{key} is "
                              f"{entry.get(key)} in the anchor, {pinned.get(key)} in the pin. A pin bump writes "
                              f"the anchor again in the same change: {HOW}")
    if entry.get("digest") != staged_tree.digest(manifest):
        raise AnchorError(f"the anchor '{path}': {component}.digest does not match its files (edited by hand?). "
                          f"Write it again: {HOW}")
    return entry, manifest


# --- the build's uses ------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _read_spec(spec: Path, sha: str) -> dict:
    if not spec.is_file() or _sha256(spec) != sha:
        raise AnchorError(f"the source check's spec '{spec}' is not the one this build was configured with "
                          f"(edited, or removed, since the configure). Configure again (cmake -S <project> -B "
                          f"<build dir>; pip configures every time), which writes it anew.")
    return json.loads(spec.read_text(encoding="utf-8"))


def _check_generated(spec: dict, taken: dict | None = None) -> list[str]:
    """The generated files, each alone in its staged folder (cmake/KernelSelection.cmake:
    vfa_stage_generated_file), held to the digest the configure wrote and to the staged copies'
    rules (this user's, writable by nobody else, no link); their folders' snapshots go to ``taken``."""
    problems = []
    for item in spec.get("generated", []):
        path = Path(item["path"])
        folder = path.parent
        before = staged_tree.snapshot(folder) if folder.is_dir() and not folder.is_symlink() else {}
        differences = staged_tree.verify(folder, {path.name: ("644", item["sha256"])})
        if not differences and staged_tree.changed_since(folder, before):
            differences = {"changed": staged_tree.changed_since(folder, before)}
        if differences:
            problems.append(f"the generated file '{path}' is not what the configure wrote (edited since: "
                            f"{staged_tree.describe(differences)}). Configure again, which writes it anew")
        elif taken is not None:
            taken[str(folder)] = before
    return problems


def build_time_verify(spec_file: Path, sha: str) -> None:
    spec = _read_spec(spec_file, sha)
    taken = {}
    problems = _check_generated(spec, taken)
    for c in spec["components"]:
        _entry, manifest = load(Path(spec["pin"]), c["name"])
        staged = Path(c["staged"])
        before = staged_tree.snapshot(staged) if staged.is_dir() else {}
        differences = staged_tree.verify(staged, manifest)
        if not differences and staged_tree.changed_since(staged, before):
            differences = {"changed": staged_tree.changed_since(staged, before)}
        if differences:
            problems.append(f"{c['name']}: the staged copy '{staged}' no longer holds commit {c['commit']} as the "
                            f"anchor says: {staged_tree.describe(differences)}. Configure again, which stages it "
                            f"anew from the verified source")
        taken[str(staged)] = before
        if c["origin"] == "source_dir":
            actual, odd = staged_tree.manifest_of(Path(c["source"]), c["paths"])
            differences = staged_tree.compare(manifest, actual, odd)
            if differences:
                problems.append(f"{c['name']}: '{c['source']}' no longer holds commit {c['commit']} unmodified: "
                                f"{staged_tree.describe(differences)}. Restore those files (git -C '{c['source']}' "
                                f"status shows them), or configure again: the configure then records this tree as "
                                f"it is, with a warning and matches_pin: false")
    if problems:
        Path(spec["snapshot"]).unlink(missing_ok=True)
        raise AnchorError("the upstream sources changed since this build was configured, which verified them (its "
                          "build info says matches_pin: true), so nothing is compiled or packaged from them:\n"
                          + "\n".join(problems))
    text = json.dumps(taken, sort_keys=True)
    snap = Path(spec["snapshot"])
    if not snap.is_file() or snap.read_text(encoding="utf-8") != text:
        snap.write_text(text, encoding="utf-8")


def unchanged(spec_file: Path, sha: str, when: str) -> None:
    """Proves the staged copies unchanged since the build-time check: else this build's objects go."""
    spec = _read_spec(spec_file, sha)
    problems = _check_generated(spec)
    snap = Path(spec["snapshot"])
    taken = json.loads(snap.read_text(encoding="utf-8")) if snap.is_file() else None
    if taken is None:
        problems.append(f"no snapshot '{snap}' of the verified sources: the build-time check did not run")
    else:
        for staged, before in taken.items():
            changed = staged_tree.changed_since(Path(staged), before)
            if changed:
                shown = ", ".join(changed[:staged_tree.SHOWN]) + (
                    f" and {len(changed) - staged_tree.SHOWN} more" if len(changed) > staged_tree.SHOWN else "")
                problems.append(f"the staged copy '{staged}' changed while this build compiled ({shown}), even if "
                                f"it was changed back")
    if problems:
        removed = 0
        for objects in spec.get("objects", []):
            for dirpath, _dirs, files in os.walk(objects):
                for name in files:
                    if name.endswith((".o", ".obj")):
                        os.unlink(os.path.join(dirpath, name))
                        removed += 1
        snap.unlink(missing_ok=True)
        raise AnchorError(f"vendored-flash-attn: the sources this build compiled cannot be proven to be the verified "
                          f"ones {when}: " + "; ".join(problems) + f". Its {removed} compiled objects were removed, so "
                          f"none of them is linked or packaged; build again (configure again if a file stays "
                          f"changed) and find what writes into the staged copy.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    a = sub.add_parser("anchor", help="write anchor.json beside the pin from a fresh fetch of the pinned commits")
    a.add_argument("--pin", type=Path, default=Path(__file__).resolve().parents[3] / "vendor/flash-attention/pin.json")
    s = sub.add_parser("stage", help="copy a source folder's anchored files into the staged store, verified")
    c = sub.add_parser("compare", help="exit 2 and say how a source folder differs from the anchor")
    for p in (s, c):
        p.add_argument("--pin", type=Path, required=True)
        p.add_argument("--component", required=True, choices=COMPONENTS)
        p.add_argument("--source", type=Path, required=True)
    s.add_argument("--store", type=Path, required=True)
    s.add_argument("--name", required=True)
    for name in ("verify", "unchanged"):
        p = sub.add_parser(name)
        p.add_argument("--spec", type=Path, required=True)
        p.add_argument("--spec-sha256", required=True)
        p.add_argument("--when", default="")
    args = parser.parse_args(argv)
    try:
        if args.command == "anchor":
            fetch_and_anchor(args.pin, anchor_path(args.pin))
        elif args.command == "compare":
            entry, manifest = load(args.pin, args.component)
            actual, odd = staged_tree.manifest_of(args.source, entry["paths"])
            differences = staged_tree.compare(manifest, actual, odd)
            if differences:
                print(staged_tree.describe(differences))
                return 2
        elif args.command == "stage":
            entry, manifest = load(args.pin, args.component)
            try:
                staged = staged_tree.stage(args.source, entry["paths"], args.store, args.name, manifest)
            except staged_tree.Mismatch as mismatch:
                print(staged_tree.describe(mismatch.differences))
                return 2
            print(json.dumps({"path": str(staged.path), "reused": staged.reused}))
        elif args.command == "verify":
            build_time_verify(args.spec, args.spec_sha256)
        else:
            unchanged(args.spec, args.spec_sha256, args.when)
    except (AnchorError, staged_tree.StagingError, OSError) as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
