"""The fast environment read the hot path uses answers like os.environ.get."""

from __future__ import annotations

import os

from vendored_flash_attn.selection.environment import SystemEnvironment, _read_environ

NAME = "VFA_TEST_ENVIRON_READ"


def test_reads_like_os_environ_get(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert _read_environ(NAME) is None
    monkeypatch.setenv(NAME, "3")
    assert _read_environ(NAME) == "3"
    monkeypatch.setenv(NAME, "é-2")  # non-ASCII round-trips
    assert _read_environ(NAME) == "é-2" == os.environ.get(NAME)
    os.environ.update({NAME: "2"})
    assert _read_environ(NAME) == "2"
    monkeypatch.delenv(NAME)
    assert _read_environ(NAME) is None


def test_system_environment_uses_it(monkeypatch):
    monkeypatch.setenv(NAME, "x")
    assert SystemEnvironment().getenv(NAME) == "x"
    monkeypatch.delenv(NAME)
    assert SystemEnvironment().getenv(NAME) is None
