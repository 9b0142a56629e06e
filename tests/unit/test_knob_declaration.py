"""The knob declaration (cmake/knobs.json) and what is made from it: docs/knobs.md's
tables and cibuildwheel's environment-pass must be what `python cmake/vfa_build knobs.knobs write`
makes, and every knob name the project reads must be declared."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from vfa_build.knobs import knobs

PROJECT = Path(__file__).resolve().parents[2]
BUILD_PY = str(PROJECT / "cmake" / "vfa_build")  # the build's entry point: BUILD_PY <module> [args]

# VFA_ words in the project that are not settings.
NOT_SETTINGS = {
    "VFA_FIRST_CALL": "the marker line benchmarks/first_call.py prints",
    "VFA_IMPORT_TIME": "the marker line benchmarks/import_time.py prints",
    "VFA_PRESTE": "the README's example of a typo",
}


def test_the_declaration_is_well_formed():
    declared = knobs.load()
    assert "VFA_BUILD_MEMORY_MB" in declared.knobs
    assert {k.scope for k in declared.knobs.values()} <= set(knobs.SCOPES)


def test_the_knob_tables_and_environment_pass_are_generated_from_it():
    diff = knobs.drift()
    assert diff == "", f"run `python cmake/vfa_build knobs.knobs write`:\n{diff}"


def test_cibuildwheel_passes_every_knob_marked_for_it():
    passed = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["cibuildwheel"]["linux"]["environment-pass"]
    declared = knobs.load()
    assert passed == knobs.environment_pass(declared)
    # The ones the issue found missing, among them what the README tells container users to set.
    for name in ("VFA_BUILD_MEMORY_MB", "VFA_JOB_MEMORY_MB", "VFA_FA3_HEAD_DIMS", "VFA_FA2_PTX", "VFA_BUILD_FA3",
                 "VFA_FATBIN_COMPRESSION", "VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION", "VFA_CUDA_MAJOR"):
        assert name in passed
    # Paths of the host have no meaning in the container (it sets its own source cache).
    assert "VFA_SOURCE_CACHE" not in passed and "FLASH_ATTN_SRC_DIR" not in passed


def test_check_fails_on_a_hand_edit(tmp_path):
    """`knobs.py check` (what a developer runs) sees a table edited by hand."""
    for rel in (knobs.KNOBS_DOC, "pyproject.toml", "cmake/knobs.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((PROJECT / rel).read_text())
    readme = tmp_path / knobs.KNOBS_DOC
    readme.write_text(readme.read_text().replace("| `VFA_PRESET` | `full`, `minimal` | `full` |",
                                                 "| `VFA_PRESET` | `full`, `minimal` | `minimal` |"))
    assert "-| `VFA_PRESET` | `full`, `minimal` | `minimal` |" in knobs.drift(tmp_path)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(re.sub(r'"VFA_BUILD_MEMORY_MB",\s*', "", pyproject.read_text()))
    added = [line for line in knobs.drift(tmp_path).splitlines() if line.startswith("+ ")]
    assert any('"VFA_BUILD_MEMORY_MB"' in line for line in added), added
    out = subprocess.run([sys.executable, BUILD_PY, "knobs.knobs", "check"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr  # the real project is in order


def _declaration_with(tmp_path, name, **entry) -> Path:
    data = json.loads((PROJECT / "cmake/knobs.json").read_text())
    data["knobs"][name] = entry
    path = tmp_path / "knobs.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("entry, message", [
    ({"type": "bool", "default": "maybe", "scope": "build", "cibuildwheel": True, "doc": "x"},
     "the default 'maybe' is not one of"),
    ({"type": "bool", "default": "yes", "scope": "build", "cibuildwheel": True, "doc": "x"},
     "write the default as one of ON, OFF"),
    ({"type": "int", "default": "0", "min": 1, "max": 9, "scope": "build", "cibuildwheel": True, "doc": "x"},
     "is not an integer from 1 to 9"),
    ({"type": "choice", "default": "a", "scope": "build", "cibuildwheel": True, "doc": "x"},
     "choices are required"),
    ({"type": "int", "default": "", "min": 1, "max": 9, "scope": "build", "cibuildwheel": True, "doc": "x"},
     "needs default_doc"),
    ({"type": "string", "default": "", "scope": "build", "doc": "x"}, "missing fields ['cibuildwheel']"),
    ({"type": "string", "default": "", "scope": "build", "cibuildwheel": True, "doc": "x", "defualt": "y"},
     "unknown fields ['defualt']"),
    ({"type": "float", "default": "", "scope": "build", "cibuildwheel": True, "doc": "x"}, "type 'float'"),
])
def test_a_malformed_declaration_is_refused(tmp_path, entry, message):
    with pytest.raises(knobs.DeclarationError, match=re.escape(message)):
        knobs.load(_declaration_with(tmp_path, "VFA_NEW_KNOB", **entry))


def test_a_name_declared_twice_is_refused(tmp_path):
    path = _declaration_with(tmp_path, "VFA_OTHER", type="string", default="", scope="build", cibuildwheel=True,
                             doc="x", env=["VFA_PRESET"])
    with pytest.raises(knobs.DeclarationError, match="names declared twice: VFA_PRESET"):
        knobs.load(path)


def test_every_setting_the_project_reads_is_declared():
    """A VFA_* name in code, scripts or docs that the declaration lacks would be warned
    about as a typo at configure time (and missing from docs/knobs.md)."""
    listed = subprocess.run(
        ["git", "grep", "-ohE", r"\bVFA_[A-Z0-9_]*[A-Z0-9]\b", "--", "python", "benchmarks", ".buildkite", ".ci",
         "tests/gpu", "README.md", "docs", "pyproject.toml"],
        cwd=PROJECT, capture_output=True, text=True, check=True).stdout.split()
    declared = set(knobs.load().known_names())
    assert sorted(set(listed) - declared - set(NOT_SETTINGS)) == []


def test_every_knob_cmake_reads_is_declared_for_the_build():
    calls = set()
    for path in [*(PROJECT / "cmake").glob("*.cmake"), PROJECT / "CMakeLists.txt"]:
        calls |= set(re.findall(r"vfa_option\(([A-Z][A-Z0-9_]+)[ )]", path.read_text()))
    declared = knobs.load()
    assert calls and calls <= {k.name for k in declared.scope("build")}


@pytest.mark.parametrize("typo, meant", [("VFA_PRESTE", "VFA_PRESET"), ("VFA_SOURCE_CACHEE", "VFA_SOURCE_CACHE"),
                                         ("vfa_fa2_ptx", "VFA_FA2_PTX"), ("VFA_BUILD_MEM_MB", "VFA_BUILD_MEMORY_MB"),
                                         ("VFA_XYZZY", None)])
def test_did_you_mean(typo, meant):
    assert knobs.suggestions([typo], knobs.load()).get(typo) == meant


def test_suggest_command_prints_pairs_for_cmake():
    out = subprocess.run([sys.executable, BUILD_PY, "knobs.knobs", "suggest", "VFA_PRESTE", "VFA_XYZZY"],
                         capture_output=True, text=True, check=True)
    assert out.stdout == "VFA_PRESTE=VFA_PRESET\n"


# --- one bool-word list, one head-dim table: every reader takes them from the declaration ---

READERS_SCRIPT = """include("{cmake}/KernelSelection.cmake")
vfa_option(VFA_FA2_PTX)
message(NOTICE "ON=${{VFA_BOOL_WORDS_ON}}")
message(NOTICE "OFF=${{VFA_BOOL_WORDS_OFF}}")
message(NOTICE "TEXT=${{VFA_BOOL_WORDS_TEXT}}")
message(NOTICE "FA2=${{VFA_FA2_ALL_HEAD_DIMS}}")
message(NOTICE "FA3=${{VFA_FA3_ALL_HEAD_DIMS}}")
message(NOTICE "PTX=${{VFA_FA2_PTX}}")
"""

PYTHON_READERS = """import json, sys
sys.path.insert(0, sys.argv[1])
from vfa_build.knobs import knobs
from vendored_flash_attn.declaration import kernels, knob_values as declaration, versioning
print(json.dumps({"knobs.py": [knobs.BOOL_ON, knobs.BOOL_OFF],
                  "declaration/knob_values.py": [declaration.BOOL_ON, declaration.BOOL_OFF, declaration.BOOL_WORDS_TEXT],
                  "kernels.py": [kernels.FA2_HEAD_DIM_BUCKETS, kernels.FA3_HEAD_DIM_BUCKETS],
                  "versioning.py": versioning.want_local({"VFA_VERSION_LOCAL": sys.argv[2]}, False),
                  "knobs.py value check": knobs.value_problem(knobs.load().knobs["VFA_FA2_PTX"], sys.argv[2])}))
"""


def read_by_every_reader(project: Path, word: str, work: Path) -> tuple[dict, dict]:
    """What the CMake readers and the Python readers of <project> take from its declaration;
    <word> is given to a bool knob each side (VFA_FA2_PTX, VFA_VERSION_LOCAL)."""
    script = work / "readers.cmake"
    script.write_text(READERS_SCRIPT.format(cmake=project / "cmake"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VFA_")}
    out = subprocess.run([str(Path(sys.executable).parent / "cmake"), "-P", str(script)], capture_output=True,
                         text=True, env={**env, "VFA_FA2_PTX": word})
    assert out.returncode == 0, out.stdout + out.stderr
    cmake = dict(line.split("=", 1) for line in out.stderr.splitlines() + out.stdout.splitlines() if "=" in line)
    out = subprocess.run([sys.executable, "-c", PYTHON_READERS, str(project / "cmake"), word], capture_output=True,
                         text=True, env={**env, "PYTHONPATH": str(project / "python")})
    assert out.returncode == 0, out.stdout + out.stderr
    return cmake, json.loads(out.stdout)


def test_every_reader_takes_the_bool_words_and_head_dims_from_the_declaration(tmp_path):
    data = json.loads((PROJECT / "cmake/knobs.json").read_text())
    on, off = data["bool_words"]["on"], data["bool_words"]["off"]
    fa2 = [int(h) for h in data["knobs"]["VFA_FA2_HEAD_DIMS"]["choices"]]
    fa3 = [int(h) for h in data["knobs"]["VFA_FA3_HEAD_DIMS"]["choices"]]
    cmake, python = read_by_every_reader(PROJECT, "yes", tmp_path)
    assert cmake["ON"].split(";") == on and cmake["OFF"].split(";") == off
    assert cmake["FA2"].split(";") == [str(h) for h in fa2] and cmake["FA3"].split(";") == [str(h) for h in fa3]
    assert python["knobs.py"] == [on, off]
    assert python["declaration/knob_values.py"] == [[w.lower() for w in on], [w.lower() for w in off], cmake["TEXT"]]
    assert python["kernels.py"] == [fa2, fa3]


def test_a_change_of_the_declaration_reaches_every_reader(tmp_path):
    """A bool word and an FA3 head dim added to a copy of the project's declaration: CMake,
    cmake/vfa_build/knobs/knobs.py and the package all take them, with no other edit."""
    project = tmp_path / "project"
    for folder in ("cmake", "python/vendored_flash_attn"):
        shutil.copytree(PROJECT / folder, project / folder, ignore=shutil.ignore_patterns("__pycache__"))
    declaration = project / "cmake/knobs.json"
    data = json.loads(declaration.read_text())
    data["bool_words"]["on"].append("JA")
    data["bool_words"]["off"].append("NEIN")
    data["knobs"]["VFA_FA3_HEAD_DIMS"]["choices"].append("512")
    declaration.write_text(json.dumps(data))

    cmake, python = read_by_every_reader(project, "nein", tmp_path)
    assert cmake["OFF"].endswith(";NEIN") and cmake["PTX"] == "OFF"  # CMake normalises the new word
    assert cmake["TEXT"].endswith("JA/NEIN (any case)")
    assert cmake["FA3"].endswith(";256;512")
    assert python["knobs.py"][1][-1] == "NEIN" and python["knobs.py value check"] is None
    assert python["declaration/knob_values.py"][1][-1] == "nein" and python["versioning.py"] is False
    assert python["kernels.py"][1][-1] == 512
