"""FA4's ahead-of-time kernel cache: kernels shipped in the wheel, then a writable user cache.

Upstream's FA4 compiles each kernel at first use (2-6 s) and can keep the result on disk
(``cache_utils.JITPersistentCache``: ``<dir>/<fingerprint>/<kind>/<sha256(key)>.o`` beside a
``.lock``). docs/fa4.md §3 holds what was measured; what this module does about it:

* **Two levels.** A lookup tries the kernels shipped inside the installed package
  (``vendored_flash_attn/_fa4/kernels``), then a user cache
  (``$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``, upstream's knob, else
  ``$XDG_CACHE_HOME/vendored-flash-attn/fa4``, else ``~/.cache/vendored-flash-attn/fa4``);
  a kernel compiled at run time is exported to the user cache only. Neither level takes a
  lock: shipped files are immutable, user-cache files appear whole (renamed into place).
  ``VFA_FA4_SHIPPED_KERNELS=off`` ignores the shipped kernels (the user cache alone serves:
  how ``benchmarks/first_call.py`` measures a JIT compile against a wheel that ships kernels).
* **Read-only install.** Upstream's loader opens ``<hash>.lock`` with ``O_CREAT`` even to
  read, which fails on a read-only site-packages. Shipped kernels are immutable files, so
  they are loaded without any lock or write.
* **The DSL's CUDA flavour is part of the key.** The cu12 and cu13 builds of
  ``nvidia-cutlass-dsl`` share one version string, so upstream's fingerprint cannot tell
  them apart, yet their cubins differ (measured). Every path holds the flavour the process
  loaded, ``cu<major>.<minor>`` of ``cutlass.CUDA_VERSION``, above upstream's fingerprint:
  ``<root>/<flavour>/<fingerprint>/<kind>/<hash>.o``. ``cmake/vfa_build/fa4/precompile.py compile``
  writes that layout with the same functions.
* Upstream's fingerprint already covers the sources, Python minor, cutlass and tvm-ffi
  versions, and the key hash is upstream's own ``_key_to_hash``: nothing is recomputed here.
* **One copy of each kernel for every Python.** Upstream's fingerprint holds the Python
  minor, yet a kernel's bytes do not depend on it (measured: all of ``minimal``'s, four
  Pythons). The build compiles with one Python; for each other one it ships
  ``<flavour>/<that Python's fingerprint>/aliases.json``: that Python's key hashes, per
  kind, mapped to the compiled Python's files (``{"same_as": <fingerprint>, "kinds": {kind:
  {hash: hash}}}``), written only after a kernel compiled by that Python was found
  byte-identical (``cmake/vfa_build/fa4/precompile.py compile --share``). Hashes are checked as
  such, so an index can only name files of the shipped tree.
* **The user cache is code** (fa4/user_cache.py). A kernel object is native code the process
  runs, so the user cache is used only where nobody but this user could have written it
  (``UserKernelDir``): an absolute root, owned by this process's user and not writable by group or others, and
  every folder and file under it the same and no symbolic link, each checked on the open
  file descriptor that is then read (no window between the check and the load; a root
  reached through a symbolic link is followed once, when FA4 loads). Anything
  else is not loaded: the kernel compiles in memory, with one warning saying why. Exports
  go to a temporary file in the same folder, fsynced and renamed into place, so a process
  killed mid-export leaves nothing a later one loads; a file that fails to load is removed
  and its kernel compiled again, with one warning (never an exception). The wheel's shipped
  kernels are the install's own files and are trusted as the package's code is.
* **On by default** (``VFA_FA4_USER_CACHE``; upstream's own disk cache is opt-in because it
  lives in a shared ``/tmp`` and writes in place): a serving process restarted on the same
  machine, or a second worker, then loads the kernels the wheel does not ship instead of
  compiling each again (seconds apiece). A home that is read-only or shared, or a folder
  that fails the checks, costs a compile per process with one line naming the fix.

Nothing here imports cutlass at import time. ``install(interface, cache_utils, cutlass)``
runs at first FA4 use (fa4/adapter.py), after the dependency check.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from importlib import resources
from pathlib import Path

from .user_cache import (USER_CACHE_DIR_ENV, KernelLoadFailed, UntrustedEntry, UserKernelDir,
                             checked_user_root)

# Upstream's cache kinds of the forward entry points FA4's adapter reaches, by the
# interface attribute whose ``compile_cache`` they are (interface.py at the pin).
FORWARD_CACHES = {"_flash_attn_fwd": "fwd", "_flash_attn_fwd_combine": "fwd_combine"}
SHIPPED_DIR = "kernels"  # inside vendored_flash_attn/_fa4
# <root>/<flavour>/<fingerprint>/ALIASES_FILE: a Python whose kernels are another's files
ALIASES_FILE = "aliases.json"
# FA4's build record, beside the shipped kernels' folder (_fa4/build_info.json): each Python's
# index is verified against the sha256 its run recorded.
RECORD_FILE = "build_info.json"
_HASH = re.compile(r"[0-9a-f]{64}")
# "off" (or 0/false/no): ignore the shipped kernels, so every kernel comes from the user cache
# or compiles (first-call benchmarks of the JIT path; ruling the shipped kernels out).
SHIPPED_KERNELS_ENV = "VFA_FA4_SHIPPED_KERNELS"
# "off": no user cache at all; kernels the wheel does not ship compile in every process.
USER_CACHE_ENV = "VFA_FA4_USER_CACHE"


def flavour_name(cuda_version) -> str:
    """``cu12.9`` for a version with ``major``/``minor`` (``cutlass.CUDA_VERSION``)."""
    return f"cu{int(cuda_version.major)}.{int(cuda_version.minor)}"


def dsl_flavour(cutlass_module) -> str:
    """The CUDA flavour of the DSL this process loaded (read after ``import cutlass``: the DSL
    picks its half from the driver at import)."""
    return flavour_name(cutlass_module.CUDA_VERSION)


def kernel_dir(root: Path, flavour: str, fingerprint: str, kind: str) -> Path:
    """Where kernels of one kind live under a cache root (shipped or user)."""
    return Path(root) / flavour / fingerprint / kind


def kernel_files(root: Path) -> dict[str, int]:
    """Every kernel file under a cache root (``*.o``, at any depth), by its path relative to
    the root, with its size; {} when the root is not a folder. The build's precompile and
    the installed wheel's check compare two of these to see what a call compiled."""
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*.o")} if root.is_dir() else {}


def parse_aliases(text: str | bytes) -> tuple[str, dict[str, dict[str, str]]]:
    """An index as the build writes it (aliases_text): ``(the fingerprint whose files it names,
    {kind: {this Python's key hash: that file's key hash}})``. ValueError for anything else:
    every fingerprint and hash must be 64 hex digits, so an index can only name files of the
    shipped tree."""
    try:
        data = json.loads(text)
        same_as, kinds = data["same_as"], data["kinds"]
        table = {str(kind): dict(entries) for kind, entries in kinds.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not an index of FA4 kernels: {exc}") from None
    if not isinstance(same_as, str) or not _HASH.fullmatch(same_as) or not all(
            isinstance(a, str) and isinstance(b, str) and _HASH.fullmatch(a) and _HASH.fullmatch(b)
            for entries in table.values() for a, b in entries.items()):
        raise ValueError("a fingerprint or key hash is not 64 hex digits")
    return same_as, table


def aliases_text(same_as: str, python: str, kinds: dict[str, dict[str, str]]) -> str:
    """The index parse_aliases reads (``python``: the Python it serves, for people)."""
    return json.dumps({"same_as": same_as, "python": python, "kinds": kinds}, indent=1, sort_keys=True) + "\n"


def recorded_index_digest(root: Path, flavour: str, fingerprint: str) -> str:
    """The sha256 FA4's build record (``RECORD_FILE`` beside the shipped kernels' folder) gives
    for the index of ``fingerprint`` (its last run's, the index growing with each arch), or ""
    when it gives none."""
    try:
        runs = json.loads((Path(root).parent / RECORD_FILE).read_text(encoding="utf-8"))["precompile"]["runs"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    digest = ""
    for run in runs if isinstance(runs, list) else ():
        if (isinstance(run, dict) and run.get("flavour") == flavour and run.get("fingerprint") == fingerprint
                and isinstance(run.get("same_as"), dict)):
            digest = str(run["same_as"].get("index_sha256") or digest)
    return digest


def read_aliases(root: Path, flavour: str, fingerprint: str, expected_sha256: str | None = None
                 ) -> dict[str, dict[str, Path]]:
    """This Python's shipped kernels that are another Python's files: ``{kind: {key hash:
    .o path}}`` from ``<root>/<flavour>/<fingerprint>/aliases.json`` ({} when there is none).
    An index that is not what the build writes, or (``expected_sha256`` given: the run time
    passes the build record's, recorded_index_digest) not the one the build recorded — another
    build's, a swapped one, whose entries could name another kernel's file — is ignored with a
    warning: its kernels then compile at first use."""
    path = Path(root) / flavour / fingerprint / ALIASES_FILE
    if not path.is_file():
        return {}
    try:
        data = path.read_bytes()
        if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
            raise ValueError("it is not the index FA4's build record " + (
                f"names (sha256 {expected_sha256[:12]}...)" if expected_sha256 else "lists (it names none)"))
        same_as, kinds = parse_aliases(data)
    except (OSError, ValueError) as exc:
        warnings.warn(f"FA4's kernel index {path} is damaged ({exc}): the kernels it lists compile at first "
                      "use. Reinstall vendored-flash-attn.", RuntimeWarning, stacklevel=2)
        return {}
    return {kind: {own: kernel_dir(root, flavour, same_as, kind) / f"{theirs}.o" for own, theirs in table.items()}
            for kind, table in kinds.items()}


class NoUserCacheHome(ValueError):
    """No folder for the user cache: neither knob names one and HOME is unusable."""


def user_cache_root(environ=None) -> Path:
    """Where the user cache is asked to live: ``$FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/vendored-flash-attn/fa4`` (a relative ``XDG_CACHE_HOME`` is ignored, as
    the XDG spec says), else ``~/.cache/vendored-flash-attn/fa4``. Whether it may be used is
    ``checked_user_root``'s answer. Raises NoUserCacheHome where it would be under HOME and HOME
    is empty, relative or ``/`` (Python's ``~`` makes an empty HOME ``/``: the cache would wander
    to ``/.cache``)."""
    environ = os.environ if environ is None else environ
    if environ.get(USER_CACHE_DIR_ENV):
        return Path(environ[USER_CACHE_DIR_ENV])
    xdg = environ.get("XDG_CACHE_HOME") or ""
    if os.path.isabs(xdg):
        base = xdg
    else:
        home = environ["HOME"] if "HOME" in environ else os.path.expanduser("~")  # unset: the password database
        if not os.path.isabs(home) or not home.strip("/"):
            raise NoUserCacheHome(
                f"HOME is {home!r}, so there is no folder of yours for it: set HOME to your home folder, or "
                f"{USER_CACHE_DIR_ENV} (or XDG_CACHE_HOME) to an absolute folder only you can write")
        base = os.path.join(home, ".cache")
    return Path(base) / "vendored-flash-attn" / "fa4"  # a folder's name (README, docs): this is FA4's cache


def _bool_knob(name: str, default: bool, environ=None) -> bool:
    """A runtime bool knob in the words every knob takes (cmake/knobs.json); any other value
    keeps the default, with one warning naming the valid words."""
    from ...declaration.knob_values import BOOL_OFF, BOOL_ON, BOOL_WORDS_TEXT

    environ = os.environ if environ is None else environ
    value = environ.get(name, "").strip().lower()
    if value not in ("", *BOOL_ON, *BOOL_OFF):
        warnings.warn(f"{name}={value!r} is not a valid value; it stays {'on' if default else 'off'}. "
                      f"Valid values: {BOOL_WORDS_TEXT}.", RuntimeWarning, stacklevel=3)
        return default
    return default if not value else value in BOOL_ON


def user_cache_enabled(environ=None) -> bool:
    """``VFA_FA4_USER_CACHE`` (on unless set off)."""
    return _bool_knob(USER_CACHE_ENV, True, environ)


def shipped_kernels_disabled(environ=None) -> bool:
    """``VFA_FA4_SHIPPED_KERNELS`` set off; any other value keeps the shipped kernels, with one
    warning naming the valid words."""
    return not _bool_knob(SHIPPED_KERNELS_ENV, True, environ)


def shipped_root() -> Path | None:
    """The wheel's precompiled kernels, or None when it ships none."""
    try:
        # FA4's subpackage (families.fa4.subpackage): this module is FA4's kernel cache, as
        # fa4/adapter.py is its adapter; the family's own modules name it.
        root = Path(str(resources.files("vendored_flash_attn._fa4").joinpath(SHIPPED_DIR)))
    except ModuleNotFoundError:
        return None
    return root if root.is_dir() else None


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _warn_untrusted(exc: UntrustedEntry) -> None:
    # The same line whether a load or an export met it: one per problem and process.
    _warn_once(f"FA4's kernel cache: {exc}, so no kernel is loaded from or written there; they compile in "
               "memory. Everything under the cache folder must be yours, not writable by group or others, and "
               "no symbolic link.")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def two_level_cache_class(persistent_cache, load_module):
    """A subclass of upstream's ``JITPersistentCache`` (passed in: it lives in the staged
    ``cache_utils``, importable only with cutlass) that looks in the shipped kernels first,
    then in the user cache (UserKernelDir), and exports there atomically. Of upstream's
    class it keeps the key hash (``_key_to_hash``) and the in-memory level; every disk
    access is its own, none through upstream's locks or in-place writes.

    ``load_module(path)`` returns the exported function of a ``.o`` (upstream: the
    ``func`` attribute of ``cute.runtime.load_module(path, enable_tvm_ffi=True)``).
    """

    class TwoLevelCache(persistent_cache):
        def __init__(self, shipped_dir: Path | None, user: UserKernelDir | None, aliases: dict | None = None,
                     user_problem: str | None = None):
            # Not upstream's __init__: it makes the folder unchecked.
            self.cache = {}  # upstream's in-memory level (JITCache.__init__)
            self.shipped_dir = shipped_dir
            self.aliases = aliases or {}  # key hash -> another Python's shipped file (read_aliases)
            self.user = user
            self.cache_path = user.path if user is not None else None  # upstream's attribute
            self.user_problem = user_problem  # why there is no user cache (None: switched off or there)

        @property
        def writable(self) -> bool:
            return self.user is not None

        def __contains__(self, key) -> bool:
            if key in self.cache:
                return True
            if self._try_load_shipped(key):
                return True
            return self.user is not None and self._try_load_from_storage(key)

        def __getitem__(self, key):
            self.__contains__(key)
            return self.cache[key]

        def __setitem__(self, key, fn) -> None:
            self.cache[key] = fn
            if self.user is not None:
                self._try_export_to_storage(key, fn)
            elif self.user_problem:
                _warn_once(f"FA4's kernel cache is not used: {self.user_problem}. Kernels the wheel does not "
                           "ship compile in memory, again in every process. Point "
                           f"{USER_CACHE_DIR_ENV} at a folder of yours that only you can write, or set "
                           f"{USER_CACHE_ENV}=off to compile in memory without this warning.")

        def _try_load_shipped(self, key) -> bool:
            # Immutable files of the install: no lock, nothing opened for writing.
            if self.shipped_dir is None and not self.aliases:
                return False
            digest = self._key_to_hash(key)
            path = self.shipped_dir / f"{digest}.o" if self.shipped_dir is not None else None
            if path is None or not path.is_file():
                path = self.aliases.get(digest)
            if path is None or not path.is_file():
                return False
            try:
                self.cache[key] = load_module(path)
            except Exception as exc:  # noqa: BLE001  never fatal: the kernel compiles instead
                _warn_once(f"FA4's shipped kernel {path} could not be loaded ({_first_line(exc)}): it is compiled "
                           "instead. Reinstall vendored-flash-attn.")
                return False
            return True

        def _try_load_from_storage(self, key) -> bool:
            try:
                fn = self.user.load(f"{self._key_to_hash(key)}.o", load_module)
            except UntrustedEntry as exc:
                _warn_untrusted(exc)
                return False
            except KernelLoadFailed as exc:
                _warn_once(f"FA4's cached kernel {exc}: it was removed and the kernel is compiled again.")
                return False
            except OSError as exc:
                _warn_once(f"FA4's kernel cache {self.user.path} cannot be read ({_first_line(exc)}): the kernel "
                           "is compiled instead.")
                return False
            if fn is None:
                return False
            self.cache[key] = fn
            return True

        def _try_export_to_storage(self, key, fn) -> None:
            try:
                self.user.export(f"{self._key_to_hash(key)}.o", lambda path: fn.export_to_c(
                    object_file_path=path, function_name=self.EXPORT_FUNCTION_PREFIX))
            except UntrustedEntry as exc:
                _warn_untrusted(exc)
            except Exception as exc:  # noqa: BLE001  a full disk, a DSL that cannot export: kept in memory
                _warn_once(f"FA4 could not write a kernel into its cache {self.user.path} ({_first_line(exc)}): "
                           "it stays in memory for this process.")

        def clear(self) -> None:
            # Upstream's clear() deletes every file of the cache dir: never the shipped ones.
            self.cache.clear()
            if self.user is not None:
                self.user.clear()

    return TwoLevelCache


def install(interface, cache_utils, cutlass_module, load_module=None, shipped=None, user=None) -> dict:
    """Replace the ``compile_cache`` of FA4's forward entry points with two-level caches.

    Returns where each kind looks (for ``info`` and tests). ``shipped`` / ``user`` override
    the roots (tests; the build's precompile step, whose user cache is its output); the user
    root passes ``checked_user_root`` either way. ``load_module`` the loader (default:
    upstream's through cute.runtime). ``VFA_FA4_SHIPPED_KERNELS=off`` leaves the shipped
    level out, override or not; ``VFA_FA4_USER_CACHE=off`` the user cache, unless overridden.
    """
    if load_module is None:
        import cutlass.cute as cute

        def load_module(path):
            module = cute.runtime.load_module(str(path), enable_tvm_ffi=True)
            return getattr(module, cache_utils.JITPersistentCache.EXPORT_FUNCTION_PREFIX)

    flavour = dsl_flavour(cutlass_module)
    fingerprint = cache_utils._compute_source_fingerprint()
    shipped_off = shipped_kernels_disabled()
    if shipped_off:
        shipped = None
    elif shipped is None:
        shipped = shipped_root()
    user_problem = None
    if user is None and user_cache_enabled():
        try:
            user = user_cache_root()
        except NoUserCacheHome as exc:  # off, with the one warning of a cache that cannot be used
            user_problem = str(exc)
    if user is not None:
        user, user_problem = checked_user_root(user)
    cache_class = two_level_cache_class(cache_utils.JITPersistentCache, load_module)
    layout = {"flavour": flavour, "fingerprint": fingerprint, "shipped_off": shipped_off,
              "user_root": str(user) if user else None, "user_problem": user_problem, "kinds": {}}
    aliases = (read_aliases(shipped, flavour, fingerprint, recorded_index_digest(shipped, flavour, fingerprint))
               if shipped else {})
    for attribute, kind in FORWARD_CACHES.items():
        function = getattr(interface, attribute, None)
        if function is None:
            continue
        shipped_dir = kernel_dir(shipped, flavour, fingerprint, kind) if shipped else None
        if shipped_dir is not None and not shipped_dir.is_dir():
            shipped_dir = None  # nothing compiled by this Python for this flavour / kind
        user_dir = UserKernelDir(user, (flavour, fingerprint, kind)) if user else None
        function.compile_cache = cache_class(shipped_dir, user_dir, aliases.get(kind), user_problem)
        layout["kinds"][kind] = {"shipped": str(shipped_dir) if shipped_dir else None,
                                 "aliases": len(aliases.get(kind, {})),
                                 "user": str(user_dir.path) if user_dir else None}
    return layout
