"""The arch table (cmake/knobs.json "cuda_archs", cuda_archs.py) and each family's "archs":
the validator's refusals, one rule of which code runs where for the package (cuda_archs.runs_on)
and the build (cmake/CudaArchs.cmake vfa_code_runs_on), and the targets each GPU actually loads
(10.3 -> sm_103a, never sm_100a). The arch choice per module: tests/unit/test_cuda_archs_cmake_cpu.py."""

from __future__ import annotations

import ast
import importlib.util
import itertools
from pathlib import Path

import pytest

from support.cmake_runner import clean_env, run, tool
from vendored_flash_attn.declaration import cuda_archs, knob_values as declaration, families

CMAKE_DIR = Path(__file__).resolve().parents[2] / "cmake"


def _refused(edit) -> list[str]:
    data = declaration.load()
    edit(data)
    return families.problems(data)


@pytest.mark.parametrize("edit, message", [
    # A row whose target names another capability: the code a 10.3 GPU never loads.
    (lambda d: d["cuda_archs"]["table"]["10.3"].update(a="sm_100a"),
     "cuda_archs.table.10.3.a is 'sm_100a', but compute capability 10.3's a target is 'sm_103a'"),
    (lambda d: d["cuda_archs"]["table"]["9.0"].update(nvcc="12"), "cuda_archs.table.9.0.nvcc must be an nvcc version"),
    (lambda d: d["cuda_archs"]["table"].update({"9": {"sass": "sm_9", "ptx": "compute_9", "nvcc": "12.0"}}),
     "cuda_archs.table.9: the key must be a compute capability"),
    (lambda d: d["cuda_archs"]["names"].update(Rubin=["11.9"]), "cuda_archs.names must map each name"),
    (lambda d: d["cuda_archs"]["table"].update({"7.5": {"sass": "sm_75", "ptx": "compute_75", "nvcc": "10.0"}}),
     "cuda_archs.table: list the rows in ascending order"),
    (lambda d: d.pop("cuda_archs"), 'no "cuda_archs" section'),
    # A family's code: capabilities of the table, declared knobs, and code where it is declared to run.
    (lambda d: d["families"]["fa3"]["archs"].update(a=["9.5"]), "families.fa3.archs names 9.5, which the arch "
                                                              "table (cuda_archs.table) has no row for"),
    (lambda d: d["families"]["fa2"]["archs"].update(a=["8.0"]), "families.fa2.archs names 8.0, which the arch "
                                                              "table (cuda_archs.table) has no a target for"),
    (lambda d: d["families"]["fa2"]["archs"].update(ptx_knob="VFA_FA2_PTXX"),
     "families.fa2.archs: 'VFA_FA2_PTXX' is not a bool build knob of cmake/knobs.json (did you mean 'VFA_FA2_PTX'?)"),
    (lambda d: d["families"]["fa2"]["archs"].update(sass_knobs={"9.0": "VFA_PRESET"}),
     "'VFA_PRESET' is not a bool build knob"),
    (lambda d: d["families"]["fa2"].pop("archs"), "families.fa2: missing fields ['archs']"),
    (lambda d: d["families"]["fa2"]["archs"].update(dsl="a"), "a compiled family names the capabilities"),
    (lambda d: d["families"]["fa4"]["archs"].update(dsl="sass"), "a cute_dsl family's kernels compile for each GPU"),
    (lambda d: d["families"]["fa2"]["capabilities"].update(min="8.6"),
     "families.fa2.capabilities.min is 8.6, but its code starts at 8.0 (families.fa2.archs): they must agree"),
    # FA3's sm_90a code declared from 8.0: the selector would send Ampere GPUs to it.
    (lambda d: d["families"]["fa3"].update(capabilities={"min": "8.0", "generations": {"8": "sm80", "9": "sm90"}}),
     "families.fa3.capabilities declares FA3 from 8.0 on generations [8, 9], but its code (families.fa3.archs: "
     "sm_90a) runs on 9.0, not on 8.0, 8.6, 8.7, 8.9"),
    # FA2 without its PTX by default: SASS of 8.x, declared for every GPU from 8.0.
    (lambda d: d["knobs"]["VFA_FA2_PTX"].update(default="OFF"),
     "families.fa2.capabilities declares FA2 from 8.0 on every generation from it, but its code (families.fa2.archs: "
     "sm_80) runs on 8.x, not on 9.0, 10.0, 10.3, 11.0, 12.0, 12.1"),
    # FA4 compiles for each GPU's a target: every GPU it runs on needs one.
    (lambda d: d["cuda_archs"]["table"]["11.0"].pop("a"),
     "families.fa4.archs: its kernels compile for each GPU's a target, but the arch table has none for 11.0"),
])
def test_a_mistake_in_the_arch_table_or_a_familys_archs_is_refused(edit, message):
    found = _refused(edit)
    assert any(message in line for line in found), found


def test_the_declaration_is_valid_and_its_families_code_is_what_the_build_makes():
    data = declaration.load()
    assert families.problems(data) == []
    registry = families.parse(data)
    table = registry.cuda_archs
    assert registry.by_name("fa2").archs.ptx == "8.0" and registry.by_name("fa3").archs.a == ("9.0",)
    assert registry.by_name("fa3").archs.nvcc == "12.3"
    # What each Blackwell GPU loads: its own a target.
    assert [table.rows[c].a for c in ("10.0", "10.3", "11.0", "12.0")] == ["sm_100a", "sm_103a", "sm_110a", "sm_120a"]
    # PyTorch's meaning (test_the_names_mean_what_they_mean_to_the_pinned_torch), +PTX included
    assert table.names["blackwell"] == ("10.0", "10.3", "12.0", "12.1+PTX")


def test_which_code_runs_where():
    table = families.registry().cuda_archs
    assert table.runs_on(["sm_80"], 8, 6) and not table.runs_on(["sm_80"], 9, 0)
    assert table.runs_on(["sm_80", "compute_80"], 12, 0)
    assert table.runs_on(["sm_100a"], 10, 0) and not table.runs_on(["sm_100a"], 10, 3)
    assert table.runs_on(["sm_103a"], 10, 3)
    assert table.runs_on(["sm_90a"], 9, 0) and not table.runs_on(["sm_90a"], 10, 0)
    assert table.runs_on(["sm_75"], 7, 5) is None  # no row: the table cannot say


CODE_RUNS_ON = """include("{cmake}/CudaArchs.cmake")
foreach(code IN ITEMS {codes})
  foreach(arch IN ITEMS {archs})
    vfa_code_runs_on(runs ${{arch}} ${{code}})
    message(NOTICE "RUNS ${{code}} ${{arch}} ${{runs}}")
  endforeach()
endforeach()
vfa_family_dsl_targets(targets fa4 8.0 9.0 10.0 10.3 11.0 12.0 9.0a 10.1)
message(NOTICE "DSL ${{targets}} UNKNOWN ${{targets_UNKNOWN}}")
vfa_parse_arch_list(named "blackwell;Hopper")
message(NOTICE "NAMED ${{named}}")
"""


def test_the_build_and_the_package_apply_one_rule_of_which_code_runs_where(tmp_path):
    """cmake/CudaArchs.cmake's vfa_code_runs_on and cuda_archs.runs_on agree on every target of
    the table and every capability of it (and one newer than all); FA4's DSL targets are each
    GPU's own a target (cmake/FA4Package.cmake's vfa_fa4_dsl_archs calls vfa_family_dsl_targets)."""
    table = families.registry().cuda_archs
    codes = [getattr(row, kind) for row in table.rows.values() for kind in ("sass", "a", "ptx") if getattr(row, kind)]
    archs = [*table.rows, "13.0"]
    script = tmp_path / "runs.cmake"
    script.write_text(CODE_RUNS_ON.format(cmake=CMAKE_DIR, codes=" ".join(codes), archs=" ".join(archs)))
    result = run([tool("cmake"), "-P", str(script)], env=clean_env())
    assert result.returncode == 0, result.output
    cmake = {tuple(line.split()[1:3]): line.split()[3] == "TRUE" for line in result.output.splitlines()
             if line.startswith("RUNS ")}
    python = {(code, arch): bool(table.runs_on([code], *cuda_archs.capability(arch)))
              for code, arch in itertools.product(codes, archs)}
    assert cmake == python
    assert cmake[("sm_100a", "10.3")] is False and cmake[("compute_80", "13.0")] is True
    # 9.0a names the capability 9.0; 8.0 (no FA4) and 12.0 (excluded at the pin) give none; 10.1 has no row.
    assert "DSL sm_90a;sm_100a;sm_103a;sm_110a UNKNOWN 10.1" in result.output
    assert "NAMED 10.0;10.3;12.0;12.1;9.0" in result.output


# --- one reader of TORCH_CUDA_ARCH_LIST (issue 37) ---------------------------------------------
# The build (cmake/CudaArchTable.cmake vfa_parse_arch_list) runs the package's parser
# (cuda_archs.parse_arch_list); every string of this corpus goes through both and must come out
# the same: (archs, ptx) or the same refusal. Before issue 37 CMake had a parser of its own that
# stopped on Blackwell+PTX (which the package took), took 09.0 as 9.0 and let 9.00 into torch's CMake,
# and gave the names other meanings than PyTorch's.

ARCH_CORPUS = [
    ("8.0;9.0", ("8.0;9.0", "")),
    ("8.0", ("8.0", "")),
    ("9.0", ("9.0", "")),
    ("8.0 9.0", ("8.0;9.0", "")),
    ("8.0,9.0", ("8.0;9.0", "")),
    ("8.0, 9.0;;10.0", ("8.0;9.0;10.0", "")),
    (" 8.0 ", ("8.0", "")),
    ("9.0a", ("9.0", "")),
    ("10.0f", ("10.0", "")),
    ("8.0+PTX", ("8.0", "8.0")),
    ("8.0+ptx", ("8.0", "8.0")),
    ("9.0a+PTX", ("9.0", "9.0")),
    ("8.0;8.0;9.0;8.0", ("8.0;9.0", "")),
    ("7.5;8.0", ("7.5;8.0", "")),
    ("12.1", ("12.1", "")),
    ("13.0", ("13.0", "")),
    ("Hopper", ("9.0", "9.0")),
    ("hopper", ("9.0", "9.0")),
    ("HOPPER", ("9.0", "9.0")),
    ("Ampere", ("8.0;8.6", "8.6")),
    ("Ada", ("8.9", "8.9")),
    ("Blackwell", ("10.0;10.3;12.0;12.1", "12.1")),
    ("8.0;Hopper", ("8.0;9.0", "9.0")),
    ("Ampere Hopper", ("8.0;8.6;9.0", "8.6;9.0")),
    ("Blackwell+PTX", "adds +PTX to a name, which already says its PTX"),
    ("hopper+ptx", "adds +PTX to a name, which already says its PTX"),
    ("09.0", "'09.0' is not a compute capability as torch writes one: write 9.0"),
    ("9.00", "'9.00' is not a compute capability as torch writes one: write 9.0"),
    ("08.0+PTX", "'08.0+PTX' is not a compute capability as torch writes one: write 8.0+PTX"),
    ("8.10", "'8.10' is not a compute capability as torch writes one: write major.minor"),
    ("0.9", "'0.9' is not a compute capability as torch writes one: write major.minor"),
    ("9", "'9' is not an architecture"),
    ("sm_90", "'sm_90' is not an architecture"),
    ("Turing", "'Turing' is not an architecture"),
    ("9.0+PTX+PTX", "'9.0+PTX+PTX' is not an architecture"),
    ("9.0b", "'9.0b' is not an architecture"),
    ("", "names no architecture"),
    (";", "names no architecture"),
    (", ;", "names no architecture"),
]

PARSE = """include("{cmake}/CudaArchTable.cmake")
vfa_parse_arch_list(parsed "${{TEXT}}")
message(NOTICE "PARSED archs=${{parsed}} ptx=${{parsed_PTX}}")
"""


def _python_reading(text: str) -> str:
    try:
        parsed = cuda_archs.parse_arch_list(text, families.registry().cuda_archs.names)
    except cuda_archs.ArchListError as error:
        return " ".join(str(error).split())
    return f"archs={';'.join(parsed.archs)} ptx={';'.join(parsed.ptx)}"


def test_the_corpus_is_large_enough():
    assert len(ARCH_CORPUS) >= 30 and len({t for t, _ in ARCH_CORPUS}) == len(ARCH_CORPUS)


@pytest.mark.parametrize("text, expected", ARCH_CORPUS)
def test_the_build_and_the_package_read_an_arch_list_alike(tmp_path, text, expected):
    python = _python_reading(text)
    if isinstance(expected, tuple):
        assert python == f"archs={expected[0]} ptx={expected[1]}"
    else:
        assert expected in python, python
    script = tmp_path / "parse.cmake"
    script.write_text(PARSE.format(cmake=CMAKE_DIR))
    result = run([tool("cmake"), f"-DTEXT={text}", "-P", str(script)], env=clean_env())
    output = " ".join(result.output.split())
    if isinstance(expected, tuple):
        assert result.returncode == 0 and f"PARSED {python}" in output, result.output
    else:
        assert result.returncode != 0 and python in output, result.output


def _torch_named_arches() -> dict[str, str]:
    """named_arches of the installed (pinned) torch's torch/utils/cpp_extension.py, read from its
    source (torch is not imported: the table is a literal inside a function)."""
    spec = importlib.util.find_spec("torch")
    assert spec and spec.submodule_search_locations, "torch is a test dependency"
    source = Path(spec.submodule_search_locations[0], "utils", "cpp_extension.py").read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "named_arches"
                                                for t in node.targets):
            return dict(ast.literal_eval(node.value.args[0]))
    raise AssertionError("torch/utils/cpp_extension.py has no named_arches")


def test_the_names_mean_what_they_mean_to_the_pinned_torch():
    torch_names = _torch_named_arches()
    declared = declaration.load()["cuda_archs"]["names"]
    assert declared and {name: ";".join(entries) for name, entries in declared.items()} == \
        {name: torch_names[name] for name in declared}
    # torch's names this table has no word for ('Turing': below the lowest row; 'Rubin': no row) are refused
    for name in set(torch_names) - set(declared):
        with pytest.raises(cuda_archs.ArchListError):
            cuda_archs.parse_arch_list(name, families.registry().cuda_archs.names)


def test_a_recorded_list_is_read_by_the_same_parser():
    table = families.registry().cuda_archs
    assert table.capabilities("8.0;Hopper") == [(8, 0), (9, 0)]
    with pytest.raises(cuda_archs.ArchListError, match="write 9.0"):
        table.capabilities("09.0")


@pytest.mark.parametrize("module, argv, status, out, err", [
    (cuda_archs, ["parse", "KNOBS", "8.0,9.0"], 0, "archs 8.0;9.0\nptx \nnamed \n", ""),
    (families, ["check", "KNOBS"], 0, "", ""),
    # the configure reads cuda_archs' refusal on stdout, families' on stderr (its stdout lists mistakes)
    (cuda_archs, ["parse", "MISSING", "9.0"], 1, "MISSING cannot be read as JSON (", ""),
    (families, ["check", "MISSING"], 1, "", "MISSING cannot be read as JSON ("),
    (cuda_archs, ["parse", "NOT_JSON", "9.0"], 1, "NOT_JSON cannot be read as JSON (", ""),
    (families, ["check", "NOT_JSON"], 1, "", "NOT_JSON cannot be read as JSON ("),
    (cuda_archs, ["parse", "KNOBS"], 2, "",
     "usage: python -m vendored_flash_attn.declaration.cuda_archs parse DECLARATION.json TEXT\n"),
    (families, ["parse", "KNOBS"], 2, "", "usage: python -m vendored_flash_attn.declaration.families check DECLARATION.json\n"),
], ids=["parse", "check", "parse-missing", "check-missing", "parse-not-json", "check-not-json", "parse-usage",
        "check-usage"])
def test_the_declaration_tools_read_their_command_line(tmp_path, capsys, module, argv, status, out, err):
    """cuda_archs parse and families check, the two tools the configure runs on the declaration:
    their command line and the declaration's file read one way (json_types.declaration_command),
    each message where its CMake caller reads it."""
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    names = {"KNOBS": str(declaration.declaration_path()), "MISSING": str(tmp_path / "missing.json"),
             "NOT_JSON": str(tmp_path / "bad.json")}
    assert module.main([names.get(a, a) for a in argv]) == status
    captured = capsys.readouterr()
    for name, path in names.items():
        captured = captured._replace(out=captured.out.replace(path, name), err=captured.err.replace(path, name))
    assert captured.out.startswith(out) and bool(captured.out) == bool(out), captured
    assert captured.err.startswith(err) and bool(captured.err) == bool(err), captured
