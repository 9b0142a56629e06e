"""The one rule for what of a URL may be shown: no user, no password, no query, no
fragment. Used by the compiler-cache probe (cmake/compiler_cache_probe.py imports it)
and by the upstream-source code in CMake (cmake/UpstreamFetch.cmake runs it), so logs,
the source cache's marker and the wheel's build info all scrub alike.

    python url_secrets.py url       # $VFA_URL_TEXT, one URL, scrubbed
    python url_secrets.py text      # $VFA_URL_TEXT with every URL in it scrubbed, and the
                                    # secret pieces of the URLs in $VFA_URL_KNOWN (one a line)
    python url_secrets.py secrets   # what $VFA_URL_TEXT (one URL) carries: one kind a line

The text comes through the environment, never the command line (`ps` shows that).

    without_secrets("https://ci:p@ss@git.example/fa.git?token=x")  ->  "https://git.example/fa.git"
    secrets_in("https://ci:s3cret@git.example/fa.git")            ->  ["a password"]
    secrets_in("ssh://git@git.example/fa.git")                    ->  []   (ssh's user is no secret)
"""

from __future__ import annotations

import os
import re
import sys
from urllib.parse import urlsplit, urlunsplit

# A URL inside other text ends at white space, a quote or a comma (sccache's
# "redis, name: redis://..., prefix: /").
URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s,\"']+")
# Schemes whose user name is a login, not a credential (the key authenticates).
SSH_SCHEMES = {"ssh", "git+ssh", "ssh+git"}


def shown_url(url: str) -> str:
    """One URL without user, password, query and fragment. A password may hold '@':
    the host is what follows the last '@' of the authority."""
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced '[' in the host
        return "<a URL that could not be parsed>"
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def secret_parts(url: str) -> list[str]:
    """The literal pieces of one URL that are secret: "user:password@", "?query", "#fragment"."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return [url]
    found = []
    if "@" in parts.netloc and parts.scheme.lower() not in SSH_SCHEMES:
        found.append(parts.netloc.rsplit("@", 1)[0] + "@")
    if parts.query:
        found.append("?" + parts.query)
    if parts.fragment:
        found.append("#" + parts.fragment)
    return found


def without_secrets(text: str, known: tuple[str, ...] | list[str] = ()) -> str:
    """Every URL in <text> as shown_url() shows it. The secret pieces of the <known>
    URLs go wherever they appear, also where a URL is not recognisable as one
    (git writes a file:// URL as a bare path, a password may hold a comma)."""
    for url in known:
        for piece in secret_parts(url):
            text = text.replace(piece, "")
    return URL_IN_TEXT.sub(lambda m: shown_url(m.group(0)), text)


def secrets_in(url: str) -> list[str]:
    """What of one URL is a secret: a password, a user name that is a token (any
    scheme but ssh: GitHub takes a token as the user name), a query string."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return ["a URL that could not be parsed"]
    found = []
    if parts.password is not None:
        found.append("a password")
    elif "@" in parts.netloc and parts.scheme.lower() not in SSH_SCHEMES:
        found.append("a user name (often a token)")
    if parts.query:
        found.append("a query string")
    if parts.fragment:
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
