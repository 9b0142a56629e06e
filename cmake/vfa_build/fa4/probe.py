"""FA4's probe: what the build's Python can do for FA4 (stage it? precompile its kernels?).

``cmake/vfa_build/fa4/precompile.py probe`` prints it as JSON for cmake/FA4Package.cmake: ``stage`` and
``precompile`` are "" when this Python can, else why not (a reason that ships in FA4's build
record, so it names Python by version, never by path). Standard library only: the fa4 extra
is read from installed metadata, cutlass is never imported here.
"""

from __future__ import annotations

import sys

from vendored_flash_attn.families.fa4 import deps as fa4_deps


def probe(named: bool = False) -> dict:
    """What the build's Python can do: "" when it can, else why not (CMake reads this).

    stage: fa4_deps.pin_drift needs packaging and tomllib/tomli. precompile: torch and the
    fa4 extra in its pinned versions (read from metadata: cutlass is not imported here).
    ``named``: this is an interpreter of VFA_FA4_PRECOMPILE_PYTHONS, not the build's Python:
    a reason names it (its path: it goes into the configure's error, never the record) and what
    it lacks, with the command that installs it there.
    """
    import importlib.util

    stage_missing = [m for m in ("packaging",) if importlib.util.find_spec(m) is None]
    if importlib.util.find_spec("tomllib") is None and importlib.util.find_spec("tomli") is None:
        stage_missing.append("tomli")
    # Named by version, not path: the reasons go into FA4's build record, which ships
    # (CMake's own messages name the interpreter's path).
    python = f"Python {sys.version_info.major}.{sys.version_info.minor}"
    stage_reason = f"the build's {python} lacks {', '.join(stage_missing)}" if stage_missing else ""
    if stage_reason and named:
        # Not "FA4 is not staged": the build's Python staged it; this one reads the staged copy's
        # pin check (fa4_deps) before it compiles, and cannot.
        lacks = ", ".join(stage_missing)
        reason = (f"{python} at {sys.executable} lacks {lacks}, which it needs to compile FA4's kernels "
                  f"(it checks the staged copy's dependencies first): install {lacks} into it "
                  f"({sys.executable} -m pip install {' '.join(stage_missing)}; a system Python: its distribution's "
                  f"package), or leave it out of the knob")
        return {"stage": reason, "precompile": reason, "python": python[7:]}
    if stage_reason:
        return {"stage": stage_reason, "precompile": "FA4 is not staged: " + stage_reason, "python": python[7:]}
    problems = fa4_deps.problems()
    if importlib.util.find_spec("torch") is None:
        problems.append("torch is not installed")
    precompile_reason = ""
    absent = fa4_deps.not_installed()
    if problems and len(absent) == len(problems):
        # One short line (issue 29: this was 560 characters): the names, and the command.
        names = ", ".join(fa4_deps.requirement_name(r) for r in absent)
        precompile_reason = f"{python} lacks FA4's packages ({names}): {fa4_deps.INSTALL_COMMAND}"
    elif problems:
        precompile_reason = (f"the build's {python} lacks FA4's dependencies: "
                             + "; ".join(problems) + f" (install them with: {fa4_deps.INSTALL_COMMAND})")
    return {"stage": "", "precompile": precompile_reason, "python": python[7:]}

