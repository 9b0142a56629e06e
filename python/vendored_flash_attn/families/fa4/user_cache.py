"""FA4's user kernel cache: only folders and files nobody but this user could have written.

A kernel object is native code the process runs, so the user cache is used only where nobody
but this user could have written it (``UserKernelDir``): an absolute root, owned by this
process's user and not writable by group or others, and every folder and file under it the
same and no symbolic link, each checked on the open file descriptor that is then read (no
window between the check and the load; a root reached through a symbolic link is followed
once, by ``checked_user_root``, when FA4 loads). Exports go to a temporary file in the same
folder, fsynced and renamed into place. The two-level cache that uses it is cache.py's.
Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

# Upstream's knob for where its disk cache lives; ours lives there too when it is set.
USER_CACHE_DIR_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
# An export in progress: ".tmp-<hash>-<random>.o.part" in the kernel's own folder, renamed
# over <hash>.o when complete. Nothing loads it (not a kernel's name) and no "*.o" count of
# kernels sees it. The DSL picks what to write from the last suffix, and one it does not know
# means an object file (_get_format_from_object_file_path, nvidia-cutlass-dsl 4.6.0.dev0).
_TEMP_PREFIX = ".tmp-"
_TEMP_SUFFIX = ".o.part"
_STALE_TEMP_S = 3600  # a temporary file this old belongs to a killed export: removed

class UntrustedEntry(Exception):
    """A folder or file of the user cache that may not be loaded from; the message says why."""


class KernelLoadFailed(Exception):
    """A kernel file that the DSL could not load (truncated, damaged, of another DSL)."""


def _current_uid() -> int:
    """Whose files the user cache may hold: this process's effective user (tests replace it
    to see their own files as another user's)."""
    return os.geteuid()


def _trust_problem(st: os.stat_result, shown: str, directory: bool) -> Optional[str]:
    """Why an entry with status ``st`` may not serve kernels; None when it may."""
    if stat.S_ISLNK(st.st_mode):
        return f"{shown} is a symbolic link"
    if directory and not stat.S_ISDIR(st.st_mode):
        return f"{shown} is not a folder"
    if not directory and not stat.S_ISREG(st.st_mode):
        return f"{shown} is not a regular file"
    uid = _current_uid()
    if st.st_uid != uid:
        return f"{shown} is owned by uid {st.st_uid}, not by this process's user (uid {uid})"
    writable = [who for who, bit in (("its group", stat.S_IWGRP), ("other users", stat.S_IWOTH)) if st.st_mode & bit]
    if writable:
        return f"{shown} is writable by {' and '.join(writable)} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: an open never waits, whatever the entry turned into after the lstat before it
# (a FIFO's open for reading waits for a writer, for ever); the descriptor is checked then.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _not_followed(exc: OSError, name: str, dir_fd: Optional[int], shown: str) -> Exception:
    """What an open with O_NOFOLLOW that failed means: a symbolic link (ELOOP) or the wrong
    kind of entry is untrusted; anything else stays the OSError it is."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        try:
            st = os.lstat(name, dir_fd=dir_fd)
        except OSError:
            return exc
        return UntrustedEntry(_trust_problem(st, shown, directory=True) or f"{shown} cannot be opened ({exc})")
    return exc


def _open_checked_dir(name: str, dir_fd: Optional[int], shown: str, create: bool) -> int:
    """A descriptor of the folder ``name`` (under ``dir_fd``; None: an absolute path), made
    (0755 less the umask) when missing and ``create``, never through a symbolic link, checked
    on the descriptor itself."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        if not create:
            raise
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=dir_fd)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise _not_followed(exc, name, dir_fd, shown) from None
    except OSError as exc:
        raise _not_followed(exc, name, dir_fd, shown) from None
    problem = _trust_problem(os.fstat(fd), shown, directory=True)
    if problem is not None:
        os.close(fd)
        raise UntrustedEntry(problem)
    return fd


def _proc_path(dir_fd: int, name: Optional[str], fallback: Path) -> str:
    """A path that reaches what ``dir_fd`` (and ``name`` in it) is *now*, whatever happens to
    the folders above: ``/proc/self/fd/<fd>[/<name>]`` on Linux; elsewhere the checked path."""
    if os.path.isdir("/proc/self/fd"):
        return f"/proc/self/fd/{dir_fd}" + (f"/{name}" if name else "")
    return str(fallback)


class UserKernelDir:
    """One kind's folder of the user cache, ``<root>/<flavour>/<fingerprint>/<kind>``. It is
    reached from ``root`` one component at a time, none a symbolic link, each owned by this
    user and not writable by group or others (checked on the open descriptor); a kernel file
    the same, read through that descriptor."""

    def __init__(self, root: Path, parts: tuple[str, ...]):
        self.root, self.parts = Path(root), tuple(parts)

    @property
    def path(self) -> Path:
        return self.root.joinpath(*self.parts)

    @contextlib.contextmanager
    def opened(self, create: bool) -> Iterator[int]:
        """A descriptor of the checked folder (made when missing and ``create``). Raises
        UntrustedEntry, FileNotFoundError (a folder missing, not ``create``) or OSError."""
        fd = _open_checked_dir(str(self.root), None, str(self.root), create=False)
        try:
            shown = self.root
            for part in self.parts:
                shown = shown / part
                inner = _open_checked_dir(part, fd, str(shown), create)
                os.close(fd)
                fd = inner
            yield fd
        finally:
            os.close(fd)

    def load(self, name: str, load_module: Callable[[str], object]):
        """The kernel of file ``name`` loaded, None when there is none. Raises UntrustedEntry
        (not loaded, left in place: an export replaces it) or KernelLoadFailed (the file was
        removed: ours, since nobody else can write here)."""
        shown = self.path / name
        try:
            with self.opened(create=False) as dir_fd:
                try:
                    # Only a regular file is opened: a FIFO or a device where a kernel should
                    # be is refused before any open (which could block, or act on a device).
                    problem = _trust_problem(os.lstat(name, dir_fd=dir_fd), str(shown), directory=False)
                    if problem is not None:
                        raise UntrustedEntry(problem)
                    fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
                except FileNotFoundError:
                    return None
                except OSError as exc:
                    raise _not_followed(exc, name, dir_fd, str(shown)) from None
                try:
                    st = os.fstat(fd)
                    problem = _trust_problem(st, str(shown), directory=False)
                    if problem is not None:
                        raise UntrustedEntry(problem)
                    try:
                        return load_module(_proc_path(fd, None, shown))
                    except Exception as exc:  # noqa: BLE001  any failure of the DSL's loader
                        self._remove_if_unchanged(dir_fd, name, st)
                        raise KernelLoadFailed(f"{shown} could not be loaded ({type(exc).__name__}: "
                                               f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})")
                finally:
                    os.close(fd)
        except FileNotFoundError:
            return None  # a folder of the path is not there yet

    @staticmethod
    def _remove_if_unchanged(dir_fd: int, name: str, st: os.stat_result) -> None:
        # Only the file that failed: another process may have renamed a good one in since.
        with contextlib.suppress(OSError):
            now = os.lstat(name, dir_fd=dir_fd)
            if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                os.unlink(name, dir_fd=dir_fd)

    def export(self, name: str, write: Callable[[str], None]) -> None:
        """``write(path)`` writes a kernel file; it becomes ``name`` here only once complete:
        a temporary file in this folder, fsynced, renamed over ``name``, the folder fsynced.
        Raises UntrustedEntry or OSError (nothing is left behind then)."""
        with self.opened(create=True) as dir_fd:
            temp = f"{_TEMP_PREFIX}{name[:-2]}-{secrets.token_hex(4)}{_TEMP_SUFFIX}"
            os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                             dir_fd=dir_fd))
            try:
                write(_proc_path(dir_fd, temp, self.path / temp))
                fd = os.open(temp, _FILE_FLAGS, dir_fd=dir_fd)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp, dir_fd=dir_fd)
                raise
            os.fsync(dir_fd)
            self._remove_stale_temps(dir_fd)

    @staticmethod
    def _remove_stale_temps(dir_fd: int) -> None:
        # What a killed export left (never loaded: not a kernel's name); old enough that no
        # running export can still own it.
        cutoff = time.time() - _STALE_TEMP_S
        with contextlib.suppress(OSError), os.scandir(dir_fd) as entries:
            for entry in entries:
                if (entry.name.startswith(_TEMP_PREFIX) and entry.name.endswith(_TEMP_SUFFIX)
                        and entry.stat(follow_symlinks=False).st_mtime < cutoff):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.name, dir_fd=dir_fd)

    def clear(self) -> None:
        """Remove every file of this folder (upstream's ``clear``), never outside it."""
        with contextlib.suppress(FileNotFoundError), self.opened(create=False) as dir_fd, \
                os.scandir(dir_fd) as entries:
            for entry in entries:
                if not entry.is_dir(follow_symlinks=False):
                    os.unlink(entry.name, dir_fd=dir_fd)


def checked_user_root(root) -> tuple[Optional[Path], Optional[str]]:
    """``(the root to use, None)``, or ``(None, why it may not be used)``: a relative path; a
    folder that cannot be made; one not owned by this user or writable by group or others.
    The root is made when missing (0755 less the umask); a symbolic link to it is followed
    here, once, and the real path used from then on."""
    shown = str(root)
    if not os.path.isabs(shown):
        return None, (f"{shown!r} is a relative path (set {USER_CACHE_DIR_ENV} to an absolute one)")
    real = Path(os.path.realpath(shown))
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        os.close(_open_checked_dir(str(real), None, shown if real == Path(shown) else f"{shown} (= {real})",
                                   create=True))
    except UntrustedEntry as exc:
        return None, str(exc)
    except OSError as exc:
        return None, f"{shown} cannot be made or opened ({exc.strerror or exc})"
    return real, None
