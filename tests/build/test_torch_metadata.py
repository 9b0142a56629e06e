"""cmake/vfa_build/sources/torch_metadata.py: what the configure step learns about torch without
importing it must be what an imported torch says."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# The script as the build runs it: through the build package's entry point.
SCRIPT = [str(Path(__file__).resolve().parents[2] / "cmake" / "vfa_build"), "sources.torch_metadata"]


def test_matches_imported_torch():
    torch = pytest.importorskip("torch")
    import torch.utils

    out = subprocess.run([sys.executable, *SCRIPT], capture_output=True, text=True, check=True)
    prefix, version, cuda = out.stdout.splitlines()
    assert Path(prefix) == Path(torch.utils.cmake_prefix_path)
    assert (Path(prefix) / "Torch" / "TorchConfig.cmake").is_file()
    assert version == torch.__version__
    assert cuda == (torch.version.cuda or "")


def test_does_not_import_torch():
    pytest.importorskip("torch")
    probe = (
        "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__');"
        "sys.stderr.write('imported' if 'torch' in sys.modules else 'clean')"
    )
    out = subprocess.run([sys.executable, "-c", probe, *SCRIPT], capture_output=True, text=True, check=True)
    assert out.stderr == "clean"


def test_missing_torch_is_a_clear_error():
    # -S: no site-packages, so no torch.
    out = subprocess.run([sys.executable, "-S", *SCRIPT], capture_output=True, text=True)
    assert out.returncode != 0
    assert "torch is not installed" in out.stderr
