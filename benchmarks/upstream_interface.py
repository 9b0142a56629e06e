"""Upstream's own Python wrapper of the pinned commit, ``vllm_flash_attn/flash_attn_interface.py``,
loaded at run time and pointed at this wheel's compiled ops, for benchmarks/overhead.py's
side-by-side comparison of per-call overhead.

The file is never part of this repository (like upstream's test file, tests/upstream/): it is
read from a git repository holding the pinned commit (``git show <pin>:<path>``) or from a
path (on the GPU machine: ``.upstream-tests/flash_attn_interface.py``, an ignored folder the
working tree carries), and its git blob hash must be the pinned file's before a line of it
runs. It is executed as the module ``flash_attn_interface`` of a private package whose
``_vllm_fa2_C`` / ``_vllm_fa3_C`` are this wheel's compiled modules, and ``torch.ops._vllm_fa2_C``
/ ``_vllm_fa3_C`` are made the wheel's op namespaces (``_vendored_fa2_C`` / ``_vendored_fa3_C``)
for as long as the comparison runs: attribute lookups then cost what they cost upstream (torch
caches a namespace as an attribute of ``torch.ops`` on first use). A process where a real
``_vllm_fa*_C`` namespace exists (vLLM's own build loaded) is refused: the aliases would hide it.
``flash_attn`` is made unimportable while the file loads: its probe for FA4 (``from
flash_attn.cute.interface import ...``) then takes its ImportError branch instead of
importing whatever ``flash_attn`` this machine has.

FA4's upstream interface is the wheel's own copy of ``flash_attn/cute`` at the pin
(``vendored_flash_attn._fa4.cute.interface``, verified by the build: only its imports are
rewritten), so it needs no loading here.
"""

from __future__ import annotations

# Why this file names families: upstream's own wrapper (its flash_attn_interface.py) knows
# two op namespaces, _vllm_fa2_C and _vllm_fa3_C, and fa_version 2 and 3; NAMESPACES maps
# upstream's names onto this package's modules, facts of upstream's file at the pin.

import contextlib
import hashlib
import importlib
import subprocess
import sys
import types
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM_PATH = "vllm_flash_attn/flash_attn_interface.py"
# git blob hash of UPSTREAM_PATH at the pinned commit (git rev-parse <pin>:<path>).
PINNED_BLOBS = {"617264c1c7955c9e84817654ebeedff069f3c5f1": "a61d0f9613a86b97dfdf3dd54124aa6b877fcd8a"}
CARRIED = ROOT / ".upstream-tests" / "flash_attn_interface.py"
PACKAGE = "_vfa_upstream_vllm_flash_attn"
NAMESPACES = {"_vllm_fa2_C": ("_vendored_fa2_C", 2), "_vllm_fa3_C": ("_vendored_fa3_C", 3)}
GIT_TIMEOUT_S = 60


class UpstreamFileError(RuntimeError):
    """Upstream's file cannot be had or is not the pinned one; the message says what to do."""


def git_blob_hash(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def pinned_commit() -> str:
    sys.path.insert(0, str(ROOT / "tests" / "upstream"))
    try:
        from run_upstream_tests import pinned_commit as read  # the pin's one reader for tests/benchmarks
    finally:
        sys.path.pop(0)
    return read(ROOT / "vendor" / "flash-attention" / "pin.json")


def read_source(path: Optional[Path] = None, git_repo: Optional[str] = None,
                commit: Optional[str] = None, allow_other: bool = False) -> tuple[bytes, dict]:
    """Upstream's file and where it came from; refused unless its blob is the pinned one."""
    commit = commit or pinned_commit()
    if git_repo:
        try:
            done = subprocess.run(["git", "-C", git_repo, "show", f"{commit}:{UPSTREAM_PATH}"],
                                  capture_output=True, timeout=GIT_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise UpstreamFileError(f"git show in {git_repo} failed: {exc}") from exc
        if done.returncode:
            raise UpstreamFileError(f"{git_repo} has no {UPSTREAM_PATH} at {commit}: "
                                    f"{done.stderr.decode(errors='replace').strip()}")
        data, source = done.stdout, f"git {git_repo} {commit}:{UPSTREAM_PATH}"
    else:
        path = Path(path) if path else CARRIED
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise UpstreamFileError(
                f"no upstream wrapper at {path} ({exc.strerror}): write it with `git -C <clone or mirror of "
                f"vllm-project/flash-attention> show {commit}:{UPSTREAM_PATH} > {CARRIED.relative_to(ROOT)}`") from exc
        source = f"file {path}"
    blob, expected = git_blob_hash(data), PINNED_BLOBS.get(commit)
    info = {"source": source, "commit": commit, "blob": blob, "expected_blob": expected,
            "matches_pin": blob == expected}
    if blob != expected and not allow_other:
        raise UpstreamFileError(f"upstream's wrapper ({source}) has git blob {blob}, but {UPSTREAM_PATH} at "
                                f"{commit} is {expected}: not the pinned file, not run")
    return data, info


@contextlib.contextmanager
def op_aliases() -> Iterator[None]:
    """torch.ops._vllm_fa2_C / _vllm_fa3_C as this wheel's namespaces, for the block."""
    import torch

    present = [name for name in NAMESPACES if name in vars(torch.ops)]
    if present:
        raise UpstreamFileError(f"torch.ops already has {', '.join(present)} in this process (vLLM's own build "
                                "loaded?): aliasing it to this wheel's ops would hide it; compare in a fresh process")
    try:
        for name, (ours, _) in NAMESPACES.items():
            setattr(torch.ops, name, getattr(torch.ops, ours))
        yield
    finally:
        for name in NAMESPACES:
            vars(torch.ops).pop(name, None)


def load(source: bytes, label: str = "") -> types.ModuleType:
    """Execute upstream's file as ``<private package>.flash_attn_interface`` over this
    wheel's compiled modules (those that import); returns the module."""
    package = types.ModuleType(PACKAGE)
    package.__path__ = []  # a package: relative imports resolve against sys.modules
    saved = {name: sys.modules.get(name) for name in (PACKAGE, "flash_attn")}
    sys.modules[PACKAGE] = package
    sys.modules["flash_attn"] = None  # its FA4 probe: ImportError, nothing imported
    for name, (ours, version) in NAMESPACES.items():
        try:
            module = importlib.import_module(f"vendored_flash_attn.{ours}")
        except ImportError:
            continue  # upstream's file records the family as unavailable, as it would
        sys.modules[f"{PACKAGE}.{name}"] = module
        setattr(package, name, module)
    module = types.ModuleType(f"{PACKAGE}.flash_attn_interface")
    module.__package__ = PACKAGE
    try:
        exec(compile(source, f"<upstream {UPSTREAM_PATH} {label}>", "exec"), module.__dict__)  # noqa: S102
    finally:
        for name, value in saved.items():
            if name == PACKAGE:
                continue
            if value is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = value
    sys.modules[module.__name__] = module
    return module
