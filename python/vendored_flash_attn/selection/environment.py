"""The machine as the runtime sees it: build info, GPUs, module imports, env vars.

All probing goes through one ``Environment`` object so that (1) expensive answers
(compute capability per device, whether a compiled module imports) are computed once
per process, and (2) tests can swap in a ``StaticEnvironment`` describing any machine
without a GPU or compiled modules (``set_environment`` / ``use_environment``).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Optional

from ..declaration.build_info import BuildInfo, BuildInfoMissing, load_build_info
from ..declaration.families import Family, registry

# The package root (vendored_flash_attn), where the compiled modules are installed.
_PACKAGE = __name__.partition(".")[0]


class Environment:
    """Interface of a machine description. Subclasses answer; callers never probe directly."""

    #: device type the kernels run on; tensors must live there.
    device_type: str = "cuda"

    def build_info(self) -> BuildInfo:
        """The build record; raises BuildInfoMissing when the package has none."""
        raise NotImplementedError

    def device_count(self) -> int:
        raise NotImplementedError

    def current_device(self) -> int:
        raise NotImplementedError

    def capability(self, index: int) -> tuple[int, int]:
        raise NotImplementedError

    def device_name(self, index: int) -> str:
        return f"{self.device_type}:{index}"

    def load_module(self, version: int) -> Optional[str]:
        """Make the family of ``version`` ready to call: import its compiled module, or (a
        family of staged Python kernels, FA4) find its subpackage and check its dependencies
        without importing them. None when it is ready, else why not."""
        raise NotImplementedError

    def getenv(self, name: str) -> Optional[str]:
        raise NotImplementedError

    def getenv_lookup(self, name: str) -> tuple[Callable[[object], object], object]:
        """``(lookup, key)``: ``lookup(key)`` answers, on each call, a value equal to another of its
        answers exactly when the variable's values are equal (None: unset) - what a cache keyed on
        the variable may hold, read in the least time this environment allows (the interface reads
        VLLM_FLASH_ATTN_VERSION on every fa_version=None call). By default getenv itself."""
        return self.getenv, name

    def runtime_versions(self) -> dict:
        """torch / CUDA versions of this process, for ``info``."""
        return {}


# os.environ.get(name), in a tenth of the time: the hot path reads
# VLLM_FLASH_ATTN_VERSION on every fa_version=None call, and os.environ.get goes through
# Mapping.get, __getitem__ and key encoding (~0.5 us). CPython's os.environ keeps the
# encoded variables in a dict (_data) that every change made through os.environ updates;
# where that is not so, os.environ.get it is.
_ENVIRON_DATA = getattr(os.environ, "_data", None)
_ENCODE_KEY = getattr(os.environ, "encodekey", None)
_DECODE_VALUE = getattr(os.environ, "decodevalue", None)
_encoded_keys: dict = {}


def _read_environ(name: str) -> Optional[str]:
    if not isinstance(_ENVIRON_DATA, dict) or _ENCODE_KEY is None or _DECODE_VALUE is None:
        return os.environ.get(name)
    key = _encoded_keys.get(name)
    if key is None:
        key = _encoded_keys[name] = _ENCODE_KEY(name)
    raw = _ENVIRON_DATA.get(key)
    return None if raw is None else _DECODE_VALUE(raw)


class SystemEnvironment(Environment):
    """The real machine, probed lazily through torch and cached for the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._capabilities: dict[int, tuple[int, int]] = {}
        self._names: dict[int, str] = {}
        self._modules: dict[int, Optional[str]] = {}
        self._count: Optional[int] = None

    def build_info(self) -> BuildInfo:
        return load_build_info()

    def device_count(self) -> int:
        if self._count is None:
            try:
                import torch

                self._count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            except Exception:  # no torch CUDA support at all: treat as no GPU
                self._count = 0
        return self._count

    def current_device(self) -> int:
        import torch

        return torch.cuda.current_device()

    def capability(self, index: int) -> tuple[int, int]:
        cap = self._capabilities.get(index)
        if cap is None:
            import torch

            cap = tuple(torch.cuda.get_device_capability(index))
            self._capabilities[index] = cap
        return cap

    def device_name(self, index: int) -> str:
        name = self._names.get(index)
        if name is None:
            import torch

            name = self._names[index] = torch.cuda.get_device_name(index)
        return name

    def load_module(self, version: int) -> Optional[str]:
        if version in self._modules:
            return self._modules[version]
        with self._lock:
            if version not in self._modules:
                family = registry()[version]
                self._modules[version] = (_import_module(version, self._module_name(family))
                                          if family.compiled else _probe_packaged(family))
        return self._modules[version]

    def _module_name(self, family: Family) -> str:
        try:
            name = self.build_info().component(family.version).module
        except BuildInfoMissing:
            name = ""
        return name or family.module

    # The interface reads VLLM_FLASH_ATTN_VERSION on every fa_version=None call: the method
    # is the function itself, one Python frame fewer.
    getenv = staticmethod(_read_environ)

    def getenv_lookup(self, name: str) -> tuple[Callable[[object], object], object]:
        # os.environ's own dictionary, asked for the encoded name: the encoded value (bytes on
        # POSIX), equal exactly when the values are; no frame, no decoding (a fifth of getenv's time).
        if isinstance(_ENVIRON_DATA, dict) and _ENCODE_KEY is not None:
            return _ENVIRON_DATA.get, _ENCODE_KEY(name)
        return os.environ.get, name

    def runtime_versions(self) -> dict:
        try:
            import torch
        except ImportError as exc:
            return {"torch": None, "torch_error": str(exc)}
        return {"torch": torch.__version__, "cuda": torch.version.cuda}


def _import_module(version: int, name: str) -> Optional[str]:
    # Importing the module registers its ops under torch.ops.<name>. Any failure
    # (missing file, undefined symbol, torch ABI mismatch) is reported, not raised.
    try:
        import torch  # noqa: F401  (the extension needs torch loaded first)

        importlib.import_module(f"{_PACKAGE}.{name}")
    except Exception as exc:  # ImportError, OSError, RuntimeError from static init
        return f"{type(exc).__name__}: {exc}"
    return None


def _probe_packaged(family: Family) -> Optional[str]:
    # A plain query (is_fa_version_supported, the selector, `info`) must not import the
    # family's code: for FA4 that is cutlass, seconds long and possibly failing. The
    # subpackage is found (its parents imported: empty packages), the dependencies are read
    # from installed metadata; the import itself happens at the first call (the adapter).
    try:
        found = importlib.util.find_spec(family.probe) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return (f"{family.probe} is not in this installation ({family.build_knob}=off, or the build "
                "could not stage it)")
    try:
        missing = family.resolve(family.deps_check)()
    except Exception as exc:  # noqa: BLE001 - a query reports, never raises
        missing = [str(exc)]
    if missing:
        return (f"its dependencies are not installed in the versions the pinned upstream declares: "
                f"{'; '.join(missing)}. Install them with: {family.install}")
    return None


@dataclass
class StaticEnvironment(Environment):
    """A described machine, for tests and what-if questions.

    ``capabilities`` lists one (major, minor) per visible GPU; ``module_errors`` maps a
    version to its import error (absent or None: it loads); ``build`` None means the
    build info is missing.
    """

    build: Optional[BuildInfo] = None
    capabilities: tuple[tuple[int, int], ...] = ()
    module_errors: Mapping[int, Optional[str]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    device_type: str = "cuda"
    current: int = 0
    names: tuple[str, ...] = ()
    load_calls: list = field(default_factory=list)

    def build_info(self) -> BuildInfo:
        if self.build is None:
            raise BuildInfoMissing("build_info.json is missing (described environment)")
        return self.build

    def device_count(self) -> int:
        return len(self.capabilities)

    def current_device(self) -> int:
        return self.current

    def capability(self, index: int) -> tuple[int, int]:
        return tuple(self.capabilities[index])

    def device_name(self, index: int) -> str:
        return self.names[index] if index < len(self.names) else f"GPU {index}"

    def load_module(self, version: int) -> Optional[str]:
        self.load_calls.append(version)
        return self.module_errors.get(version)

    def getenv(self, name: str) -> Optional[str]:
        return self.env.get(name)

    def runtime_versions(self) -> dict:
        return {"torch": "described", "cuda": None}


_current: Optional[Environment] = None
_generation = 0  # bumped on every swap so caches keyed on it go stale
_listeners: list = []


def current_environment() -> Environment:
    global _current
    if _current is None:
        _current = SystemEnvironment()
    return _current


def environment_generation() -> int:
    return _generation


def on_environment_change(callback) -> None:
    """Register a cache-clearing callback run whenever the environment is swapped."""
    _listeners.append(callback)


def set_environment(env: Optional[Environment]) -> Optional[Environment]:
    """Replace the environment (None: the real machine again); returns the previous one."""
    global _current, _generation
    previous, _current = _current, env
    _generation += 1
    for callback in _listeners:
        callback()
    return previous


@contextlib.contextmanager
def use_environment(env: Environment) -> Iterator[Environment]:
    previous = set_environment(env)
    try:
        yield env
    finally:
        set_environment(previous)
