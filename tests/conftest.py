"""Shared by every test folder: tests/support on the import path, and the synthetic
upstream the build and packaging tests compile."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.synthetic_upstream import SyntheticUpstream, make_synthetic_upstream  # noqa: E402


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory) -> SyntheticUpstream:
    if shutil.which("git") is None:
        pytest.fail("git is required for the build tests (the build fetches with git)")
    return make_synthetic_upstream(tmp_path_factory.mktemp("upstream"))
