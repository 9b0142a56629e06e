"""The configure points every compile at torch's headers staged by their content
(cmake/Torch.cmake, cmake/vfa_build/sources/torch_headers.py: issue 38), and compiles from torch's own folder,
with a warning that says why, where it cannot stage them."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from support.cmake_runner import PROJECT, clean_env, compile_commands, configured, run

MINIMAL = {"VFA_PRESET": "minimal", "VFA_BUILD_FA4": "off"}


def torch_root() -> Path:
    """<site-packages>/torch as the build finds it (cmake/vfa_build/sources/torch_metadata.py: <root>/share/cmake)."""
    out = run([sys.executable, str(PROJECT / "cmake" / "vfa_build"), "sources.torch_metadata"])
    assert out.returncode == 0, out.output
    return Path(out.stdout.splitlines()[0]).parents[1]


def test_every_compile_reads_torch_headers_from_the_staged_copy(tmp_path, sources):
    user_cache = tmp_path / "user-cache"
    build, result = configured(tmp_path, sources, env=clean_env(XDG_CACHE_HOME=str(user_cache)), **MINIMAL)
    assert result.returncode == 0, result.output
    (staged,) = re.findall(r"torch's headers: (\S+)/include \(staged \d+ files, by content", result.output)
    assert Path(staged).parent == user_cache / "vendored-flash-attn" / "staged", staged
    assert Path(staged).name.startswith("torch-") and (Path(staged) / "include/torch").is_dir()
    commands = [c["command"] for c in compile_commands(build)]
    assert len(commands) == 22
    for command in commands:
        assert f"-isystem {staged}/include " in command and \
            f"-isystem {staged}/include/torch/csrc/api/include " in command, command
        assert str(torch_root()) not in command, command


def test_a_store_others_can_write_stops_the_configure_before_anything_is_staged(tmp_path, sources):
    # The store holds the staged upstream sources (issue 33) beside torch's headers (issue 38):
    # one that others can write stops the configure for the sources, naming the store and the
    # fix, and nothing, torch's headers included, is staged there. (Where torch's headers alone
    # cannot be staged, the configure compiles from torch's own folder with a warning:
    # tests/unit/test_torch_headers.py holds torch_headers.py's refusal of such a store.)
    user_cache = tmp_path / "user-cache"
    store = user_cache / "vendored-flash-attn" / "staged"
    store.mkdir(parents=True)
    os.chmod(store, 0o777)
    build, result = configured(tmp_path, sources, env=clean_env(XDG_CACHE_HOME=str(user_cache)), **MINIMAL)
    assert result.returncode != 0, result.output
    text = " ".join(result.output.split())
    assert "is not this user's alone: group or others may write it (mode 777)" in text, result.output
    assert "chmod go-w" in text, result.output
    assert list(store.iterdir()) == []
