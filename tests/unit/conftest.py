"""Fixtures of the runtime unit tests; they live in runtime_fakes.py and fa4_kernels_stand_in.py,
which the tests import by those unique names (``from conftest import`` breaks when several test
folders, each with a conftest.py, are collected together)."""

from fa4_kernels_stand_in import fa4_kernels  # noqa: F401
from runtime_fakes import _real_machine_after_test, describe, fake_ops  # noqa: F401
