"""The one rule for what of a URL may be shown: no user, no password, no query, no
fragment. Used by the compiler-cache probe (compiler_cache/compiler_cache_probe.py imports
it) and by the upstream-source code in CMake (cmake/UpstreamGit.cmake runs it), so logs,
the source cache's marker and the wheel's build info all scrub alike.

    python cmake/vfa_build url_secrets url       # $VFA_URL_TEXT, one URL, scrubbed
    python cmake/vfa_build url_secrets text      # $VFA_URL_TEXT with every URL in it scrubbed, and the
                                    # secret pieces of the URLs in $VFA_URL_KNOWN (one a line)
    python cmake/vfa_build url_secrets secrets   # what $VFA_URL_TEXT (one URL) carries: one kind a line

The text comes through the environment, never the command line (`ps` shows that).

    without_secrets("https://ci:p@ss@git.example/fa.git?token=x")  ->  "https://git.example/fa.git"
    without_secrets("https://ci:ab/cd@git.example/fa.git")         ->  "https://git.example/fa.git"
    without_secrets("ci:s3cret@git.example:fa.git")                ->  "git.example:fa.git"
    secrets_in("https://ci:s3cret@git.example/fa.git")            ->  ["a password"]
    secrets_in("ssh://git@git.example/fa.git")                    ->  []   (ssh's user is no secret)

Why not urllib.parse: it ends the authority at the first '/', '?' or '#', as RFC 3986 says a
well-formed URL does, so a password written with one of them unencoded
(``https://ci:ab/cd@host/x``: what a person pastes, and what git and curl then print back
in their errors) was left in place, and ``https://ci:ab?cd@host`` showed as ``https://ci:ab``.
A scrubber must assume the worst of malformed input: here the user information is
everything up to the last '@' after ``//``, however it is written (reserved characters,
percent-encoding, an IPv6 host after it), and git's scp-like form ``user@host:path`` is a
URL too. The cost, a URL with an '@' in its path or query (``https://host/@scope/x``), is
shown with what precedes that '@' removed, and a ``-D`` holding one is refused.
"""

from __future__ import annotations

import os
import re
import sys
from collections import namedtuple

# A URL inside other text ends at white space or a quote, and does not end with a comma
# (sccache's "redis, name: redis://..., prefix: /"); a password may hold one.
URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"']*[^\s\"',]")
# git's scp-like form, [user@]host:path (no "//" after the colon), inside text: the user part
# (which may hold ':', '/' and '@') up to the '@' before the host.
SCP_IN_TEXT = re.compile(r"(?<![^\s\"'(<\[=])([^\s\"']+)@(\[[0-9A-Fa-f:.%]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):(?!//)")
SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):(.*)", re.DOTALL)
SCP_LIKE = re.compile(r"(.+)@(\[[^\]/]*\]|[^\s:/@\[\]]+):(?!//)(.*)", re.DOTALL)
# Schemes whose user name is a login, not a credential (the key authenticates); git's
# scp-like form is ssh.
SSH_SCHEMES = {"ssh", "git+ssh", "ssh+git"}
# A password shorter than this is not removed on its own from text (it would cut words);
# its "user:password@" always is.
MIN_SECRET_ALONE = 6


# One URL taken apart the conservative way (``split``): scheme ("" for a path or the scp-like
# form), userinfo (what precedes the host's '@', None when there is no '@'), rest (host and path;
# "host:path" for the scp-like form), query and fragment (None when absent), ssh (the user name is
# a login: ssh, scp-like; not a credential). collections' namedtuple, not typing's: this module is
# imported by the launcher of every compile (cmake/vfa_build/units/compile_unit.py), and typing costs it ~3 ms.
Parts = namedtuple("Parts", "scheme userinfo rest query fragment ssh")


def _query_and_fragment(rest: str) -> tuple[str, str | None, str | None]:
    fragment = query = None
    if "#" in rest:
        rest, fragment = rest.split("#", 1)
    if "?" in rest:
        rest, query = rest.split("?", 1)
    return rest, query, fragment


def split(url: str) -> Parts:
    """``scheme://userinfo@host/path?query#fragment`` where the user information runs to the
    last '@' (a password may hold '/', '?', '#', '@' unencoded); the scp-like
    ``user@host:path``; else a path (whose '?' and '#' parts are still set apart)."""
    match = SCHEME.fullmatch(url)
    if match and match.group(2).startswith("//"):
        scheme, after = match.group(1), match.group(2)[2:]
        userinfo = None
        if "@" in after:
            userinfo, after = after.rsplit("@", 1)
        rest, query, fragment = _query_and_fragment(after)
        return Parts(scheme + "://", userinfo, rest, query, fragment, scheme.lower() in SSH_SCHEMES)
    scp = SCP_LIKE.fullmatch(url)
    if scp and "/" not in scp.group(1).split(":", 1)[0]:
        rest, query, fragment = _query_and_fragment(f"{scp.group(2)}:{scp.group(3)}")
        return Parts("", scp.group(1), rest, query, fragment, True)
    rest, query, fragment = _query_and_fragment(url)
    return Parts("", None, rest, query, fragment, False)


def shown_url(url: str) -> str:
    """One URL without user, password, query and fragment."""
    parts = split(url)
    return parts.scheme + parts.rest


def secret_parts(url: str) -> list[str]:
    """The literal pieces of one URL that are secret, as they may appear in other text:
    "user:password@" (also percent-decoded), the password alone (when long enough not to
    be a word), "?query", "#fragment"."""
    from urllib.parse import unquote  # here, not at the top: see Parts
    parts = split(url)
    found = []
    if parts.userinfo is not None and not (parts.ssh and ":" not in parts.userinfo):
        for info in dict.fromkeys((parts.userinfo, unquote(parts.userinfo))):
            found.append(info + "@")
            password = info.split(":", 1)[1] if ":" in info else ""
            if len(password) >= MIN_SECRET_ALONE:
                found.append(password)
    if parts.query is not None:
        found.append("?" + parts.query)
    if parts.fragment is not None:
        found.append("#" + parts.fragment)
    return found


def without_secrets(text: str, known: tuple[str, ...] | list[str] = ()) -> str:
    """Every URL in <text> as shown_url() shows it. The secret pieces of the <known>
    URLs go wherever they appear, also where a URL is not recognisable as one
    (git writes a file:// URL as a bare path, a password may hold a comma)."""
    pieces = sorted({piece for url in known for piece in secret_parts(url)}, key=len, reverse=True)
    for piece in pieces:
        text = text.replace(piece, "")
    text = URL_IN_TEXT.sub(lambda m: shown_url(m.group(0)), text)
    return SCP_IN_TEXT.sub(lambda m: m.group(0)[len(m.group(1)) + 1:], text)


def without_env_secrets(text: str, environ=None) -> str:
    """without_secrets(<text>) with the URLs of the environment (SCCACHE_REDIS_ENDPOINT, a
    scheduler URL ...) known: what the build writes into its logs and prints, where an error
    of sccache or of a compiler may quote one, however malformed."""
    environ = os.environ if environ is None else environ
    return without_secrets(text, [value for value in environ.values() if "://" in value or "@" in value])


def secrets_in(url: str) -> list[str]:
    """What of one URL is a secret: a password, a user name that is a token (any
    scheme but ssh: GitHub takes a token as the user name), a query string, a fragment."""
    parts = split(url)
    found = []
    if parts.userinfo is not None:
        if ":" in parts.userinfo:
            found.append("a password")
        elif not parts.ssh:
            found.append("a user name (often a token)")
    if parts.query is not None:
        found.append("a query string")
    if parts.fragment is not None:
        found.append("a fragment")
    return found


def main(argv: list[str]) -> int:
    text = os.environ.get("VFA_URL_TEXT", "")
    if argv[1:] == ["url"]:
        sys.stdout.write(shown_url(text))
    elif argv[1:] == ["text"]:
        known = [u for u in os.environ.get("VFA_URL_KNOWN", "").split("\n") if u]
        sys.stdout.write(without_secrets(text, known))
    elif argv[1:] == ["secrets"]:
        sys.stdout.write("\n".join(secrets_in(text)))
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
