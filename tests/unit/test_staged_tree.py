"""cmake/vfa_build/sources/staged_tree.py: a per-user, content-addressed copy that only its user can write,
verified against what is expected, reused only after it is verified again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vfa_build.sources import staged_tree

PROJECT = Path(__file__).resolve().parents[2]
BUILD_PY = str(PROJECT / "cmake" / "vfa_build")


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "src"
    (root / "inc/sub").mkdir(parents=True)
    (root / "inc/a.h").write_text("int a;\n")
    (root / "inc/sub/b.h").write_text("int b;\n")
    (root / "tool.sh").write_text("#!/bin/sh\n")
    (root / "tool.sh").chmod(0o755)
    (root / "elsewhere.h").write_text("not staged\n")
    return root


def test_a_staged_copy_holds_exactly_the_files_at_a_path_named_by_their_content(source, tmp_path):
    store = tmp_path / "store"
    expected, odd = staged_tree.manifest_of(source, ["inc", "tool.sh"])
    assert odd == {"linked": [], "special": []}
    staged = staged_tree.stage(source, ["inc", "tool.sh"], store, "demo", expected)
    assert staged.path == store / f"demo-{staged_tree.digest(expected)[:32]}" and not staged.reused
    copied = sorted(str(p.relative_to(staged.path)) for p in staged.path.rglob("*") if p.is_file())
    assert copied == ["inc/a.h", "inc/sub/b.h", "tool.sh"]
    assert os.stat(staged.path / "tool.sh").st_mode & 0o777 == 0o755
    assert os.stat(staged.path / "inc/a.h").st_mode & 0o777 == 0o644
    assert staged_tree.verify(staged.path, expected) == {}
    assert not [p for p in store.iterdir() if p.name.startswith(".")], "a temporary folder was left"
    # Without an anchor: named by what was copied, the same path.
    assert staged_tree.stage(source, ["inc", "tool.sh"], store, "demo").path == staged.path


def test_a_source_that_differs_from_the_anchor_is_not_staged(source, tmp_path):
    expected, _ = staged_tree.manifest_of(source, ["inc"])
    (source / "inc/a.h").write_text("int A;\n")
    (source / "inc/new.h").write_text("\n")
    (source / "inc/sub/b.h").unlink()
    (source / "inc/sub/b.h").symlink_to(source / "elsewhere.h")
    with pytest.raises(staged_tree.Mismatch) as raised:
        staged_tree.stage(source, ["inc"], tmp_path / "store", "demo", expected)
    assert raised.value.differences == {"changed": ["inc/a.h"], "added": ["inc/new.h"], "linked": ["inc/sub/b.h"]}
    assert staged_tree.describe(raised.value.differences) == (
        "1 file changed (inc/a.h); 1 file added (inc/new.h); 1 file replaced by a symlink (inc/sub/b.h)")
    assert list((tmp_path / "store").iterdir()) == [], "nothing may be left of a refused copy"


def test_a_reused_copy_is_verified_and_made_again_when_it_changed(source, tmp_path):
    expected, _ = staged_tree.manifest_of(source, ["inc"])
    first = staged_tree.stage(source, ["inc"], tmp_path / "store", "demo", expected)
    assert staged_tree.stage(source, ["inc"], tmp_path / "store", "demo", expected).reused
    (first.path / "inc/a.h").write_text("int A;\n")
    assert staged_tree.verify(first.path, expected) == {"changed": ["inc/a.h"]}
    again = staged_tree.stage(source, ["inc"], tmp_path / "store", "demo", expected)
    assert again.path == first.path and not again.reused
    assert (again.path / "inc/a.h").read_text() == "int a;\n"


def test_a_staged_copy_replaced_by_a_link_is_named_and_restaged_leaving_no_link(source, tmp_path):
    """Issue 43: a staged entry replaced by a link read "N files missing" without naming the link,
    and the restage left the stale link in the store (and made the store 0700 on its way)."""
    store = tmp_path / "store"
    expected, _ = staged_tree.manifest_of(source, ["inc"])
    first = staged_tree.stage(source, ["inc"], store, "demo", expected)
    elsewhere = tmp_path / "elsewhere"
    os.rename(first.path, elsewhere)
    first.path.symlink_to(elsewhere)
    differences = staged_tree.verify(first.path, expected)
    assert differences == {"tree_linked": [f"{first.path} -> {elsewhere}"]}
    assert staged_tree.describe(differences) == (
        f"the staged folder itself was replaced by a symlink ({first.path} -> {elsewhere}), not the copy that "
        "was staged")
    mode = os.stat(store).st_mode & 0o777
    again = staged_tree.stage(source, ["inc"], store, "demo", expected)
    assert again.path == first.path and not again.reused and not again.path.is_symlink()
    assert sorted(p.name for p in store.iterdir()) == [first.path.name], "a stale link or folder was left"
    assert os.stat(store).st_mode & 0o777 == mode
    assert sorted(p.name for p in elsewhere.rglob("*")) == ["a.h", "b.h", "inc", "sub"], "the link was followed"


def test_a_full_store_is_named_with_its_free_space_and_the_fix(source, tmp_path, monkeypatch):
    """Issue 43: a full staged store read "could not be staged" with the bare OS error, naming
    neither the store nor its disk."""
    import errno

    store = tmp_path / "store"
    expected, _ = staged_tree.manifest_of(source, ["inc"])

    def full(src, dest):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dest))

    monkeypatch.setattr(staged_tree, "_hash_copy", full)
    with pytest.raises(staged_tree.StagingError) as raised:
        staged_tree.stage(source, ["inc"], store, "demo", expected)
    text = str(raised.value)
    assert text.startswith(f"the staged store '{store}' is full ({os.strerror(errno.ENOSPC)}; ")
    assert " MB free there; the copy of " in text and "needs about 0 MB" in text
    assert "Free space on that disk" in text
    assert "set VFA_STAGED_SOURCES to a folder of yours on a disk with room" in text
    assert list(store.iterdir()) == [], "nothing may be left of a copy that did not fit"


def test_a_copy_another_user_could_write_is_reported(source, tmp_path):
    expected, _ = staged_tree.manifest_of(source, ["inc"])
    staged = staged_tree.stage(source, ["inc"], tmp_path / "store", "demo", expected)
    (staged.path / "inc/sub").chmod(0o777)
    assert staged_tree.verify(staged.path, expected) == {"unsafe": ["inc/sub"]}


def test_a_store_others_can_write_is_refused(source, tmp_path):
    store = tmp_path / "store"
    store.mkdir(mode=0o777)
    store.chmod(0o777)
    with pytest.raises(staged_tree.UnsafeStore, match="group or others may write it"):
        staged_tree.stage(source, ["inc"], store, "demo")


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_store_owned_by_another_user_is_refused(source, tmp_path):
    store = tmp_path / "store"
    store.mkdir(mode=0o755)
    os.chown(store, 4321, 4321)
    with pytest.raises(staged_tree.UnsafeStore, match="owned by uid 4321"):
        staged_tree.stage(source, ["inc"], store, "demo")


def test_a_snapshot_sees_an_edit_that_was_undone(source, tmp_path):
    staged = staged_tree.stage(source, ["inc"], tmp_path / "store", "demo")
    taken = staged_tree.snapshot(staged.path)
    assert staged_tree.changed_since(staged.path, taken) == []
    header = staged.path / "inc/a.h"
    before, times = header.read_bytes(), os.stat(header)
    header.write_text("int evil;\n")
    header.write_bytes(before)
    os.utime(header, ns=(times.st_atime_ns, times.st_mtime_ns))  # size and mtime as they were
    assert staged_tree.changed_since(staged.path, taken) == ["inc/a.h"]
    (staged.path / "inc/planted.h").write_text("\n")
    (staged.path / "inc/planted.h").unlink()
    assert "inc" in staged_tree.changed_since(staged.path, taken)


def test_the_command_line_stages_and_verifies(source, tmp_path):
    manifest, _ = staged_tree.manifest_of(source, ["inc"])
    expect = tmp_path / "manifest.json"
    expect.write_text(__import__("json").dumps({"files": staged_tree.manifest_json(manifest)}))
    script = [BUILD_PY, "sources.staged_tree"]
    out = subprocess.run([sys.executable, *script, "stage", "--source", str(source), "--store", str(tmp_path / "s"),
                          "--name", "demo", "--expect", str(expect), "inc"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    path = __import__("json").loads(out.stdout)["path"]
    ok = subprocess.run([sys.executable, *script, "verify", "--tree", path, "--expect", str(expect)])
    assert ok.returncode == 0
    Path(path, "inc/a.h").write_text("x")
    bad = subprocess.run([sys.executable, *script, "verify", "--tree", path, "--expect", str(expect)],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "1 file changed (inc/a.h)" in bad.stderr
