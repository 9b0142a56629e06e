from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.synthetic_upstream import SyntheticUpstream, make_synthetic_upstream  # noqa: E402


def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.build)


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory) -> SyntheticUpstream:
    if shutil.which("git") is None:
        pytest.fail("git is required for the build tests (the build fetches with git)")
    return make_synthetic_upstream(tmp_path_factory.mktemp("upstream"))


@pytest.fixture
def pin(synthetic, tmp_path) -> Path:
    return synthetic.write_pin(tmp_path / "pin.json")


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "source-cache"
