"""The build's CMake code reads the kernel families where the package does: the
``families`` section of cmake/knobs.json (cmake/Options.cmake's vfa_declared_families /
vfa_family_field; python/vendored_flash_attn/declaration/families.py on the package's side). Run in
script mode (`cmake -P`, a fraction of a second). The configure that follows a changed
declaration: tests/build/test_families_configure.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from support.cmake_runner import clean_env, run, tool
from vendored_flash_attn.declaration import families

CMAKE_DIR = Path(__file__).resolve().parents[2] / "cmake"
FIELDS = ("made", "build_knob", "module", "record", "capabilities;min", "head_dims_knob", "dtypes_knob")


def cmake_families(tmp_path: Path, cmake_dir: Path = CMAKE_DIR) -> dict[str, dict[str, str]]:
    """{family: {field: value}} as the CMake code reads them, in the order it iterates them,
    plus "compiled": whether it is among vfa_declared_families(... extension)."""
    script = tmp_path / "families.cmake"
    script.write_text(
        f'include("{cmake_dir / "Options.cmake"}")\n'
        'vfa_declared_families(all)\n'
        'vfa_declared_families(compiled extension)\n'
        'foreach(family IN LISTS all)\n'
        f'  foreach(field IN ITEMS {" ".join(repr(f).replace(chr(39), chr(34)) for f in FIELDS)})\n'
        '    vfa_family_field(value ${family} "${field}" "")\n'
        '    message(NOTICE "FAMILY ${family}|${field}|${value}")\n'
        '  endforeach()\n'
        '  set(is_compiled NO)\n'
        '  if(family IN_LIST compiled)\n'
        '    set(is_compiled YES)\n'
        '  endif()\n'
        '  message(NOTICE "FAMILY ${family}|compiled|${is_compiled}")\n'
        'endforeach()\n')
    result = run([tool("cmake"), "-P", str(script)], env=clean_env())
    assert result.returncode == 0, result.output
    found: dict[str, dict[str, str]] = {}
    for line in result.output.splitlines():
        if line.startswith("FAMILY "):
            name, field, value = line[len("FAMILY "):].split("|", 2)
            found.setdefault(name, {})[field] = value
    return found


def expected(registry: families.Registry) -> dict[str, dict[str, str]]:
    """The same facts as the package's reader of the declaration has them."""
    return {f.name: {"made": f.made, "build_knob": f.build_knob, "module": f.module, "record": f.record,
                     "capabilities;min": f.raw["capabilities"]["min"], "head_dims_knob": f.head_dims_knob or "",
                     "dtypes_knob": f.dtypes_knob or "", "compiled": "YES" if f.compiled else "NO"}
            for f in sorted(registry, key=lambda f: f.name)}


def test_cmake_reads_the_families_the_package_reads(tmp_path):
    found = cmake_families(tmp_path)
    assert found == expected(families.registry())
    assert list(found) == sorted(found)  # name order: what the build loops, messages and records follow


def test_a_family_added_to_the_declaration_reaches_the_cmake_code(tmp_path):
    """A copied declaration with a fifth family (and FA3's build record under another key):
    the CMake reader lists it among the compiled ones, with its declared facts."""
    cmake_dir = tmp_path / "cmake"
    cmake_dir.mkdir()
    shutil.copy(CMAKE_DIR / "Options.cmake", cmake_dir)
    shutil.copy(CMAKE_DIR / "BuildPython.cmake", cmake_dir)
    data = json.loads((CMAKE_DIR / "knobs.json").read_text())
    data["families"]["fa5"] = dict(data["families"]["fa2"], version=5, module="_vendored_fa5_C",
                                   op_namespace="_vendored_fa5_C", record="build_info.json:fa5")
    data["families"]["default_order"].append("fa5")
    data["knobs"]["VLLM_FLASH_ATTN_VERSION"]["choices"].append("5")
    data["families"]["fa3"]["record"] = "build_info.json:hopper"
    (cmake_dir / "knobs.json").write_text(json.dumps(data))
    found = cmake_families(tmp_path, cmake_dir)
    assert found == expected(families.parse(data))
    assert found["fa5"]["module"] == "_vendored_fa5_C" and found["fa5"]["compiled"] == "YES"
    assert found["fa3"]["record"] == "build_info.json:hopper"


def test_fa4s_precompile_targets_are_what_each_gpu_it_runs_on_loads(tmp_path):
    # cmake/FA4Package.cmake's vfa_fa4_dsl_archs: each listed GPU of a generation the fa4 family
    # declares, as its own arch-specific target of the arch table (cuda_archs): 9.0 -> sm_90a,
    # 10.0 -> sm_100a, 10.3 -> sm_103a (the DSL's target on a B300, and upstream's kernel key;
    # sm_100a code does not load there); 8.0 (no FA4) and 12.0 (declared `excluded`: its kernel
    # does not compile at the pin) give no target.
    script = tmp_path / "archs.cmake"
    script.write_text(
        f'include("{CMAKE_DIR / "Options.cmake"}")\n'
        f'include("{CMAKE_DIR / "FA4Package.cmake"}")\n'
        'vfa_fa4_dsl_archs(targets 8.0 9.0 10.0 10.3 12.0 9.0a)\n'
        'message(NOTICE "TARGETS ${targets}")\n')
    result = run([tool("cmake"), "-P", str(script)], env=clean_env())
    assert result.returncode == 0, result.output
    declared = families.registry().by_name("fa4")
    assert 12 in declared.excluded and 12 not in declared.generations
    assert "TARGETS sm_90a;sm_100a;sm_103a" in result.output


# --- the configure's check of the declaration misses nothing it can see (issue 37) ----------

def _configure_check(tmp_path: Path, text: str) -> str:
    """What the configure's first step says of a declaration with this text: cmake/Options.cmake
    reads it, cmake/Families.cmake runs the package's validator on it (CMakeLists.txt's order),
    in script mode, from a project copy whose python/ is the project's."""
    project = tmp_path / "project"
    (project / "cmake").mkdir(parents=True)
    for name in ("Options.cmake", "Families.cmake", "UpstreamGit.cmake", "BuildPython.cmake"):
        shutil.copy(CMAKE_DIR / name, project / "cmake")
    shutil.copytree(CMAKE_DIR / "vfa_build", project / "cmake" / "vfa_build",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (project / "python").symlink_to(CMAKE_DIR.parent / "python")
    (project / "cmake" / "knobs.json").write_text(text)
    script = tmp_path / "check.cmake"
    script.write_text(f'include("{project / "cmake" / "Families.cmake"}")\n'
                      f'include("{project / "cmake" / "Options.cmake"}")\n'
                      'vfa_check_families_declaration()\nmessage(NOTICE "CHECKED")\n')
    result = run([tool("cmake"), f"-DPython_EXECUTABLE={sys.executable}", "-P", str(script)], env=clean_env())
    return " ".join(result.output.split())


def _edited(edit) -> str:
    data = json.loads((CMAKE_DIR / "knobs.json").read_text())
    edit(data)
    return json.dumps(data, indent=1)


def test_the_declaration_as_it_is_passes_the_configures_check(tmp_path):
    assert "CHECKED" in _configure_check(tmp_path, (CMAKE_DIR / "knobs.json").read_text())


def test_a_declaration_that_does_not_parse_is_reported_as_such(tmp_path):
    """Before issue 37: "VFA_ALLOW_UNKNOWN_SETTINGS is not declared ... Add one entry"."""
    text = (CMAKE_DIR / "knobs.json").read_text().replace('"VFA_PRESET": {', '"VFA_PRESET": {,', 1)
    output = _configure_check(tmp_path, text)
    assert "knobs.json does not parse as a JSON object (Line " in output, output
    assert "is not declared" not in output and "CHECKED" not in output


def _rename_fa4(d):
    d["families"]["fa;4"] = d["families"].pop("fa4")
    d["families"]["default_order"] = ["fa3", "fa;4", "fa2"]
    d["families"]["fa2"]["fallback"] = None


@pytest.mark.parametrize("edit, message", [
    # a name CMake cannot carry: before issue 37 CMake's JSON reader stopped far from the cause
    (_rename_fa4, "families.fa;4: a family name is lower-case letters, digits and _"),
    # a version the version knob refuses: passed the configure before issue 37
    (lambda d: d["knobs"]["VLLM_FLASH_ATTN_VERSION"].update(choices=["2", "3"]),
     "knobs.VLLM_FLASH_ATTN_VERSION.choices ['2', '3'] are not the families' versions"),
    # contradictory arch rules: FA2 excluded from its own min's generation
    (lambda d: d["families"]["fa2"]["capabilities"].update(excluded={"8": "broken"}),
     "families.fa2.capabilities.min 8.0 is of generation 8, which excluded says it does not run on"),
    # an adapter module that is not there: passed the configure before issue 37
    (lambda d: d["families"]["fa3"].update(adapter="vendored_flash_attn.fa3_gone:forward"),
     "families.fa3.adapter: module vendored_flash_attn.fa3_gone is not there"),
])
def test_the_configures_check_stops_on_each_gap(tmp_path, edit, message):
    output = _configure_check(tmp_path, _edited(edit))
    assert "declares the kernel families" in output and message in output, output
    assert "CHECKED" not in output


def test_the_configures_check_names_a_knobs_mistake_by_its_json_path(tmp_path):
    """issue 37: the knobs' typed parse (cmake/vfa_build/knobs/knobs.py validate, the model cmake/knobs.schema.json is
    made from) runs at configure; before, a mistyped knob field reached vfa_option's use of it."""
    output = _configure_check(tmp_path, _edited(lambda d: d["knobs"]["VFA_DIST_JOBS"].update(max="999")))
    assert "declares a knob with a mistake" in output, output
    assert "cmake/knobs.json: knobs.VFA_DIST_JOBS.max must be a whole number or null, got '999'" in output
    assert "CHECKED" not in output
