"""The one way the build runs its Python: a module of this package as a script.

    python -E -s -S <project>/cmake/vfa_build <module> [args...]
    e.g.  python -E -s -S cmake/vfa_build sources.staged_tree stage --source ... --store ...

Python runs this file with the package's own folder as sys.path[0]; it is replaced by the
folder that holds the package (<project>/cmake), so every module imports its siblings as
``vfa_build.<concern>.<module>`` and nothing else of the project is importable by accident.
Then ``vfa_build.<module>`` runs as ``__main__`` (sys.argv[0] its file, the rest its arguments).
Standard library only, and small: the compile launcher (units.compile_unit) starts through
here once per translation unit.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _module_file(name: str) -> str:
    """The file of vfa_build.<name>, or "" when <name> is not a module of this package."""
    parts = name.split(".")
    if not name or not all(p.isidentifier() and not p.startswith("__") for p in parts):
        return ""
    path = os.path.join(_HERE, *parts) + ".py"
    return path if os.path.isfile(path) else ""


def main() -> None:
    if len(sys.argv) < 2 or not _module_file(sys.argv[1]):
        given = f"unknown module {sys.argv[1]!r}" if len(sys.argv) > 1 else "no module given"
        sys.exit(f"vfa_build: {given}: usage: python -E -s -S {_HERE} <module> [args...] "
                 "(a module of the package, dotted, e.g. sources.staged_tree)")
    if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
        sys.path[0] = os.path.dirname(_HERE)
    else:
        sys.path.insert(0, os.path.dirname(_HERE))
    module = "vfa_build." + sys.argv[1]
    del sys.argv[1]
    import runpy
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
