"""pytest plugin loaded by run_upstream_tests.py (``-p upstream_plugin``): records, as JUnit
properties of each test case, its parameters (``param:<name>``) and how many attention
functions of the adapter it called (``api_calls``), so the summary can classify cases by
parameter and spot tests that pass without calling anything."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        for name, value in callspec.params.items():
            item.user_properties.append((f"param:{name}", str(value)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    from vllm_flash_attn import flash_attn_interface as adapter

    adapter.reset_api_calls()
    yield
    item.user_properties.append(("api_calls", str(adapter.api_calls())))
