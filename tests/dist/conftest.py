"""tests/dist: packaging and release: version scheme, wheel checks, cibuildwheel
config, Buildkite pipeline, sdist, and the shared (Redis) compiler cache.

Every test here is marked ``dist``; the ones that run cmake/nvcc are also
marked ``build`` (they reuse tests/support, like tests/build)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest



HEAVY = {"test_sdist.py", "test_shared_cache.py", "test_sccache_dist.py", "test_dist_trust.py"}


def pytest_configure(config):
    config.addinivalue_line("markers", "dist: packaging and release tests (tests/dist)")


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath))
        if here in path.parents:
            item.add_marker(pytest.mark.dist)
            if path.name in HEAVY:
                item.add_marker(pytest.mark.build)





