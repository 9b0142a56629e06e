"""Fixtures of the runtime unit tests; they live in runtime_fakes.py, which the tests
import by that unique name (``from conftest import`` breaks when several test folders,
each with a conftest.py, are collected together)."""

from runtime_fakes import _real_machine_after_test, describe, fake_ops  # noqa: F401
