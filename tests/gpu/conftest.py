"""GPU tests: run on a CUDA machine with the built wheel installed; skipped elsewhere.

Every test here carries the ``gpu`` marker. Without a GPU, without the build info (the
source tree imported instead of the installed wheel) or with neither compiled module
importable, every test is skipped with the reason. A test that needs one version is
skipped with that version's reason (``version`` parameter, or gpu_helpers.require).

Run on the GPU machine against the installed wheel, not the source tree:

    python -m pytest tests/gpu -m gpu -o pythonpath= -rs
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_helpers import MEASURED, Rand, gpu_skip_reason, version_skip_reason
from kernel_log import ENV as KERNEL_LOG_ENV, KernelLog

HERE = Path(__file__).resolve().parent


def _in_this_dir(item) -> bool:
    try:
        return Path(str(getattr(item, "path", None) or item.fspath)).resolve().is_relative_to(HERE)
    except (OSError, ValueError):
        return False


def pytest_configure(config):
    """``VFA_KERNEL_LOG=<file>``: log the kernels each test launched (tests/gpu/kernel_log.py)."""
    path = os.environ.get(KERNEL_LOG_ENV)
    if path:
        config.pluginmanager.register(KernelLog(Path(path)), "vfa_kernel_log")


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if _in_this_dir(item)]
    for item in mine:
        item.add_marker(pytest.mark.gpu)
    if not mine:
        return
    reason = gpu_skip_reason()
    if reason:
        skip = pytest.mark.skip(reason=f"GPU tests: {reason}")
        for item in mine:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _needs_version(request):
    """Skip a test parametrised with ``version`` when that FA version cannot run here."""
    callspec = getattr(request.node, "callspec", None)
    version = callspec.params.get("version") if callspec is not None else None
    if version in (2, 3):
        reason = version_skip_reason(version)
        if reason:
            pytest.skip(f"FA{version} not usable: {reason}")
    yield


@pytest.fixture
def rng(request) -> Rand:
    """Fresh random inputs per test, seeded from the test id."""
    return Rand(request.node.nodeid)


@pytest.fixture
def real_machine():
    """The selector's view of the real machine, with its caches and warning memory cleared
    before and after (VLLM_FLASH_ATTN_VERSION and VFA_DEBUG_CHECKS are read afresh)."""
    from vendored_flash_attn.selection.environment import current_environment, set_environment

    set_environment(None)
    yield current_environment()
    set_environment(None)


@pytest.fixture
def op_versions(monkeypatch):
    """The FA versions whose forward op the interface called, in order (the compiled ops
    wrapped in a counter)."""
    from vendored_flash_attn import interface
    from vendored_flash_attn.selection.environment import set_environment

    calls = []
    real_forward_op = interface._forward_op

    def counted_forward_op(family):
        op = real_forward_op(family)
        if op is None:  # a family whose adapter reaches its kernels itself (FA4: fa4_launches counts those)
            return None

        def counted(*args):
            calls.append(family.version)
            return op(*args)

        return counted

    monkeypatch.setattr(interface, "_forward_op", counted_forward_op)
    set_environment(None)  # resolutions made before hold the unwrapped ops
    yield calls
    set_environment(None)  # the unwrapped ops again for the next test


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not MEASURED:
        return
    terminalreporter.section("GPU accuracy: relative L2 error of the output, max |LSE error|")
    for label, dtype, err, lse_err in MEASURED:
        lse = "-" if lse_err is None else f"{lse_err:.2e}"
        terminalreporter.write_line(f"{err:.3e}  lse {lse:>8}  {dtype:5}  {label}")
