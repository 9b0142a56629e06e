"""Staged trees: a per-user, content-addressed copy of files that only its user can write.

A build that compiles files from a shared or foreign place (a source cache other users or
processes can write, a site-packages) reads them only through a *staged copy*: the bytes are
read once, hashed as they are written into a private temporary folder, compared with what is
expected (when an anchor says what that is), and the folder is renamed into place at a path
that depends only on the content: ``<store>/<name>-<digest[:32]>``. The path is the same for
every checkout and build dir of a user (compiler caches key on absolute paths), and a copy
that is there already is verified again before it is reused.

A *manifest* is ``{relative path: (mode, sha256)}``: every regular file, ``mode`` "644" or
"755" (executable for its owner or not, as git records it). Links, fifos, sockets and devices
are never copied (the copy has none); under a staged folder they are reported. Its *digest*
is the sha256 of its canonical text (``"<mode> <sha256> <path>\\n"`` per file, sorted by path).

The API (standard library only; Python >= 3.9):

  ``manifest_of(root, paths) -> (manifest, odd)``
      hash the regular files under ``paths`` (folders or files, relative to ``root``), no link
      followed; ``odd`` maps "linked"/"special" to the entries that are not regular files.
  ``digest(manifest) -> str``            what names a staged copy.
  ``compare(expected, actual, odd=None) -> {kind: [paths]}``
      kinds: changed, missing, added, moded (mode only), linked, special; empty when equal.
  ``describe(differences) -> str``       "1 file changed (a/b.h); 2 files missing (c, d)".
  ``stage(source, paths, store, name, expected=None) -> Staged``
      the verified copy (``Staged.path``, ``.manifest``, ``.reused``); raises ``Mismatch``
      (``.differences``) when the source is not ``expected``, ``UnsafeStore`` when ``store`` is
      not this user's alone.
  ``verify(tree, expected) -> {kind: [paths]}``
      a staged copy checked whole: content as ``compare``, plus "unsafe": an entry not owned by
      this user, writable by group or others, a link or a special file.
  ``snapshot(tree) -> dict`` / ``changed_since(tree, snapshot) -> [paths]``
      each entry's inode and ctime (which no user can set back): proves a tree unchanged
      between two moments without hashing, an edit undone in between included.

CLI (for other build steps): ``python cmake/vfa_build sources.staged_tree stage --source DIR --store DIR --name N
[--expect MANIFEST.json] PATH...`` prints ``{"path", "digest", "reused"}``;
``python cmake/vfa_build sources.staged_tree verify --tree DIR --expect MANIFEST.json``. A manifest file is
``{"files": [[path, mode, sha256], ...]}``.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import secrets
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

Manifest = dict  # {relative path: (mode, sha256)}

# How many paths a description lists per kind before "and N more".
SHOWN = 5
_CHUNK = 1 << 20

# What each kind of difference is called in a description.
_KIND_WORDS = {
    "changed": "changed",
    "missing": "missing",
    "added": "added",
    "linked": "replaced by a symlink",
    "moded": "with another mode than the anchor's",
    "special": "that {is} not a regular file or folder (a fifo, socket or device)",
    "unsafe": "that another user could write, that this user does not own, or that {is} not a regular file",
}


class StagingError(Exception):
    """A staged copy could not be made or used; the text says why and what to do."""


class Mismatch(StagingError):
    def __init__(self, source: Path, differences: dict):
        self.differences = differences
        super().__init__(f"'{source}' does not hold the expected files: {describe(differences)}")


class UnsafeStore(StagingError):
    pass


@dataclass
class Staged:
    path: Path
    manifest: Manifest
    reused: bool


def _mode(st: os.stat_result) -> str:
    return "755" if st.st_mode & stat.S_IXUSR else "644"


def _walk(root: Path, paths) -> tuple[list[str], dict]:
    """Regular files under ``paths`` (sorted), and the entries that are links or special files."""
    files, odd = [], {"linked": [], "special": []}

    def visit(rel: str) -> None:
        try:
            st = os.lstat(root / rel)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            odd["linked"].append(rel)
        elif stat.S_ISDIR(st.st_mode):
            for child in sorted(os.listdir(root / rel)):
                visit(f"{rel}/{child}")
        elif stat.S_ISREG(st.st_mode):
            files.append(rel)
        else:
            odd["special"].append(rel)

    for path in paths:
        visit(path.strip("/"))
    return sorted(set(files)), odd


def _open_regular(path: Path) -> int:
    """A file descriptor on ``path``, refused when it is (now) a link or not a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StagingError(f"'{path}' is not a regular file")
    return fd


def _hash_copy(src: Path, dest: Path | None) -> tuple[str, str]:
    """(mode, sha256) of ``src``, its bytes written to ``dest`` as they are hashed."""
    fd = _open_regular(src)
    sha = hashlib.sha256()
    try:
        mode = _mode(os.fstat(fd))
        out = None if dest is None else open(dest, "xb")
        try:
            while chunk := os.read(fd, _CHUNK):
                sha.update(chunk)
                if out is not None:
                    out.write(chunk)
        finally:
            if out is not None:
                out.close()
    finally:
        os.close(fd)
    return mode, sha.hexdigest()


def manifest_of(root: Path, paths) -> tuple[Manifest, dict]:
    root = Path(root)
    files, odd = _walk(root, paths)
    return {rel: _hash_copy(root / rel, None) for rel in files}, odd


def manifest_text(manifest: Manifest) -> str:
    for path in manifest:
        if "\n" in path or "\r" in path:
            raise StagingError(f"a path with a line break cannot be staged: {path!r}")
    return "".join(f"{m} {h} {p}\n" for p, (m, h) in sorted(manifest.items(), key=lambda i: i[0].encode()))


def digest(manifest: Manifest) -> str:
    return hashlib.sha256(manifest_text(manifest).encode()).hexdigest()


def compare(expected: Manifest, actual: Manifest, odd: dict | None = None) -> dict:
    found = {kind: [] for kind in _KIND_WORDS}
    odd = odd or {}
    odd_paths = {p for kind in ("linked", "special") for p in odd.get(kind, [])}
    for kind in ("linked", "special"):
        found[kind] = sorted(odd.get(kind, []))
    for path, (mode, sha) in expected.items():
        if path in odd_paths:
            continue
        got = actual.get(path)
        if got is None:
            found["missing"].append(path)
        elif got[1] != sha:
            found["changed"].append(path)
        elif got[0] != mode:
            found["moded"].append(f"{path}: {got[0]}, not {mode}")
    found["added"] = sorted(p for p in actual if p not in expected)
    return {kind: sorted(paths) for kind, paths in found.items() if paths}


def describe(differences: dict) -> str:
    parts = [f"the staged folder itself was replaced by a symlink ({link}), not the copy that was staged"
             for link in differences.get("tree_linked", [])]
    for kind, words in _KIND_WORDS.items():
        paths = differences.get(kind, [])
        if not paths:
            continue
        shown = ", ".join(paths[:SHOWN]) + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")
        one = len(paths) == 1
        noun = ("entry" if one else "entries") if kind in ("special", "unsafe") else ("file" if one else "files")
        parts.append(f"{len(paths)} {noun} {words.replace('{is}', 'is' if one else 'are')} ({shown})")
    return "; ".join(parts)


def check_store(store: Path) -> None:
    """``store`` exists (made 0755 when missing), is a folder of this user's, and nobody else can write it."""
    store = Path(store)
    store.mkdir(parents=True, exist_ok=True, mode=0o755)
    st = os.lstat(store)
    problem = ""
    if not stat.S_ISDIR(st.st_mode):
        problem = "it is not a folder (a link?)"
    elif st.st_uid != os.geteuid():
        problem = f"it is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif st.st_mode & 0o022:
        problem = f"group or others may write it (mode {stat.S_IMODE(st.st_mode):o})"
    if problem:
        raise UnsafeStore(f"the staging folder '{store}' is not this user's alone: {problem}. A staged copy "
                          f"there could be replaced by someone else. Point it at a folder of yours "
                          f"(chmod go-w '{store}', or remove it and build again).")


def _unsafe(tree: Path) -> list[str]:
    """Entries of ``tree`` (itself included) not owned by this user, writable by others, links or special."""
    me, found = os.geteuid(), []
    for dirpath, dirnames, filenames in os.walk(tree):
        for path in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
            st = os.lstat(path)
            if st.st_uid != me or st.st_mode & 0o022 or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
                found.append(os.path.relpath(path, tree))
    return sorted(set(found))


def verify(tree: Path, expected: Manifest) -> dict:
    tree = Path(tree)
    if tree.is_symlink():
        # Named as the link it is, not as every file missing.
        return {"tree_linked": [f"{tree} -> {os.readlink(tree)}"]}
    if not tree.is_dir():
        return {"missing": sorted(expected)}
    actual, odd = manifest_of(tree, [p for p in os.listdir(tree)])
    differences = compare(expected, actual, odd)
    unsafe = _unsafe(tree)
    if unsafe:
        differences["unsafe"] = unsafe
    return differences


def _remove(path: Path) -> None:
    """Removes a tree of this user's, read-only folders included; a link is removed, never followed."""
    if os.path.islink(path):
        os.unlink(path)
        return
    def writable_again(func, p, _exc):
        os.chmod(os.path.dirname(p), 0o700)
        os.chmod(p, 0o700) if os.path.isdir(p) else None
        func(p)
    shutil.rmtree(path, onerror=writable_again)


def stage(source: Path, paths, store: Path, name: str, expected: Manifest | None = None) -> Staged:
    source, store = Path(source), Path(store)
    check_store(store)
    if expected is not None:
        target = store / f"{name}-{digest(expected)[:32]}"
        if target.exists() or target.is_symlink():
            if not verify(target, expected):
                return Staged(target, expected, True)
            # Changed since it was staged: made again below, from the source, never used as it is.
            aside = store / f".{target.name}.stale-{secrets.token_hex(4)}"
            os.rename(target, aside)
            _remove(aside)
    tmp = store / f".{name}.tmp-{secrets.token_hex(6)}"
    try:
        tmp.mkdir(mode=0o700)
        return _stage_into(source, paths, store, name, expected, tmp)
    except OSError as error:
        if tmp.exists():
            _remove(tmp)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StagingError(_full_store(store, source, paths, error)) from error
        raise
    except BaseException:
        if tmp.exists():
            _remove(tmp)
        raise


def _full_store(store: Path, source: Path, paths, error: OSError) -> str:
    """A full disk (or quota) met while staging: the store, its free space and the fix."""
    try:
        st = os.statvfs(store)
        free = f"{st.f_bavail * st.f_frsize / 2**20:.0f} MB free"
    except OSError:
        free = "its free space unknown"
    try:
        need = sum(f.stat().st_size for p in paths for f in (Path(source) / p).rglob("*") if f.is_file())
        need = f"; the copy of '{source}' needs about {need / 2**20:.0f} MB"
    except OSError:
        need = ""
    return (f"the staged store '{store}' is full ({error.strerror}; {free} there{need}). Free space on that "
            f"disk (old entries of the store can go: the build stages what it needs again), or set "
            f"VFA_STAGED_SOURCES to a folder of yours on a disk with room")


def _stage_into(source: Path, paths, store: Path, name: str, expected: Manifest | None, tmp: Path) -> Staged:
    files, odd = _walk(source, paths)
    manifest = {}
    for rel in files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        manifest[rel] = _hash_copy(source / rel, tmp / rel)
        os.chmod(tmp / rel, 0o755 if manifest[rel][0] == "755" else 0o644)
    if expected is not None:
        differences = compare(expected, manifest, odd)
        if differences:
            raise Mismatch(source, differences)
    target = store / f"{name}-{digest(manifest)[:32]}"
    for dirpath, _dirs, _files in os.walk(tmp):
        os.chmod(dirpath, 0o755)
    try:
        os.rename(tmp, target)
    except OSError:
        # Another build staged the same content meanwhile: use it, verified.
        if verify(target, manifest):
            raise
        _remove(tmp)
        return Staged(target, manifest, True)
    return Staged(target, manifest, False)


def snapshot(tree: Path) -> dict:
    tree = Path(tree)
    taken = {}
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in ["."] + filenames:
            path = os.path.normpath(os.path.join(dirpath, name))
            st = os.lstat(path)
            taken[os.path.relpath(path, tree)] = [st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size]
    return taken


def changed_since(tree: Path, taken: dict) -> list[str]:
    now = snapshot(tree)
    return sorted(p for p in set(now) | set(taken) if now.get(p) != taken.get(p))


def read_manifest(path: Path) -> Manifest:
    return {p: (m, h) for p, m, h in json.loads(Path(path).read_text(encoding="utf-8"))["files"]}


def manifest_json(manifest: Manifest) -> list:
    return [[p, m, h] for p, (m, h) in sorted(manifest.items(), key=lambda i: i[0].encode())]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("stage")
    s.add_argument("--source", type=Path, required=True)
    s.add_argument("--store", type=Path, required=True)
    s.add_argument("--name", required=True)
    s.add_argument("--expect", type=Path)
    s.add_argument("paths", nargs="+")
    v = sub.add_parser("verify")
    v.add_argument("--tree", type=Path, required=True)
    v.add_argument("--expect", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "stage":
            expected = read_manifest(args.expect) if args.expect else None
            staged = stage(args.source, args.paths, args.store, args.name, expected)
            print(json.dumps({"path": str(staged.path), "digest": digest(staged.manifest), "reused": staged.reused}))
        else:
            differences = verify(args.tree, read_manifest(args.expect))
            if differences:
                print(f"'{args.tree}' differs from its manifest: {describe(differences)}", file=sys.stderr)
                return 1
    except StagingError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
