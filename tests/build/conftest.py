from __future__ import annotations

from pathlib import Path

import pytest

from support.cmake_runner import fetch_sources




def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.build)




@pytest.fixture
def pin(synthetic, tmp_path) -> Path:
    return synthetic.write_pin(tmp_path / "pin.json")


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "source-cache"


@pytest.fixture(scope="module")
def sources(synthetic, tmp_path_factory):
    """A pin and a filled source cache shared by a module's configures."""
    root = tmp_path_factory.mktemp("configure")
    pin = synthetic.write_pin(root / "pin.json")
    cache = root / "cache"
    result = fetch_sources({"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(cache)})
    assert result.returncode == 0, result.output
    return {"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(cache), "VFA_COMPILER_CACHE": "off"}
