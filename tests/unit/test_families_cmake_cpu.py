"""The build's CMake code reads the kernel families where the package does: the
``families`` section of cmake/knobs.json (cmake/Options.cmake's vfa_declared_families /
vfa_family_field; python/vendored_flash_attn/families.py on the package's side). Run in
script mode (`cmake -P`, a fraction of a second). The configure that follows a changed
declaration: tests/build/test_families_configure.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from support.cmake_runner import clean_env, run, tool
from vendored_flash_attn import families

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
    data = json.loads((CMAKE_DIR / "knobs.json").read_text())
    data["families"]["fa5"] = dict(data["families"]["fa2"], version=5, module="_vendored_fa5_C",
                                   op_namespace="_vendored_fa5_C", record="build_info.json:fa5")
    data["families"]["default_order"].append("fa5")
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
