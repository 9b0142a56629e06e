"""The project's declaration, ``cmake/knobs.json``, as the package reads it: the bool
words every knob takes and the head dims each module can build (the choices of
``VFA_FA2_HEAD_DIMS`` / ``VFA_FA3_HEAD_DIMS``). CMake reads the same file
(``cmake/Options.cmake``, ``cmake/KernelSelection.cmake``) and installs it at the package
root (``cmake/BuildInfo.cmake``); from a source checkout it is read where it lives.
Standard library only: the version provider imports this during a build.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

DECLARATION_FILE = "knobs.json"
_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the package root, where knobs.json is installed


def declaration_path() -> Path:
    """The installed copy, else the checkout's ``cmake/knobs.json``."""
    for path in (_PACKAGE_DIR / DECLARATION_FILE, _PACKAGE_DIR.parents[1] / "cmake" / DECLARATION_FILE):
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{DECLARATION_FILE} is neither installed next to {_PACKAGE_DIR} nor in a source checkout's cmake/; "
        "install the package with `pip install .` (or a built wheel)")


def load(path: Optional[Path] = None) -> dict[str, Any]:
    return json.loads(Path(path or declaration_path()).read_text(encoding="utf-8"))


def bool_words(data: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(ON words, OFF words), lower case."""
    words = data["bool_words"]
    return tuple(w.lower() for w in words["on"]), tuple(w.lower() for w in words["off"])


def bool_words_text(data: dict[str, Any]) -> str:
    """"ON/OFF, 1/0, TRUE/FALSE, YES/NO (any case)", as CMake's messages say it."""
    words = data["bool_words"]
    return ", ".join(f"{on}/{off}" for on, off in zip(words["on"], words["off"])) + " (any case)"


def head_dims(data: dict[str, Any], version: int) -> tuple[int, ...]:
    """The head dims FA<version> can be built for, ascending: the choices of its family's
    head-dim knob (``families`` in the declaration)."""
    family = next(f for name, f in data["families"].items()
                  if isinstance(f, dict) and f.get("version") == version)
    return tuple(sorted(int(h) for h in data["knobs"][family["head_dims_knob"]]["choices"]))


def __getattr__(name: str) -> Any:
    """BOOL_ON, BOOL_OFF, BOOL_WORDS_TEXT, FA2_HEAD_DIMS, FA3_HEAD_DIMS: read from the
    declaration at first use, not at import, so the declaration's validator
    (families.problems, which the configure runs) can name a mistake in it instead of this
    module failing to import."""
    derived = {"BOOL_ON": lambda d: bool_words(d)[0], "BOOL_OFF": lambda d: bool_words(d)[1],
               "BOOL_WORDS_TEXT": bool_words_text, "FA2_HEAD_DIMS": lambda d: head_dims(d, 2),
               "FA3_HEAD_DIMS": lambda d: head_dims(d, 3)}
    if name not in derived:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = derived[name](_declaration())
    globals()[name] = value
    return value


_LOADED: Optional[dict[str, Any]] = None


def _declaration() -> dict[str, Any]:
    global _LOADED
    if _LOADED is None:
        _LOADED = load()
    return _LOADED
