from __future__ import annotations

from pathlib import Path

import pytest




def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker(pytest.mark.build)




@pytest.fixture
def pin(synthetic, tmp_path) -> Path:
    return synthetic.write_pin(tmp_path / "pin.json")


@pytest.fixture
def cache(tmp_path) -> Path:
    return tmp_path / "source-cache"
