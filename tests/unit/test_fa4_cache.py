"""FA4's two-level AOT kernel cache (fa4_cache) on a CPU, without cutlass: the upstream
base class is a stand-in with upstream's disk behaviour (cache_utils.py at the pin: a
lookup opens ``<hash>.lock`` with O_CREAT and loads ``<hash>.o``, an export has the compiled
function write ``<hash>.o`` in place), and the loader refuses what is not a whole object
file, as the DSL's JIT linker does ("The file was not recognized as a valid object file",
measured on a truncated file with the pinned nvidia-cutlass-dsl).

The user cache holds native code the process runs, so its trust rules each have a test
here: a folder writable by group or others, or owned by another user, is not loaded from; a
symbolic link under the root is refused; a relative root is refused; a truncated kernel file
is removed and compiled again; a process killed during an export leaves nothing that a later
process loads."""

from __future__ import annotations

# One file over 500 lines, on purpose: one module under test (fa4_cache and its user cache) and
# the one stand-in for upstream's cache its cases share.

import hashlib
import os
import pickle
import signal
import time
import types
import warnings
from pathlib import Path

import pytest

from vendored_flash_attn.families.fa4 import cache as fa4_cache, user_cache as fa4_user_cache

OBJECT_HEAD, OBJECT_TAIL = b"\x7fELF stand-in object: ", b" :end of object"
NOT_AN_OBJECT = "BinaryExecutionEngine: Failed to add object file: The file was not recognized as a valid object file"


def _object(name: str) -> bytes:
    return OBJECT_HEAD + name.encode() + OBJECT_TAIL


class Compiled:
    """A kernel as the DSL's compile returns it: ``export_to_c`` writes its object file.
    ``stall_fd``: write half of it, say so on that pipe and hang (a worker killed mid-export)."""

    def __init__(self, name: str, stall_fd: int | None = None):
        self.name, self.stall_fd = name, stall_fd
        self.exported_to: list[str] = []

    def export_to_c(self, object_file_path: str, function_name: str) -> None:
        assert function_name == "func"
        self.exported_to.append(os.path.realpath(object_file_path))  # where it is, while it is written
        data = _object(self.name)
        with open(object_file_path, "wb") as f:
            if self.stall_fd is None:
                f.write(data)
                return
            f.write(data[: len(data) // 2])
            f.flush()
            os.fsync(f.fileno())
            os.write(self.stall_fd, b"!")
            time.sleep(120)


def _loader(path) -> tuple[str, str]:
    """The DSL's load_module: a file that is not a whole object file is refused."""
    data = Path(path).read_bytes()
    if not (data.startswith(OBJECT_HEAD) and data.endswith(OBJECT_TAIL)):
        raise RuntimeError(NOT_AN_OBJECT)
    return ("loaded", data[len(OBJECT_HEAD):-len(OBJECT_TAIL)].decode())


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
            self.cache[key] = _loader(obj)
            return True
        return False

    def _try_export_to_storage(self, key, fn) -> None:
        sha = self._key_to_hash(key)
        self._lock(sha, os.O_WRONLY)
        obj = self.cache_path / f"{sha}.o"
        if not obj.exists():
            fn.export_to_c(object_file_path=str(obj), function_name=self.EXPORT_FUNCTION_PREFIX)


KEY = ("bf16", 128, 128, 4, True)
FINGERPRINT = "f" * 64
FLAVOUR = "cu12.9"


def _digest(key=KEY) -> str:
    return hashlib.sha256(pickle.dumps(key)).hexdigest()


def _ship(root: Path, flavour: str = FLAVOUR, key=KEY, kind: str = "fwd", name: str = "precompiled") -> Path:
    directory = fa4_cache.kernel_dir(root, flavour, FINGERPRINT, kind)
    directory.mkdir(parents=True, exist_ok=True)
    obj = directory / f"{_digest(key)}.o"
    obj.write_bytes(_object(name))
    return obj


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _install(tmp_path, fingerprint=FINGERPRINT, user=None, shipped=None):
    """fa4_cache.install on a stand-in interface (a forward entry point, no combine) in a
    process whose upstream fingerprint is ``fingerprint`` and DSL flavour cu12.9: the forward
    cache and the layout. ``user``: the user root (default tmp_path/user)."""
    def fwd():
        pass

    interface = types.SimpleNamespace(_flash_attn_fwd=fwd)
    cache_utils = types.SimpleNamespace(JITPersistentCache=UpstreamPersistentCache,
                                        _compute_source_fingerprint=lambda: fingerprint)
    cutlass = types.SimpleNamespace(CUDA_VERSION=types.SimpleNamespace(major=12, minor=9))
    layout = fa4_cache.install(interface, cache_utils, cutlass, load_module=_loader,
                               shipped=tmp_path / "site" if shipped is None else shipped,
                               user=tmp_path / "user" if user is None else user)
    return fwd.compile_cache, layout


def _kind_dir(tmp_path) -> Path:
    return tmp_path / "user" / FLAVOUR / FINGERPRINT / "fwd"


def _fill(tmp_path, name="compiled once") -> Path:
    """A user cache as an earlier process left it: KEY compiled and exported."""
    cache, _ = _install(tmp_path)
    assert KEY not in cache
    cache[KEY] = Compiled(name)
    obj = _kind_dir(tmp_path) / f"{_digest()}.o"
    assert obj.read_bytes() == _object(name)
    return obj


def _cache_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, RuntimeWarning)]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    UpstreamPersistentCache.opened_locks = []
    monkeypatch.setattr(fa4_cache, "_warned", set(), raising=False)  # one warning per process: per test here
    for name in (fa4_cache.SHIPPED_KERNELS_ENV, "VFA_FA4_USER_CACHE", "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)


# --- the two levels -------------------------------------------------------------------------

def test_a_shipped_kernel_loads_without_locking_or_writing_the_install(tmp_path):
    obj = _ship(tmp_path / "site")
    before = _tree(tmp_path / "site")
    cache, _ = _install(tmp_path)
    assert KEY in cache
    assert cache[KEY] == ("loaded", "precompiled")
    assert UpstreamPersistentCache.opened_locks == []  # a read-only site-packages never sees a lock
    assert _tree(tmp_path / "site") == before and obj.exists()


def test_a_kernel_of_another_cuda_flavour_is_never_loaded(tmp_path):
    """cu12 and cu13 builds of the DSL share upstream's fingerprint and key: the flavour
    directory keeps a cu13 process away from cu12 kernels (and the other way round)."""
    _ship(tmp_path / "site", "cu13.0")
    cache, layout = _install(tmp_path)
    assert layout["kinds"]["fwd"]["shipped"] is None
    assert KEY not in cache


def test_a_kernel_compiled_at_run_time_goes_to_the_user_cache_only(tmp_path):
    _ship(tmp_path / "site")
    before = _tree(tmp_path / "site")
    cache, _ = _install(tmp_path)
    other = ("bf16", 64, 64, 1, False)
    assert other not in cache
    cache[other] = compiled = Compiled("compiled")
    assert cache[other] is compiled
    exported = list(_kind_dir(tmp_path).glob("*.o"))
    assert [p.name for p in exported] == [f"{_digest(other)}.o"] and exported[0].read_bytes() == _object("compiled")
    assert _tree(tmp_path / "site") == before
    # A new process finds it in the user cache; no lock file is taken or left.
    again, _ = _install(tmp_path)
    assert other in again and again[other] == ("loaded", "compiled")
    assert not list((tmp_path / "user").rglob("*.lock")) and UpstreamPersistentCache.opened_locks == []


def test_clear_never_deletes_shipped_kernels(tmp_path):
    obj = _ship(tmp_path / "site")
    cache, _ = _install(tmp_path)
    cache[("x",)] = Compiled("x")
    cache.clear()
    assert obj.exists() and list(_kind_dir(tmp_path).iterdir()) == []


def test_user_cache_root_prefers_upstreams_knob_then_xdg_then_home():
    home_cache = Path(os.path.expanduser("~")) / ".cache/vendored-flash-attn/fa4"
    assert fa4_cache.user_cache_root({"FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "/a", "XDG_CACHE_HOME": "/b"}) == Path("/a")
    assert fa4_cache.user_cache_root({"XDG_CACHE_HOME": "/b"}) == Path("/b/vendored-flash-attn/fa4")
    assert fa4_cache.user_cache_root({}) == home_cache
    # A relative XDG_CACHE_HOME is ignored, as the XDG spec says (the build's source cache does the same).
    assert fa4_cache.user_cache_root({"XDG_CACHE_HOME": "rel"}) == home_cache


def test_install_replaces_the_forward_caches_with_flavour_and_fingerprint_in_the_path(tmp_path):
    obj = _ship(tmp_path / "site")
    cache, layout = _install(tmp_path)  # no combine entry point: skipped
    assert layout["flavour"] == FLAVOUR and layout["fingerprint"] == FINGERPRINT
    assert layout["user_root"] == str(tmp_path / "user") and layout["user_problem"] is None
    assert layout["kinds"] == {"fwd": {"shipped": str(obj.parent), "aliases": 0, "user": str(_kind_dir(tmp_path))}}
    assert KEY in cache and cache[KEY] == ("loaded", "precompiled")


@pytest.mark.parametrize("value", ["off", "0", "OFF "])
def test_shipped_kernels_off_leaves_the_user_cache_alone_to_serve(tmp_path, monkeypatch, value):
    # benchmarks/first_call.py's "jit" state: a wheel that ships the kernel must compile it.
    _ship(tmp_path / "site")
    monkeypatch.setenv(fa4_cache.SHIPPED_KERNELS_ENV, value)
    cache, layout = _install(tmp_path)
    assert layout["shipped_off"] is True and layout["kinds"]["fwd"]["shipped"] is None
    assert KEY not in cache
    monkeypatch.setenv(fa4_cache.SHIPPED_KERNELS_ENV, "on")
    cache, layout = _install(tmp_path)
    assert layout["shipped_off"] is False and KEY in cache


def test_a_typo_in_the_shipped_kernels_switch_warns_and_keeps_them():
    for word in ("off", "OFF", "0", "false", "no"):
        assert fa4_cache.shipped_kernels_disabled({"VFA_FA4_SHIPPED_KERNELS": word})
    for word in ("", "on", "1", "yes"):
        assert not fa4_cache.shipped_kernels_disabled({"VFA_FA4_SHIPPED_KERNELS": word})
    with pytest.warns(RuntimeWarning, match="'of' is not a valid value.*Valid values"):
        assert not fa4_cache.shipped_kernels_disabled({"VFA_FA4_SHIPPED_KERNELS": "of"})


def test_a_shipped_kernel_that_fails_to_load_is_compiled_instead_and_left_alone(tmp_path):
    # Never fatal: the install's file is not ours to remove; the compiled kernel goes to the
    # user cache, and the warning says to reinstall.
    obj = _ship(tmp_path / "site")
    obj.write_bytes(obj.read_bytes()[:10])
    cache, _ = _install(tmp_path)
    with pytest.warns(RuntimeWarning, match=r"shipped kernel .* could not be loaded \(RuntimeError: .*not recognized.*"
                                             r"Reinstall vendored-flash-attn"):
        assert KEY not in cache
    cache[KEY] = Compiled("compiled")
    assert obj.exists() and (_kind_dir(tmp_path) / obj.name).read_bytes() == _object("compiled")


# --- the user cache: on by default, off on request, one line when it cannot be used ---------

def _install_default_root(tmp_path):
    # The root from the environment, as at run time (no override).
    def fwd():
        pass

    interface = types.SimpleNamespace(_flash_attn_fwd=fwd)
    cache_utils = types.SimpleNamespace(JITPersistentCache=UpstreamPersistentCache,
                                        _compute_source_fingerprint=lambda: FINGERPRINT)
    cutlass = types.SimpleNamespace(CUDA_VERSION=types.SimpleNamespace(major=12, minor=9))
    layout = fa4_cache.install(interface, cache_utils, cutlass, load_module=_loader, shipped=tmp_path / "site")
    return fwd.compile_cache, layout


def test_the_user_cache_is_on_by_default_and_off_with_the_knob(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", str(tmp_path / "user"))
    cache, layout = _install_default_root(tmp_path)
    assert layout["user_root"] == str(tmp_path / "user")
    cache[KEY] = Compiled("compiled")
    assert (_kind_dir(tmp_path) / f"{_digest()}.o").exists()
    monkeypatch.setenv("VFA_FA4_USER_CACHE", "off")
    cache, layout = _install_default_root(tmp_path)
    assert layout["user_root"] is None and layout["kinds"]["fwd"]["user"] is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # switched off on purpose: no warning
        assert KEY not in cache  # not even read
        cache[("other",)] = Compiled("other")
    assert len(list(_kind_dir(tmp_path).glob("*.o"))) == 1


def test_a_cache_folder_that_cannot_be_made_compiles_in_memory_with_one_warning(tmp_path):
    # A read-only home: the kernels the wheel ships still load, the others compile in memory,
    # and one line (at the first compile, not at every start) says why and what to set.
    _ship(tmp_path / "site")
    (tmp_path / "a-file").write_text("")
    cache, layout = _install(tmp_path, user=tmp_path / "a-file" / "cache")
    assert "cannot be made or opened" in layout["user_problem"] and layout["kinds"]["fwd"]["user"] is None
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert KEY in cache  # shipped: no warning
        for name in ("a", "b"):
            cache[(name,)] = Compiled(name)
    messages = _cache_warnings(record)
    assert len(messages) == 1, messages
    assert "is not used" in messages[0] and "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR" in messages[0]
    assert "VFA_FA4_USER_CACHE=off" in messages[0]
    assert cache[("a",)].name == "a"


def test_a_relative_cache_folder_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "relative/cache")
    cache, layout = _install_default_root(tmp_path)
    assert "relative path" in layout["user_problem"]
    with pytest.warns(RuntimeWarning, match="'relative/cache' is a relative path"):
        cache[KEY] = Compiled("compiled")
    assert not (tmp_path / "relative").exists()  # nothing written where the process happens to run


# --- trust: only folders and files that nobody else could have written ----------------------

WHERE = {"root": lambda t: t / "user", "flavour folder": lambda t: t / "user" / FLAVOUR,
         "kind folder": lambda t: _kind_dir(t)}


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757], ids=["world-writable", "group-writable", "other-writable"])
@pytest.mark.parametrize("where", list(WHERE))
def test_a_folder_writable_by_group_or_others_is_not_loaded_from(tmp_path, where, mode):
    _fill(tmp_path)
    WHERE[where](tmp_path).chmod(mode)
    before = _tree(tmp_path / "user")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cache, layout = _install(tmp_path)
        assert KEY not in cache  # not loaded: anyone in the group (or anyone) could have put it there
        cache[KEY] = Compiled("compiled in memory")
        assert cache[KEY].name == "compiled in memory"
    messages = _cache_warnings(record)
    assert len(messages) == 1, messages
    assert "writable by" in messages[0] and f"mode {mode:04o}" in messages[0]
    assert _tree(tmp_path / "user") == before  # and nothing written there either
    if where == "root":
        assert "writable by" in layout["user_problem"]


@pytest.mark.parametrize("where", ["root", "kind folder", "kernel file"])
def test_a_folder_or_file_of_another_user_is_not_loaded_from(tmp_path, where):
    """Ownership by another uid, for real: the tests run as root here and in CI, and root
    can give a file away (chown); root's own files stay root's (uid 0 is this user)."""
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root (test_files_seen_as_another_users_are_refused covers it)")
    obj = _fill(tmp_path)
    target = {"root": tmp_path / "user", "kind folder": _kind_dir(tmp_path), "kernel file": obj}[where]
    os.chown(target, 4242, 4242)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cache, _ = _install(tmp_path)
        assert KEY not in cache
        cache[KEY] = Compiled("recompiled")
    messages = _cache_warnings(record)
    assert messages and all("owned by uid 4242, not by this process's user (uid 0)" in m for m in messages), messages
    if where == "kernel file":
        # The folder is ours: the export replaces the stranger's file with our own.
        assert obj.stat().st_uid == 0 and obj.read_bytes() == _object("recompiled")
    else:
        assert obj.read_bytes() == _object("compiled once")


def test_files_seen_as_another_users_are_refused(tmp_path, monkeypatch):
    # Whoever runs the tests: the files are this user's, the process acts as another.
    _fill(tmp_path)
    monkeypatch.setattr(fa4_user_cache, "_current_uid", lambda: os.geteuid() + 1)
    cache, layout = _install(tmp_path)
    assert f"owned by uid {os.geteuid()}, not by this process's user (uid {os.geteuid() + 1})" in layout["user_problem"]
    with pytest.warns(RuntimeWarning, match="is not used"):
        assert KEY not in cache
        cache[KEY] = Compiled("compiled in memory")


@pytest.mark.parametrize("where", ["flavour folder", "kind folder", "kernel file"])
def test_a_symbolic_link_under_the_root_is_not_followed(tmp_path, where):
    # A link to a folder or file with a good kernel in it, of this user: still refused, since
    # what a link points at can change under the check; the kernel compiles instead.
    elsewhere = tmp_path / "elsewhere"
    good = _fill(elsewhere, "planted")
    (tmp_path / "user").mkdir()
    if where == "flavour folder":
        (tmp_path / "user" / FLAVOUR).symlink_to(elsewhere / "user" / FLAVOUR)
    elif where == "kind folder":
        _kind_dir(tmp_path).parent.mkdir(parents=True)
        _kind_dir(tmp_path).symlink_to(good.parent)
    else:
        _kind_dir(tmp_path).mkdir(parents=True)
        (_kind_dir(tmp_path) / good.name).symlink_to(good)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        cache, _ = _install(tmp_path)
        assert KEY not in cache
        cache[KEY] = Compiled("recompiled")
    messages = _cache_warnings(record)
    assert messages and all("is a symbolic link" in m for m in messages), messages
    assert good.read_bytes() == _object("planted")  # nothing written through the link
    if where == "kernel file":
        # The folder is ours: the export replaces the link itself with a real file.
        link = _kind_dir(tmp_path) / good.name
        assert not link.is_symlink() and link.read_bytes() == _object("recompiled")


def test_a_root_reached_through_a_symbolic_link_is_followed_once(tmp_path):
    # ~/.cache on another disk is common: the link to the root is resolved when FA4 loads,
    # and the real folder (checked) used from then on.
    real = tmp_path / "disk" / "cache"
    real.mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    cache, layout = _install(tmp_path, user=tmp_path / "link")
    assert layout["user_root"] == str(real)
    cache[KEY] = Compiled("compiled")
    assert (real / FLAVOUR / FINGERPRINT / "fwd" / f"{_digest()}.o").exists()


# --- atomic writes; a bad file is replaced, never fatal -------------------------------------

def test_a_truncated_kernel_file_is_removed_and_compiled_again(tmp_path):
    obj = _fill(tmp_path)
    obj.write_bytes(obj.read_bytes()[:20])  # a file cut short (what an in-place write leaves)
    cache, _ = _install(tmp_path)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert KEY not in cache  # no exception: the kernel compiles
        assert KEY not in cache  # asked again: one warning
    messages = _cache_warnings(record)
    assert len(messages) == 1 and "could not be loaded (RuntimeError" in messages[0], messages
    assert "removed and the kernel is compiled again" in messages[0]
    assert not obj.exists()
    cache[KEY] = Compiled("compiled again")
    again, _ = _install(tmp_path)
    assert KEY in again and again[KEY] == ("loaded", "compiled again")


def test_an_export_is_written_beside_the_kernel_and_renamed_into_place(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    cache, _ = _install(tmp_path)
    compiled = Compiled("compiled")
    cache[KEY] = compiled
    final = _kind_dir(tmp_path) / f"{_digest()}.o"
    (written,) = compiled.exported_to
    temp = os.path.basename(written)
    assert temp != final.name and temp.startswith(".tmp-") and temp.endswith(".o.part")  # no "*.o" glob sees it
    assert Path(written).parent == _kind_dir(tmp_path)  # the same folder
    assert synced == [str(_kind_dir(tmp_path) / temp), str(_kind_dir(tmp_path))]  # the file, then the folder
    assert sorted(p.name for p in _kind_dir(tmp_path).iterdir()) == [final.name]
    assert final.read_bytes() == _object("compiled") and final.stat().st_mode & 0o022 == 0


def test_an_export_that_fails_leaves_nothing_and_is_not_fatal(tmp_path):
    class Broken(Compiled):
        def export_to_c(self, object_file_path, function_name):
            Path(object_file_path).write_bytes(b"half")
            raise OSError(28, "No space left on device")

    cache, _ = _install(tmp_path)
    with pytest.warns(RuntimeWarning, match="could not write a kernel .*No space left.*stays in memory"):
        cache[KEY] = Broken("x")
    assert cache[KEY].name == "x"
    assert list(_kind_dir(tmp_path).iterdir()) == []


def test_a_process_killed_during_an_export_leaves_nothing_a_later_process_loads(tmp_path):
    """A worker SIGKILLed (an OOM kill, a node drained) while it writes a kernel file: the
    next process must not load the half-written file. With upstream's in-place export, the
    half file was ``<hash>.o`` and broke that call shape in every later process."""
    ready, stalled = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: compiles KEY and hangs halfway through writing it
        try:
            os.close(ready)
            cache, _ = _install(tmp_path)
            cache[KEY] = Compiled("compiled by the killed worker", stall_fd=stalled)
        finally:
            os._exit(3)
    os.close(stalled)
    try:
        assert os.read(ready, 1) == b"!", "the worker never started writing"
    finally:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(ready)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing bad is even seen
        later, _ = _install(tmp_path)
        assert KEY not in later  # this process compiles it
    left = list(_kind_dir(tmp_path).iterdir())
    assert left and all(p.name.startswith(".tmp-") for p in left), left  # the half file, under a temporary name
    later[KEY] = Compiled("compiled by the next process")
    assert _install(tmp_path)[0][KEY] == ("loaded", "compiled by the next process")
    # What the killed export left goes once it is old enough that no live export owns it.
    old = time.time() - 2 * 3600
    for path in left:
        os.utime(path, (old, old))
    _install(tmp_path)[0][("another kernel",)] = Compiled("another")
    assert not [p for p in _kind_dir(tmp_path).iterdir() if p.name.startswith(".tmp-")]


# --- one kernel set for every Python: the shipped index --------------------------------------

OTHER_FINGERPRINT = "e" * 64  # another Python's: upstream's fingerprint holds the Python minor


def _index(tmp_path, table, same_as=FINGERPRINT, recorded=True) -> Path:
    """OTHER_FINGERPRINT's index in the shipped tree (tmp_path/site); ``recorded``: FA4's build
    record beside it (tmp_path/build_info.json, as _fa4/build_info.json is beside _fa4/kernels)
    names its sha256, as the build writes it."""
    import json

    path = tmp_path / "site" / FLAVOUR / OTHER_FINGERPRINT / fa4_cache.ALIASES_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"same_as": same_as, "python": "3.14", "kinds": table}))
    if recorded:
        run = {"arch": "sm_90a", "flavour": FLAVOUR, "fingerprint": OTHER_FINGERPRINT, "kernels": 1,
               "same_as": {"python": "3.12", "fingerprint": same_as,
                           "index_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}}
        (tmp_path / "build_info.json").write_text(json.dumps({"precompile": {"runs": [run]}}))
    return path


def test_a_python_without_kernels_of_its_own_loads_another_pythons_files_through_its_index(tmp_path):
    # The wheel ships each kernel once (compiled by one Python); another Python's key hash
    # (3.14 pickles keys with protocol 5: another hash for the same key) is listed in its
    # fingerprint's aliases.json, pointing at the compiled file. No lock, no write.
    compiled_key = ("the same kernel, as the compiling Python hashed it",)
    obj = _ship(tmp_path / "site", key=compiled_key)
    _index(tmp_path, {"fwd": {_digest(): obj.stem}})
    before = _tree(tmp_path / "site")
    cache, layout = _install(tmp_path, OTHER_FINGERPRINT)
    assert layout["kinds"]["fwd"]["shipped"] is None and layout["kinds"]["fwd"]["aliases"] == 1
    assert KEY in cache and cache[KEY] == ("loaded", "precompiled")
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
    _ship(tmp_path / "site")
    _index(tmp_path, table, same_as)
    with pytest.warns(RuntimeWarning, match="kernel index .* is damaged.*Reinstall"):
        cache, layout = _install(tmp_path, OTHER_FINGERPRINT)
    assert layout["kinds"]["fwd"]["aliases"] == 0
    assert KEY not in cache  # compiles at first use instead


def test_an_unreadable_index_is_ignored_with_a_warning(tmp_path):
    path = _index(tmp_path, {})
    path.write_text("{truncated")
    with pytest.warns(RuntimeWarning, match="damaged"):
        assert fa4_cache.read_aliases(tmp_path / "site", FLAVOUR, OTHER_FINGERPRINT) == {}


# --- what cannot block or wander (issue 36) -------------------------------------------------

def test_a_fifo_where_a_kernel_should_be_is_never_opened(tmp_path):
    # A FIFO opened for reading waits for a writer for ever: FA4's first call hung. Only a
    # regular file is opened (lstat first, then O_NONBLOCK and the descriptor checked); the
    # lookup runs in a thread, so that a hang fails the test instead of hanging it.
    import threading

    _kind_dir(tmp_path).mkdir(parents=True)
    os.mkfifo(_kind_dir(tmp_path) / f"{_digest()}.o", 0o600)
    cache, _ = _install(tmp_path)
    found = []
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        lookup = threading.Thread(target=lambda: found.append(KEY in cache), daemon=True)
        lookup.start()
        lookup.join(timeout=60)
    assert not lookup.is_alive(), "the lookup blocked on the FIFO"
    assert found == [False]
    messages = _cache_warnings(record)
    assert messages and "is not a regular file" in messages[0], messages


@pytest.mark.parametrize("home", ["", "relative/home", "/"])
def test_an_unusable_home_turns_the_user_cache_off_with_one_warning(tmp_path, monkeypatch, home):
    # Python's "~" makes an empty HOME "/": the cache went to /.cache. Now no folder is made
    # or read anywhere, and one warning names the fix.
    monkeypatch.setenv("HOME", home)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    with pytest.raises(fa4_cache.NoUserCacheHome, match="HOME is"):
        fa4_cache.user_cache_root()
    cache, layout = _install_default_root(tmp_path)
    assert layout["user_root"] is None and f"HOME is {home!r}" in layout["user_problem"]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert KEY not in cache
        cache[KEY] = Compiled("in memory")
        cache[("another",)] = Compiled("in memory too")
    messages = _cache_warnings(record)
    assert len(messages) == 1 and "is not used: HOME is" in messages[0], messages
    # an explicit folder still serves
    assert fa4_cache.user_cache_root({"HOME": home, "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": "/a"}) == Path("/a")


@pytest.mark.parametrize("how", ["swapped", "not recorded"])
def test_an_index_the_build_record_does_not_name_is_not_believed(tmp_path, how):
    # An index in the build's format whose entries send this Python's key to another kernel's
    # file (another build's index, a swapped one): loading it would run the wrong kernel. It is
    # believed only with the sha256 FA4's build record gives for it.
    right = _ship(tmp_path / "site", key=("the kernel KEY is",))
    wrong = _ship(tmp_path / "site", key=("another kernel",), name="another kernel")
    _index(tmp_path, {"fwd": {_digest(): right.stem}}, recorded=how == "swapped")
    if how == "swapped":
        _index(tmp_path, {"fwd": {_digest(): right.stem}}).write_text(__import__("json").dumps(
            {"same_as": FINGERPRINT, "python": "3.14", "kinds": {"fwd": {_digest(): wrong.stem}}}))
    with pytest.warns(RuntimeWarning, match="is not the index FA4's build record"):
        cache, layout = _install(tmp_path, OTHER_FINGERPRINT)
    assert layout["kinds"]["fwd"]["aliases"] == 0
    assert KEY not in cache  # compiles at first use: never the other kernel's file
