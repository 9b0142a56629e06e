"""pytest plugin: the CUDA kernels each GPU test launched (tests/gpu/kernel_coverage.py).

tests/gpu/conftest.py registers it when ``VFA_KERNEL_LOG`` names a file. Each test's call
runs under torch.profiler (CUDA activity only: the kernels, named as CUPTI reports them,
demangled) and one JSON line per test is appended to that file:

    {"test": "<node id>", "outcome": "passed" | "failed" | "skipped", "kernels": [...]}

A test skipped before its call gets a line with no kernels, so the log lists every test. A
test that names the unit it must run (``record_property("kernel_file", "<unit>.cu")``, as
test_kernel_files_gpu.py does) gets ``"expects": "<unit>.cu"``; kernel_coverage.py checks it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ENV = "VFA_KERNEL_LOG"
EXPECTS = "kernel_file"  # the record_property name of the unit a test must run


def kernel_names(events) -> list[str]:
    """The GPU kernels among profiler events: events on a CUDA device (torch 2.x lists
    each kernel as one), and the kernels attached to a CPU op (older layout)."""
    names = set()
    for event in events or ():
        if str(getattr(event, "device_type", "")).rsplit(".", 1)[-1] == "CUDA":
            names.add(event.name)
        for kernel in getattr(event, "kernels", None) or ():
            names.add(getattr(kernel, "name", str(kernel)))
    return sorted(names)


class KernelLog:
    def __init__(self, path: Path):
        self.path = Path(path)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        import torch
        from torch.profiler import ProfilerActivity, profile

        if not torch.cuda.is_available():  # nothing to profile (torch refuses a CUDA-only profiler)
            yield
            return
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            yield
            try:  # the profiler sees a kernel once it has finished
                torch.cuda.synchronize()
            except RuntimeError:
                pass  # a test that broke the context fails on its own
        item.stash[_KERNELS] = kernel_names(prof.events())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if report.when == "call" or (report.when == "setup" and not report.passed):
            record = {"test": item.nodeid, "outcome": report.outcome,
                      "kernels": item.stash.get(_KERNELS, [])}
            expects = [value for name, value in item.user_properties if name == EXPECTS]
            if expects:
                record["expects"] = expects[-1]
            with self.path.open("a", encoding="utf-8") as log:
                log.write(json.dumps(record) + "\n")


_KERNELS = pytest.StashKey[list]()
