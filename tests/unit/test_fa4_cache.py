"""FA4's two-level AOT kernel cache (fa4_cache) on a CPU, without cutlass: the upstream
base class is a stand-in with upstream's disk behaviour (cache_utils.py at the pin: a
lookup opens ``<hash>.lock`` with O_CREAT, an export writes ``<hash>.o`` under a lock)."""

from __future__ import annotations

import hashlib
import os
import pickle
import types
from pathlib import Path

import pytest

from vendored_flash_attn import fa4_cache


class UpstreamPersistentCache:
    """cache_utils.JITPersistentCache's behaviour at the pin, minus cutlass."""

    EXPORT_FUNCTION_PREFIX = "func"
    opened_locks: list[Path] = []

    def __init__(self, cache_path: Path):
        self.cache = {}
        cache_path.mkdir(parents=True, exist_ok=True)
        self.cache_path = cache_path

    def _key_to_hash(self, key) -> str:
        return hashlib.sha256(pickle.dumps(key)).hexdigest()

    def _lock(self, sha, flags):
        path = self.cache_path / f"{sha}.lock"
        UpstreamPersistentCache.opened_locks.append(path)
        os.close(os.open(path, flags | os.O_CREAT))

    def _try_load_from_storage(self, key) -> bool:
        sha = self._key_to_hash(key)
        self._lock(sha, os.O_RDONLY)
        obj = self.cache_path / f"{sha}.o"
        if obj.exists():
            self.cache[key] = ("loaded", obj)
            return True
        return False

    def _try_export_to_storage(self, key, fn) -> None:
        sha = self._key_to_hash(key)
        self._lock(sha, os.O_WRONLY)
        (self.cache_path / f"{sha}.o").write_bytes(b"exported " + repr(fn).encode())


def _loader(path: Path):
    return ("shipped", path)


CacheClass = fa4_cache.two_level_cache_class(UpstreamPersistentCache, _loader)
KEY = ("bf16", 128, 128, 4, True)
FINGERPRINT = "f" * 64


def _ship(root: Path, flavour: str, key=KEY, kind: str = "fwd") -> Path:
    directory = fa4_cache.kernel_dir(root, flavour, FINGERPRINT, kind)
    directory.mkdir(parents=True)
    obj = directory / f"{hashlib.sha256(pickle.dumps(key)).hexdigest()}.o"
    obj.write_bytes(b"precompiled")
    (obj.with_suffix(".lock")).write_bytes(b"")
    return obj


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(autouse=True)
def _fresh_locks():
    UpstreamPersistentCache.opened_locks = []


def test_a_shipped_kernel_loads_without_locking_or_writing_the_install(tmp_path):
    shipped_root, user_root = tmp_path / "site", tmp_path / "user"
    obj = _ship(shipped_root, "cu12.9")
    before = _tree(shipped_root)
    cache = CacheClass(obj.parent, fa4_cache.kernel_dir(user_root, "cu12.9", FINGERPRINT, "fwd"))
    assert KEY in cache
    assert cache[KEY] == ("shipped", obj)
    assert UpstreamPersistentCache.opened_locks == []  # a read-only site-packages never sees a lock
    assert _tree(shipped_root) == before


def test_a_kernel_of_another_cuda_flavour_is_never_loaded(tmp_path):
    """cu12 and cu13 builds of the DSL share upstream's fingerprint and key: the flavour
    directory keeps a cu13 process away from cu12 kernels (and the other way round)."""
    _ship(tmp_path / "site", "cu12.9")
    shipped = fa4_cache.kernel_dir(tmp_path / "site", "cu13.0", FINGERPRINT, "fwd")
    user = fa4_cache.kernel_dir(tmp_path / "user", "cu13.0", FINGERPRINT, "fwd")
    cache = CacheClass(shipped if shipped.is_dir() else None, user)
    assert KEY not in cache
    assert all(str(p).startswith(str(tmp_path / "user" / "cu13.0")) for p in UpstreamPersistentCache.opened_locks)


def test_a_kernel_compiled_at_run_time_goes_to_the_user_cache_only(tmp_path):
    obj = _ship(tmp_path / "site", "cu12.9")
    before = _tree(tmp_path / "site")
    user = fa4_cache.kernel_dir(tmp_path / "user", "cu12.9", FINGERPRINT, "fwd")
    cache = CacheClass(obj.parent, user)
    other = ("bf16", 64, 64, 1, False)
    assert other not in cache
    cache[other] = "compiled"
    assert cache[other] == "compiled"
    exported = list(user.glob("*.o"))
    assert len(exported) == 1 and exported[0].read_bytes() == b"exported 'compiled'"
    assert _tree(tmp_path / "site") == before
    # A new process finds it in the user cache (upstream's locked path).
    again = CacheClass(obj.parent, user)
    assert other in again and again[other] == ("loaded", exported[0])


def test_clear_never_deletes_shipped_kernels(tmp_path):
    obj = _ship(tmp_path / "site", "cu12.9")
    user = fa4_cache.kernel_dir(tmp_path / "user", "cu12.9", FINGERPRINT, "fwd")
    cache = CacheClass(obj.parent, user)
    cache[("x",)] = "compiled"
    cache.clear()
    assert obj.exists() and list(user.iterdir()) == []


def test_an_unwritable_user_cache_warns_and_keeps_kernels_in_memory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.warns(RuntimeWarning, match="FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        cache = CacheClass(None, blocker / "cache")
    assert KEY not in cache
    cache[KEY] = "compiled"
    assert KEY in cache and cache[KEY] == "compiled"


def test_user_cache_root_prefers_upstreams_knob_then_xdg_then_home():
    assert fa4_cache.user_cache_root({"FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "/a", "XDG_CACHE_HOME": "/b"}) == Path("/a")
    assert fa4_cache.user_cache_root({"XDG_CACHE_HOME": "/b"}) == Path("/b/vendored-flash-attn/fa4")
    assert fa4_cache.user_cache_root({}) == Path(os.path.expanduser("~")) / ".cache/vendored-flash-attn/fa4"


def _install_as(tmp_path, fingerprint=FINGERPRINT):
    """fa4_cache.install on a stand-in interface (a forward entry point, no combine) in a
    process whose upstream fingerprint is ``fingerprint`` and DSL flavour cu12.9: the forward
    cache and the layout."""
    def fwd():
        pass

    interface = types.SimpleNamespace(_flash_attn_fwd=fwd)
    cache_utils = types.SimpleNamespace(JITPersistentCache=UpstreamPersistentCache,
                                        _compute_source_fingerprint=lambda: fingerprint)
    cutlass = types.SimpleNamespace(CUDA_VERSION=types.SimpleNamespace(major=12, minor=9))
    layout = fa4_cache.install(interface, cache_utils, cutlass, load_module=_loader,
                               shipped=tmp_path / "site", user=tmp_path / "user")
    return fwd.compile_cache, layout


def test_install_replaces_the_forward_caches_with_flavour_and_fingerprint_in_the_path(tmp_path):
    obj = _ship(tmp_path / "site", "cu12.9")
    cache, layout = _install_as(tmp_path)  # no combine entry point: skipped
    assert layout["flavour"] == "cu12.9" and layout["fingerprint"] == FINGERPRINT
    assert layout["kinds"] == {"fwd": {"shipped": str(obj.parent), "aliases": 0,
                                       "user": str(tmp_path / "user/cu12.9" / FINGERPRINT / "fwd")}}
    assert KEY in cache and cache[KEY] == ("shipped", obj)


@pytest.mark.parametrize("value", ["off", "0", "OFF "])
def test_shipped_kernels_off_leaves_the_user_cache_alone_to_serve(tmp_path, monkeypatch, value):
    # benchmarks/first_call.py's "jit" state: a wheel that ships the kernel must compile it.
    _ship(tmp_path / "site", "cu12.9")
    monkeypatch.setenv(fa4_cache.SHIPPED_KERNELS_ENV, value)
    cache, layout = _install_as(tmp_path)
    assert layout["shipped_off"] is True and layout["kinds"]["fwd"]["shipped"] is None
    assert KEY not in cache
    monkeypatch.setenv(fa4_cache.SHIPPED_KERNELS_ENV, "on")
    cache, layout = _install_as(tmp_path)
    assert layout["shipped_off"] is False and KEY in cache


def test_a_typo_in_the_shipped_kernels_switch_warns_and_keeps_them():
    from vendored_flash_attn import fa4_cache

    for word in ("off", "OFF", "0", "false", "no"):
        assert fa4_cache.shipped_kernels_disabled({"VFA_FA4_SHIPPED_KERNELS": word})
    for word in ("", "on", "1", "yes"):
        assert not fa4_cache.shipped_kernels_disabled({"VFA_FA4_SHIPPED_KERNELS": word})
    with pytest.warns(RuntimeWarning, match="'of' is not a valid value.*Valid values"):
        assert not fa4_cache.shipped_kernels_disabled({"VFA_FA4_SHIPPED_KERNELS": "of"})


OTHER_FINGERPRINT = "e" * 64  # another Python's: upstream's fingerprint holds the Python minor


def _index(tmp_path, table, same_as=FINGERPRINT) -> Path:
    path = tmp_path / "site/cu12.9" / OTHER_FINGERPRINT / fa4_cache.ALIASES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(__import__("json").dumps({"same_as": same_as, "python": "3.14", "kinds": table}))
    return path


def test_a_python_without_kernels_of_its_own_loads_another_pythons_files_through_its_index(tmp_path):
    # The wheel ships each kernel once (compiled by one Python); another Python's key hash
    # (3.14 pickles keys with protocol 5: another hash for the same key) is listed in its
    # fingerprint's aliases.json, pointing at the compiled file. No lock, no write.
    compiled_key = ("the same kernel, as the compiling Python hashed it",)
    obj = _ship(tmp_path / "site", "cu12.9", key=compiled_key)
    own_hash = hashlib.sha256(pickle.dumps(KEY)).hexdigest()
    _index(tmp_path, {"fwd": {own_hash: obj.stem}})
    before = _tree(tmp_path / "site")
    cache, layout = _install_as(tmp_path, OTHER_FINGERPRINT)
    assert layout["kinds"]["fwd"]["shipped"] is None and layout["kinds"]["fwd"]["aliases"] == 1
    assert KEY in cache and cache[KEY] == ("shipped", obj)
    assert not [p for p in UpstreamPersistentCache.opened_locks if "site" in p.parts]
    assert _tree(tmp_path / "site") == before
    # a key the index does not list compiles into the user cache as before
    assert ("other",) not in cache


@pytest.mark.parametrize("table, same_as", [
    ({"fwd": {"0" * 64: "../../../../evil"}}, FINGERPRINT),  # a path, not a key hash
    ({"fwd": {"0" * 64: "1" * 64}}, "../x"),
    ("not a table", FINGERPRINT),
])
def test_an_index_that_is_not_the_builds_is_ignored_with_a_warning(tmp_path, table, same_as):
    _ship(tmp_path / "site", "cu12.9")
    _index(tmp_path, table, same_as)
    with pytest.warns(RuntimeWarning, match="kernel index .* is damaged.*Reinstall"):
        cache, layout = _install_as(tmp_path, OTHER_FINGERPRINT)
    assert layout["kinds"]["fwd"]["aliases"] == 0
    assert KEY not in cache  # compiles at first use instead


def test_an_unreadable_index_is_ignored_with_a_warning(tmp_path):
    path = _index(tmp_path, {})
    path.write_text("{truncated")
    with pytest.warns(RuntimeWarning, match="damaged"):
        assert fa4_cache.read_aliases(tmp_path / "site", "cu12.9", OTHER_FINGERPRINT) == {}
