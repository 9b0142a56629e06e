"""cmake/vfa_build/sources/torch_headers.py: torch's headers staged at a path chosen by their content alone
(issue 38: the compiler cache keys on the path a header was read from)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = [str(Path(__file__).resolve().parents[2] / "cmake" / "vfa_build"), "sources.torch_headers"]
HEADERS = {"include/torch/headeronly/macros/Macros.h": "#define C10_MACROS 1\n",
           "include/torch/csrc/api/include/torch/all.h": "#pragma once\n"}


def fake_torch(root: Path, headers: dict[str, str] = HEADERS) -> Path:
    for rel, text in headers.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "lib").mkdir()
    (root / "lib" / "libtorch.so").write_text("not a header")
    return root


def stage(torch_root: Path, store: Path, version: str = "2.14.1+cu130") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *SCRIPT, "--torch-root", str(torch_root), "--version", version,
                           "--store", str(store)], capture_output=True, text=True)


def test_two_torch_folders_with_the_same_headers_give_one_path(tmp_path):
    """As two isolated builds' /tmp/pip-build-env-* folders do: the second reuses the first's copy."""
    store = tmp_path / "store"
    first = stage(fake_torch(tmp_path / "pip-build-env-a/torch"), store)
    second = stage(fake_torch(tmp_path / "pip-build-env-b/torch"), store)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    path, how = first.stdout.splitlines()
    assert second.stdout.splitlines() == [path, "reused 2 files"] and how == "staged 2 files"
    staged = Path(path)
    assert staged.parent == store and staged.name.startswith("torch-2.14.1+cu130-")
    assert sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()) == sorted(HEADERS)
    # Other content, another path.
    other = stage(fake_torch(tmp_path / "other/torch", {**HEADERS, "include/extra.h": "int x;\n"}), store)
    assert other.returncode == 0 and other.stdout.splitlines()[0] != path


def test_an_edited_copy_is_made_again_not_used(tmp_path):
    store, torch = tmp_path / "store", fake_torch(tmp_path / "torch")
    path = Path(stage(torch, store).stdout.splitlines()[0])
    edited = path / "include/torch/headeronly/macros/Macros.h"
    os.chmod(edited, 0o644)
    edited.write_text("#define C10_MACROS 2\n")
    again = stage(torch, store)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [str(path), "staged 2 files"]
    assert edited.read_text() == HEADERS["include/torch/headeronly/macros/Macros.h"]


def test_a_link_among_the_headers_is_refused(tmp_path):
    """A link could point anywhere: the tree is not staged, and CMake compiles from torch's folder
    with a warning that says why (cmake/Torch.cmake)."""
    torch = fake_torch(tmp_path / "torch")
    (torch / "include/linked.h").symlink_to(tmp_path / "elsewhere.h")
    result = stage(torch, tmp_path / "store")
    assert result.returncode == 2 and result.stdout == ""
    assert "replaced by a symlink (include/linked.h)" in result.stderr, result.stderr
    assert not [p for p in (tmp_path / "store").iterdir() if not p.name.startswith(".")]


def test_a_store_others_can_write_is_refused(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    os.chmod(store, 0o777)
    result = stage(fake_torch(tmp_path / "torch"), store)
    assert result.returncode == 2 and "is not this user's alone" in result.stderr, result.stderr
    assert list(store.iterdir()) == []
