"""benchmarks/wheel_compare.py: two wheels member by member, where only Python files may differ
and every compiled module must be byte-identical."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "wheel_compare.py"


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


BASE = {"pkg/_vendored_fa2_C.abi3.so": b"\x7fELF fa2", "pkg/knobs.json": b"{}",
        "pkg/fa4_cache.py": b"x = 1\n", "pkg-0.1.dist-info/RECORD": b"a"}


def _run(tmp_path: Path, after: dict[str, bytes]) -> subprocess.CompletedProcess:
    a, b = _wheel(tmp_path / "a.whl", BASE), _wheel(tmp_path / "b.whl", after)
    return subprocess.run([sys.executable, str(SCRIPT), str(a), str(b), "--json", str(tmp_path / "c.json")],
                          capture_output=True, text=True)


def test_a_moved_python_file_is_the_only_difference_allowed(tmp_path):
    after = dict(BASE)
    after["pkg/families/fa4/cache.py"] = after.pop("pkg/fa4_cache.py")
    after["pkg-0.1.dist-info/RECORD"] = b"b"
    result = _run(tmp_path, after)
    assert result.returncode == 0, result.stdout
    assert "only after   python    pkg/families/fa4/cache.py" in result.stdout
    assert "module pkg/_vendored_fa2_C.abi3.so: identical" in result.stdout


def test_a_module_that_differs_by_one_byte_fails(tmp_path):
    after = dict(BASE, **{"pkg/_vendored_fa2_C.abi3.so": b"\x7fELF fa3"})
    result = _run(tmp_path, after)
    assert result.returncode == 1 and "DIFFER" in result.stdout


def test_a_data_file_whose_bytes_changed_is_listed_but_allowed(tmp_path):
    result = _run(tmp_path, dict(BASE, **{"pkg/knobs.json": b'{"a": 1}'}))
    assert result.returncode == 0, result.stdout
    assert "differ       other     pkg/knobs.json" in result.stdout


def test_a_data_file_that_moved_fails(tmp_path):
    after = dict(BASE)
    after["pkg/declaration/knobs.json"] = after.pop("pkg/knobs.json")
    result = _run(tmp_path, after)
    assert result.returncode == 1
    assert "unexpected difference (not a Python file): pkg/knobs.json" in result.stdout
