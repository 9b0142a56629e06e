"""cmake/vfa_build/url_secrets.py: the one rule for what of a URL may be shown (CMake and the
compiler-cache probe both use it), and CMake's use of it failing closed: when its Python
cannot run, nothing of the URL is shown and a -D holding one is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cmake_runner import clean_env, run, tool
from vfa_build import url_secrets

PROJECT = Path(__file__).resolve().parents[2]

PASSWORD = ["a password"]
TOKEN = ["a user name (often a token)"]

# (id, url, shown, secrets): every way a credential can be written into a URL. The first
# column of each form that urllib.parse (which the scrubber used) got wrong is marked.
URLS = [
    ("password", "https://ci:s3cret@git.example/fa.git", "https://git.example/fa.git", PASSWORD),
    ("password-with-at", "https://ci:p@ss@git.example:8443/fa.git", "https://git.example:8443/fa.git", PASSWORD),
    ("password-with-comma", "https://ci:pa,ss@git.example/fa.git", "https://git.example/fa.git", PASSWORD),
    ("token-as-user", "https://ghp_token@github.com/o/fa.git", "https://github.com/o/fa.git", TOKEN),
    ("query", "https://git.example/fa.git?token=s3cret", "https://git.example/fa.git", ["a query string"]),
    ("fragment", "https://git.example/fa.git#s3cret", "https://git.example/fa.git", ["a fragment"]),
    ("ssh-login", "ssh://git@git.example/fa.git", "ssh://git.example/fa.git", []),
    ("ssh-password", "ssh://git:s3cret@git.example/fa.git", "ssh://git.example/fa.git", PASSWORD),
    ("file", "file:///srv/mirrors/fa.git", "file:///srv/mirrors/fa.git", []),
    ("no-credentials", "https://git.example:8443/o/fa.git", "https://git.example:8443/o/fa.git", []),
    # Reserved characters left unencoded in the password (urllib ended the host at the first of them):
    ("slash-in-password", "https://ci:ab/cd@host/x", "https://host/x", PASSWORD),
    ("question-mark-in-password", "https://ci:ab?cd@host/x", "https://host/x", PASSWORD),
    ("hash-in-password", "https://ci:ab#cd@host/x", "https://host/x", PASSWORD),
    ("every-reserved-character", "https://ci:a/b?c#d@e:f@host:8443/x.git?q=1#top", "https://host:8443/x.git",
     PASSWORD + ["a query string", "a fragment"]),
    ("slash-in-token", "https://tok/en+x==@host/x", "https://host/x", TOKEN),
    # Percent-encoding, as a URL should carry them
    ("percent-encoded-password", "https://ci:ab%2Fcd%40ef@host/x", "https://host/x", PASSWORD),
    ("percent-encoded-user", "https://%63i%3Atoken@host/x", "https://host/x", TOKEN),
    # git's scp-like form: user@host:path (the user is an ssh login unless it carries a password)
    ("scp-login", "git@git.example:fa.git", "git.example:fa.git", []),
    ("scp-password", "ci:s3cret@git.example:o/fa.git", "git.example:o/fa.git", PASSWORD),
    ("scp-password-with-reserved", "ci:a/b@c@git.example:o/fa.git", "git.example:o/fa.git", PASSWORD),
    ("scp-ipv6", "ci:s3cret@[2001:db8::1]:o/fa.git", "[2001:db8::1]:o/fa.git", PASSWORD),
    # IPv6 hosts
    ("ipv6", "https://ci:s3cret@[2001:db8::1]:8443/fa.git", "https://[2001:db8::1]:8443/fa.git", PASSWORD),
    ("ipv6-zone", "https://ci:s3cret@[fe80::1%25eth0]/fa.git", "https://[fe80::1%25eth0]/fa.git", PASSWORD),
    ("ipv6-reserved-password", "https://ci:a/b@[::1]/fa.git", "https://[::1]/fa.git", PASSWORD),
    ("ipv6-unbalanced", "https://ci:s3cret@[::1/fa.git", "https://[::1/fa.git", PASSWORD),
    ("ipv6-no-credentials", "https://[::1]:8443/fa.git", "https://[::1]:8443/fa.git", []),
    # A local mirror path (git also writes file:// URLs back as bare paths)
    ("path", "/srv/mirrors/fa.git", "/srv/mirrors/fa.git", []),
    ("path-with-query", "/srv/fa.git?token=s3cret", "/srv/fa.git", ["a query string"]),
    ("path-with-at", "/home/me@corp/fa.git", "/home/me@corp/fa.git", []),
]


@pytest.mark.parametrize("url, shown, secrets", [u[1:] for u in URLS], ids=[u[0] for u in URLS])
def test_one_url(url, shown, secrets):
    assert url_secrets.shown_url(url) == shown
    assert url_secrets.secrets_in(url) == secrets
    # Inside other text too (git's and sccache's messages): a URL with a scheme or git's
    # scp-like form is recognised as one; any form, once it is a URL this configure used.
    text = f"fatal: unable to access '{url}': The requested URL returned error: 403"
    if not url.startswith("/"):
        assert url_secrets.without_secrets(text) == text.replace(url, shown)
    assert url_secrets.without_secrets(text, [url]) == text.replace(url, shown)


@pytest.mark.parametrize("url", [u[1] for u in URLS if u[3]], ids=[u[0] for u in URLS if u[3]])
def test_no_secret_survives_in_any_mode(url):
    secret_words = {"s3cret", "p@ss", "pa,ss", "ghp_token", "ab/cd", "ab?cd", "ab#cd", "tok/en", "ab%2Fcd", "%63i",
                    "a/b", "token=", "q=1"}
    words = [w for w in secret_words if w in url]
    assert words, url  # the table's secrets are ones this test knows
    shown_forms = [url_secrets.shown_url(url), url_secrets.without_secrets(f"see {url} here", [url])]
    if not url.startswith("/"):  # a bare path is a URL only once known
        shown_forms.append(url_secrets.without_secrets(f"see {url} here"))
    for shown in shown_forms:
        assert not [w for w in words if w in shown], shown


def test_known_urls_are_scrubbed_where_git_writes_them_as_paths():
    text = "fatal: '/srv/fa.git?token=s3cret' does not appear to be a git repository (file:///srv/fa.git?token=s3cret)"
    clean = url_secrets.without_secrets(text, ["file:///srv/fa.git?token=s3cret"])
    assert "s3cret" not in clean and "'/srv/fa.git'" in clean and "file:///srv/fa.git)" in clean


def test_a_known_password_goes_however_the_text_writes_it():
    # curl and git print a URL back percent-decoded, or the password on its own.
    url = "https://ci:s3cret%2Fpass@127.0.0.1:9/cutlass.git"
    text = ("error: https://ci:s3cret/pass@127.0.0.1:9/cutlass.git: Port number was not a decimal number; "
            "password s3cret%2Fpass rejected; user ci:s3cret/pass@ again")
    clean = url_secrets.without_secrets(text, [url])
    assert "s3cret" not in clean, clean


# --- CMake's callers: cmake/UpstreamGit.cmake runs the scrubber, and fails closed ----------

def _cmake_ask(tmp_path, url: str, python: str | None = None):
    """vfa_url_secrets (url, secrets) and the -D refusal (vfa_refuse_credentials_in_a_definition)
    on <url> given as -DFLASH_ATTN_MIRROR, in script mode; ``python`` replaces the build's."""
    script = tmp_path / "ask.cmake"
    lines = [f'include("{PROJECT}/cmake/UpstreamSources.cmake")']
    if python is not None:
        lines.append(f'set(Python_EXECUTABLE "{python}")')
    lines += ['vfa_option(FLASH_ATTN_MIRROR)',
              'vfa_url_secrets(shown url "${FLASH_ATTN_MIRROR}")',
              'vfa_url_secrets(secrets secrets "${FLASH_ATTN_MIRROR}")',
              'vfa_refuse_credentials_in_a_definition(refusal FLASH_ATTN_MIRROR)',
              'message(NOTICE "SHOWN=[${shown}]")',
              'message(NOTICE "SECRETS=[${secrets}]")',
              'message(NOTICE "REFUSED=[${refusal}]")']
    script.write_text("\n".join(lines) + "\n")
    result = run([tool("cmake"), f"-DFLASH_ATTN_MIRROR={url}", "-P", str(script)], env=clean_env())
    assert result.returncode == 0, result.output
    answers = {}
    for line in result.output.splitlines():
        for key in ("SHOWN", "SECRETS", "REFUSED"):
            if line.startswith(key + "=["):
                answers[key] = line[len(key) + 2:].rstrip("]")
    return answers, result.output


# The forms urllib missed, and a plain one: the -D refusal holds for each.
REFUSED_FORMS = ["https://ci:ab/cd@git.example/fa.git", "https://ci:ab?cd@git.example/fa.git",
                 "https://ci:ab#cd@git.example/fa.git", "ci:s3cret@git.example:fa.git",
                 "https://ci:s3cret@[2001:db8::1]/fa.git", "https://ci:s3cret@git.example/fa.git"]


@pytest.mark.parametrize("url", REFUSED_FORMS)
def test_a_definition_with_credentials_is_refused_however_they_are_written(tmp_path, url):
    answers, output = _cmake_ask(tmp_path, url)
    assert "a password" in answers["SECRETS"], output
    assert "FLASH_ATTN_MIRROR was given as a CMake definition" in answers["REFUSED"], output
    assert not [w for w in ("ab/cd", "ab?cd", "ab#cd", "s3cret") if w in answers["SHOWN"] + answers["REFUSED"]]


@pytest.mark.parametrize("python", ["/nonexistent/python3", "/bin/false"], ids=["missing", "failing"])
def test_without_a_working_python_nothing_is_shown_and_a_definition_is_refused(tmp_path, python):
    """Fail closed: the secrets check once answered "none" when its Python could not run,
    so a -D with a password passed; and a URL that cannot be scrubbed is never shown."""
    answers, output = _cmake_ask(tmp_path, "https://ci:s3cret@git.example/fa.git", python)
    assert "FLASH_ATTN_MIRROR was given as a CMake definition" in answers["REFUSED"], output
    assert "could not be checked" in answers["SECRETS"], output
    assert "s3cret" not in answers["SHOWN"] + answers["REFUSED"] and "not shown" in answers["SHOWN"]


def test_a_definition_without_credentials_is_accepted_without_asking_python(tmp_path):
    # No '@', '?' or '#': nothing that can be a credential, so no Python is needed (or run).
    answers, _ = _cmake_ask(tmp_path, "https://git.example/fa.git", "/nonexistent/python3")
    assert answers == {"SHOWN": "https://git.example/fa.git", "SECRETS": "", "REFUSED": ""}


def test_a_crash_of_the_compiler_cache_probe_is_scrubbed(tmp_path, monkeypatch, capsys):
    """cmake/CompilerCache.cmake prints the probe's output when it fails: a crash whose
    message quotes an SCCACHE_* URL must not carry its credentials there."""
    import sys

    from vfa_build.compiler_cache import compiler_cache_probe

    endpoint = "redis://cache:s3cret/token@redis.example:6379/0"
    monkeypatch.setenv("SCCACHE_REDIS_ENDPOINT", endpoint)

    def crash(args):
        raise RuntimeError(f"cannot reach {endpoint} (or {endpoint.replace('://', '%3A%2F%2F')})")

    monkeypatch.setattr(compiler_cache_probe, "probe", crash)
    status = compiler_cache_probe.main_scrubbed(["probe", "--sccache", "x", "--cxx", "c++", "--work", str(tmp_path),
                                                "--out", str(tmp_path / "result.json")])
    err = capsys.readouterr().err
    assert status == 1 and "RuntimeError: cannot reach redis://redis.example:6379/0" in err, err
    assert "s3cret" not in err and sys.modules["vfa_build.compiler_cache.compiler_cache_probe"] is compiler_cache_probe
