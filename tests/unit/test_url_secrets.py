"""cmake/url_secrets.py: the one rule for what of a URL may be shown (CMake and the
compiler-cache probe both use it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("url_secrets", Path(__file__).parents[2] / "cmake/url_secrets.py")
url_secrets = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(url_secrets)


@pytest.mark.parametrize("url, shown, secrets", [
    ("https://ci:s3cret@git.example/fa.git", "https://git.example/fa.git", ["a password"]),
    ("https://ci:p@ss@git.example:8443/fa.git", "https://git.example:8443/fa.git", ["a password"]),
    ("https://ci:pa,ss@git.example/fa.git", "https://git.example/fa.git", ["a password"]),
    ("https://ghp_token@github.com/o/fa.git", "https://github.com/o/fa.git", ["a user name (often a token)"]),
    ("https://git.example/fa.git?token=s3cret", "https://git.example/fa.git", ["a query string"]),
    ("ssh://git@git.example/fa.git", "ssh://git.example/fa.git", []),
    ("git@git.example:fa.git", "git@git.example:fa.git", []),
    ("file:///srv/mirrors/fa.git", "file:///srv/mirrors/fa.git", []),
])
def test_one_url(url, shown, secrets):
    assert url_secrets.shown_url(url) == shown
    assert url_secrets.secrets_in(url) == secrets


def test_known_urls_are_scrubbed_where_git_writes_them_as_paths():
    text = "fatal: '/srv/fa.git?token=s3cret' does not appear to be a git repository (file:///srv/fa.git?token=s3cret)"
    clean = url_secrets.without_secrets(text, ["file:///srv/fa.git?token=s3cret"])
    assert "s3cret" not in clean and "'/srv/fa.git'" in clean and "file:///srv/fa.git)" in clean
