"""The kernel families, declared once (cmake/knobs.json "families", families.py): the
selector, is_fa_version_supported, `info`, the build info and wheel_check read the
declaration; FA4 is a family like the others (selector, dispatch to its adapter, refusals
before any kernel, nothing of it imported by a plain query)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
import warnings
from pathlib import Path

import pytest
import torch

import vendored_flash_attn as vfa
from runtime_fakes import AMPERE, BLACKWELL, BLACKWELL_12, FA4_RECORD, HOPPER, make_build
from test_fa4_adapter import _paged, fake  # noqa: F401  (fake: the FA4 sources stand-in fixture)
from vendored_flash_attn import cli
from vendored_flash_attn.declaration import knob_values as declaration, families
from vendored_flash_attn.families.fa4 import adapter as fa4
from vendored_flash_attn.selection import selector
from vendored_flash_attn.release import wheel_check, build_info_check as wheel_check_build_info
from vendored_flash_attn.selection.environment import set_environment
from vendored_flash_attn.errors import FlashAttnInputError

PROJECT = Path(__file__).resolve().parents[2]
WITH_FA4 = make_build("full", fa4=FA4_RECORD)
DEPS_MISSING = ('its dependencies are not installed in the versions the pinned upstream declares: '
                'nvidia-cutlass-dsl is not installed (nvidia-cutlass-dsl==4.6.0.dev0 is required). '
                'Install them with: pip install "vendored-flash-attn[fa4]"')


def _select(describe, caps, build=WITH_FA4, env=None, errors=None, **request):
    describe(caps=() if caps is None else (caps,), build=build, env=env or {}, module_errors=errors or {})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        selection = selector.select_flash_attn_version(**request)
    return selection, [str(w.message) for w in record]


# --- the declaration --------------------------------------------------------------------

def test_the_declaration_holds_three_families_and_the_knob_takes_their_versions():
    data = declaration.load()
    registry = families.parse(data)
    assert registry.names() == ("fa2", "fa3", "fa4")
    assert registry.versions == (2, 3, 4)
    # One rule in one place: VLLM_FLASH_ATTN_VERSION's choices are the families' versions.
    assert data["knobs"]["VLLM_FLASH_ATTN_VERSION"]["choices"] == [str(v) for v in registry.versions]
    fa4_family = registry[4]
    assert not fa4_family.compiled and fa4_family.probe == fa4.SUBPACKAGE
    assert fa4_family.adapter == "vendored_flash_attn.families.fa4.adapter:forward"
    assert fa4_family.adapter_function() is fa4.forward
    # FA4's generations are the declaration's (fa4/adapter.py reads them from there).
    assert fa4.GENERATIONS == fa4_family.generations == {9: "sm90", 10: "sm100", 11: "sm100"}
    assert "does not compile" in fa4_family.excluded[12]  # sm120: upstream's kernel at the pin
    assert registry[3].generations == {9: "sm90"} and not registry[2].generations
    for family in registry:  # every declared adapter exists
        assert callable(family.adapter_function())


@pytest.mark.parametrize("edit, message", [
    (lambda s: s["fa4"].update(version=3), "version twice"),
    (lambda s: s["fa4"].pop("adapter"), "missing fields ['adapter']"),
    (lambda s: s["fa4"].update(made="wasm"), "made 'wasm'"),
    (lambda s: s["fa4"].update(build_knob="VFA_BUILD_FA9"), "VFA_BUILD_FA9 is not a knob"),
    (lambda s: s.update(default_order=["fa3", "fa2"]), "every family once"),
    (lambda s: s["fa4"].update(pythons=["3.12", "py3.13"]), "pythons must be a list of Python minors"),
    (lambda s: s["fa4"].update(pythons="3.12"), "pythons must be a list of Python minors"),
    (lambda s: s["fa4"]["call"].update(head_sizes={"sm90": [[8, 512]]}), "call.head_sizes must map each generation"),
    (lambda s: s["fa4"]["call"].update(head_sizes={"sm90": [[512, 8, 8, 512]]}), "call.head_sizes must map"),
    (lambda s: s["fa4"]["call"].update(head_sizes={"sm90": "8-512"}), "call.head_sizes must map"),
    (lambda s: s["fa4"]["call"].update(head_sizes={"sm80": [[8, 512, 8, 512]]}),
     "call.head_sizes names generations it does not run on: ['sm80']"),
    # names CMake and Python can carry (issue 37): a ';' splits a CMake list
    (lambda s: s.update({"fa;5": s.pop("fa4")}), "families.fa;5: a family name is lower-case letters"),
    (lambda s: s.update({"FA4": s.pop("fa4")}), "families.FA4: a family name is lower-case letters"),
    # contradictory arch rules: min's own generation excluded (no generations list to fall back on)
    (lambda s: s["fa2"]["capabilities"].update(excluded={"8": "broken"}),
     "families.fa2.capabilities.min 8.0 is of generation 8, which excluded says it does not run on"),
])
def test_a_malformed_family_is_refused(edit, message):
    data = declaration.load()
    edit(data["families"])
    with pytest.raises(families.FamilyDeclarationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        families.parse(data)


@pytest.mark.parametrize("family, generation", [("fa2", "8"), ("fa4", "9")])
def test_excluding_mins_generation_gives_one_consistent_fix(family, generation):
    """A family excluded from its own min's generation runs nowhere from min: one message, whose fix
    does not contradict another (fa2, no generations: passed before issue 37; fa4: "both" says it)."""
    data = declaration.load()
    data["families"][family]["capabilities"].setdefault("excluded", {})[generation] = "broken"
    found = [p for p in families.problems(data) if f"families.{family}.capabilities" in p]
    assert len(found) == 1 and f'add "{generation}" to generations' not in found[0], found


@pytest.mark.parametrize("choices, versions", [
    (["2", "3"], "['2', '3', '4']"),             # fa4's version 4 is not a choice
    (["2", "3", "4", "5"], "['2', '3', '4']"),   # a choice no family has
])
def test_the_version_knob_holds_exactly_the_families_versions(choices, versions):
    data = declaration.load()
    data["knobs"]["VLLM_FLASH_ATTN_VERSION"]["choices"] = choices
    found = families.problems(data)
    assert any(p.startswith("knobs.VLLM_FLASH_ATTN_VERSION.choices") and versions in p for p in found), found


PYTHON_DIR = str(Path(families.__file__).resolve().parents[2])


@pytest.mark.parametrize("field, value, message", [
    ("adapter", "vendored_flash_attn.fa9:forward", "families.fa4.adapter: module vendored_flash_attn.fa9 is not there"),
    ("adapter", "vendored_flash_attn.families.fa4.adapter:fwd", "defines no fwd"),
    ("head_size_rule", "vendored_flash_attn.declaration.kernels:fa9_head_size_problem", "defines no fa9_head_size_problem"),
    ("deps_check", "nowhere_at_all:problems", "families.fa4.deps_check: module nowhere_at_all is not there"),
])
def test_an_adapter_that_is_not_there_is_found_without_importing(field, value, message):
    data = declaration.load()
    data["families"]["fa4"][field] = value
    assert families.problems(data) == []  # the reference is well formed; only the files can tell
    found = families.reference_problems(data, [PYTHON_DIR])
    assert len(found) == 1 and message in found[0], found


def test_the_declared_references_are_there():
    assert families.reference_problems(declaration.load(), [PYTHON_DIR]) == []


# --- adding a family is a declaration and an adapter -------------------------------------

FA5_ADAPTER = "fake_fa5_adapter"


@pytest.fixture
def fa5(monkeypatch, describe):
    """A copy of the declaration with a fake FA5 (Python kernels, sm100 only) and its fake
    adapter module; no package code is changed."""
    data = declaration.load()
    data["knobs"]["VLLM_FLASH_ATTN_VERSION"]["choices"].append("5")
    data["families"]["fa5"] = {
        "version": 5, "made": "cute_dsl", "build_knob": "VFA_BUILD_FA4",
        "subpackage": "vendored_flash_attn._fa5", "probe": "vendored_flash_attn._fa5.kernels",
        "deps_check": f"{FA5_ADAPTER}:problems", "install": "pip install fa5",
        "capabilities": {"min": "10.0", "generations": {"10": "sm100"}},
        "dtypes": ["bf16"], "head_dims_knob": None, "dtypes_knob": None, "features_knob": None,
        "features": ["varlen"], "default_on": [], "fallback": "fa2",
        "adapter": f"{FA5_ADAPTER}:forward",
        "record": "_fa5/build_info.json", "artefacts": ["_fa5/kernels/__init__.py", "_fa5/build_info.json"]}
    data["families"]["default_order"].append("fa5")
    calls = []
    adapter = types.ModuleType(FA5_ADAPTER)
    adapter.problems = lambda: []
    # the adapter contract (families.about: adapter): the resolution, the checked call object
    adapter.forward = lambda resolved, call, window, fp8: calls.append((call.q, call)) or ("fa5 out", None)
    monkeypatch.setitem(sys.modules, FA5_ADAPTER, adapter)
    previous = families.set_registry(families.parse(data))
    build = make_build("full", fa4=FA4_RECORD).raw
    from vendored_flash_attn.declaration.build_info import BuildInfo

    info = BuildInfo.from_dict(build, {"fa4": FA4_RECORD, "fa5": {"schema": 1, "package": "x"}})
    machine = describe(caps=(BLACKWELL,), build=info, env={"VLLM_FLASH_ATTN_VERSION": "5"})
    yield types.SimpleNamespace(calls=calls, machine=machine, data=data)
    families.set_registry(previous)
    set_environment(None)


def test_a_family_added_to_the_declaration_is_picked_up_everywhere(fa5):
    assert selector.get_flash_attn_version() == 5
    assert selector.is_fa_version_supported(5)
    report = cli.collect()
    assert "fa5" in report["modules"] and report["modules"]["fa5"]["built"] is True
    assert "fa5" in report["build"] and "FA5" in cli.render(report)
    assert "fa5" in wheel_check.components()
    # wheel_check expects its declared artefacts once its record is in a wheel.
    lacking = wheel_check_build_info.packaged_families(["vendored_flash_attn/_fa5/build_info.json"])
    assert lacking == {"fa5": ["vendored_flash_attn/_fa5/kernels/__init__.py"]}
    # A call goes to its adapter.
    q = torch.zeros(3, 8, 128, dtype=torch.bfloat16)
    assert vfa.flash_attn_varlen_func(q, q, q, 1, torch.arange(4, dtype=torch.int32), 1,
                                      cu_seqlens_k=torch.arange(4, dtype=torch.int32)) == "fa5 out"
    assert fa5.calls and fa5.calls[-1][0] is q


# --- the selector with FA4 ----------------------------------------------------------------

def test_hopper_default_stays_fa3_and_says_why_not_fa4(describe):
    selection, warned = _select(describe, HOPPER)
    assert selection.version == 3, selection
    assert "FA4 is not the default here" in selection.reason
    assert "measured FA4 slower than FA3 on all 7 of its cases" in selection.reason
    assert not warned


def test_env_4_on_hopper_picks_fa4_when_packaged_and_installed(describe):
    selection, warned = _select(describe, HOPPER, env={"VLLM_FLASH_ATTN_VERSION": "4"})
    assert selection.version == 4 and selection.reason == "VLLM_FLASH_ATTN_VERSION=4"
    assert not warned


def test_env_4_without_the_extra_falls_back_naming_the_install_command(describe):
    selection, warned = _select(describe, HOPPER, env={"VLLM_FLASH_ATTN_VERSION": "4"},
                                errors={4: DEPS_MISSING})
    assert selection.version == 2
    assert 'pip install "vendored-flash-attn[fa4]"' in selection.fallbacks[0]
    assert any("vendored-flash-attn[fa4]" in w for w in warned)
    assert 'pip install "vendored-flash-attn[fa4]"' in selector.fa_version_unsupported_reason(4)
    assert not selector.is_fa_version_supported(4)


def test_env_4_in_a_wheel_without_fa4(describe):
    selection, warned = _select(describe, HOPPER, build=make_build("full"), env={"VLLM_FLASH_ATTN_VERSION": "4"})
    assert selection.version == 2 and "built without FA4" in selection.fallbacks[0]


def test_sm120_is_excluded_with_the_declared_reason(describe):
    selection, _ = _select(describe, BLACKWELL_12)
    assert selection.version == 2
    assert "FA4 does not run on compute capability 12.x in this package: at the pin" in selection.reason
    assert "does not compile" in selector.fa_version_unsupported_reason(4)


@pytest.mark.parametrize("caps", [BLACKWELL])
def test_blackwell_default_is_fa4_when_installed_else_fa2(describe, caps):
    selection, warned = _select(describe, caps)
    assert selection.version == 4, selection
    assert f"compute capability {caps[0]}.{caps[1]}: FA4 is built and loads" in selection.reason
    assert "FA3 unusable (FA3 runs on sm90 only" in selection.reason
    selection, warned = _select(describe, caps, build=make_build("full"))
    assert selection.version == 2 and "FA4 unusable" in selection.reason
    selection, warned = _select(describe, caps, errors={4: DEPS_MISSING})
    assert selection.version == 2
    assert any("FA4 is built but unusable" in w and "vendored-flash-attn[fa4]" in w for w in warned)


def test_ampere_and_no_gpu(describe):
    assert _select(describe, AMPERE)[0].version == 2
    assert "FA4 runs on sm90, sm100 only" in selector.fa_version_unsupported_reason(4)
    selection, _ = _select(describe, None)
    assert selection.version is None and "no CUDA GPU" in selection.reason
    assert "no CUDA GPU" in selector.fa_version_unsupported_reason(4)


def test_info_says_why_fa4_on_blackwell(describe, capsys):
    describe(caps=(BLACKWELL,), build=WITH_FA4)
    report = cli.collect()
    assert report["devices"][0]["selected"] == 4
    text = cli.render(report)
    assert "FA4 is built and loads" in text and "FA3 runs on sm90 only" in text
    assert report["build"]["fa4"]["built"] is True and report["build"]["fa4"]["gencode"] == ["sm_90a"]


# --- dispatch and refusals -----------------------------------------------------------------

def test_fa_version_4_dispatches_to_the_fa4_adapter(fake, describe):  # noqa: F811
    describe(caps=(HOPPER,), build=WITH_FA4)
    call = _paged()
    out = vfa.flash_attn_varlen_func(**call, causal=True, fa_version=4)
    (q, k, v), kwargs = fake.calls[-1]
    assert q is call["q"] and kwargs["page_table"] is call["block_table"] and kwargs["causal"] is True
    assert out.shape == (3, 8, 128)


def test_default_on_blackwell_dispatches_to_fa4(fake, describe):  # noqa: F811
    describe(caps=(BLACKWELL,), build=WITH_FA4)
    vfa.flash_attn_varlen_func(**_paged())
    assert fake.calls[-1][1]["_arch"] == 100


@pytest.mark.parametrize("change, names", [
    ({"alibi_slopes": torch.zeros(8)}, "FA2"),
    ({"q_v": torch.zeros(3, 8, 128)}, "FA3"),
    ({"cp_world_size": 2}, "FA3"),
])
def test_what_fa4_cannot_do_is_refused_before_any_kernel(fake, describe, change, names):  # noqa: F811
    describe(caps=(HOPPER,), build=WITH_FA4)
    with pytest.raises(FlashAttnInputError, match=names):
        vfa.flash_attn_varlen_func(**_paged(), fa_version=4, **change)
    assert fake.calls == [] and fake.deps_checked == 0


# --- lazy: a plain query imports no FA4 code ----------------------------------------------

def test_a_plain_query_imports_neither_cutlass_nor_the_fa4_sources(tmp_path):
    # A staged _fa4 whose sources and whose cutlass blow up when imported: the probe finds
    # the subpackage without importing it, and reads the dependencies from metadata.
    (tmp_path / "_fa4" / "cute").mkdir(parents=True)
    (tmp_path / "_fa4" / "__init__.py").write_text("")
    (tmp_path / "_fa4" / "cute" / "__init__.py").write_text("raise SystemExit('FA4 sources imported')\n")
    (tmp_path / "cutlass").mkdir()
    (tmp_path / "cutlass" / "__init__.py").write_text("raise SystemExit('cutlass imported')\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import vendored_flash_attn
        assert not [m for m in sys.modules if m.startswith(("cutlass", "vendored_flash_attn._fa4", "torch"))]
        vendored_flash_attn.__path__.append({str(tmp_path)!r})
        from vendored_flash_attn.selection.environment import SystemEnvironment
        answer = SystemEnvironment().load_module(4)
        vendored_flash_attn.is_fa_version_supported(4)
        loaded = [m for m in sys.modules if m.startswith("cutlass") or m.startswith("vendored_flash_attn._fa4.")]
        print(repr(answer), loaded)
        assert not loaded, loaded
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=PROJECT, env={"PYTHONPATH": str(PROJECT / "python"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "not in this installation" not in result.stdout  # the subpackage was found


# --- FA2 and FA3 differ by declaration and adapter, not by version branches ---------------

def test_every_family_adapter_is_a_real_entry_point_of_its_own():
    from vendored_flash_attn.families import fa2, fa3

    declared = families.registry()
    assert declared.by_name("fa2").adapter_function() is fa2.forward
    assert declared.by_name("fa3").adapter_function() is fa3.forward
    assert declared.by_name("fa4").adapter_function() is fa4.forward
    # The head-dim routing of each compiled family is declared too; FA4 checks its own.
    assert declared.by_name("fa2").head_size_function().__name__ == "fa2_head_size_problem"
    assert declared.by_name("fa4").head_size_function() is None


@pytest.fixture
def edited(describe):
    """Swap in a copy of the declaration edited by the test; the real one again after."""
    previous = []

    def install(edit):
        data = declaration.load()
        edit(data["families"])
        previous.append(families.set_registry(families.parse(data)))
        set_environment(None)

    yield install
    if previous:
        families.set_registry(previous[0])
    set_environment(None)


def test_the_fa2_rules_of_a_call_are_its_declaration(describe, fake_ops, edited):
    """FA2's paged block size and its refusal of batched K/V come from families.fa2.call: edit
    the declaration and the same call is judged by the edit (no version branch left)."""
    from calls import paged_call

    call = paged_call(block_size=8)
    describe(caps=(AMPERE,), build="full")
    with pytest.raises(FlashAttnInputError, match="FA2 needs a paged KV block size divisible by 16, got 8"):
        vfa.flash_attn_varlen_func(**call, fa_version=2)
    edited(lambda section: section["fa2"]["call"].update(page_size_multiple=8))
    describe(caps=(AMPERE,), build="full")
    vfa.flash_attn_varlen_func(**call, fa_version=2)
    assert fake_ops.last("varlen_fwd")["block_table"] is call["block_table"]


def test_split_kv_limits_and_refusals_follow_the_declaration(describe, fake_ops, edited):
    from calls import varlen_call

    edited(lambda section: section["fa3"]["call"].update(max_num_splits=8))
    describe(caps=(HOPPER,), build="full")
    with pytest.raises(FlashAttnInputError, match="FA3 supports num_splits up to 8, got 9"):
        vfa.flash_attn_varlen_func(**varlen_call(), num_splits=9, fa_version=3)
    edited(lambda section: section["fa2"]["features"].append("split"))
    describe(caps=(AMPERE,), build="full")
    vfa.flash_attn_varlen_func(**varlen_call(), num_splits=4, fa_version=2)  # FA2 now declares split
    assert fake_ops.last("varlen_fwd")["num_splits"] == 4


def test_refusals_name_the_families_that_declare_the_feature(describe, fake_ops):
    from calls import varlen_call

    describe(caps=(AMPERE,), build="full")
    with pytest.raises(FlashAttnInputError, match=r"s_aux \(attention sinks\) needs FA3 or FA4; FA2 has no sinks"):
        vfa.flash_attn_varlen_func(**varlen_call(), s_aux=torch.zeros(8, dtype=torch.bfloat16), fa_version=2)


# --- the selector's sinks message is the declaration's ------------------------------------

def test_sinks_need_the_families_that_declare_them(describe):
    """FA3 and FA4 declare sinks: a request for sinks where neither runs names both."""
    selection, _ = _select(describe, AMPERE, has_sinks=True)
    assert selection.version is None
    assert "attention sinks (s_aux) need FA3 or FA4" in selection.reason, selection.reason


def test_info_lists_the_precompiled_fa4_kernels_per_python(describe):
    import sys

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    runs = [{"arch": "sm_90a", "python": "3.99", "flavour": "cu12.9", "kernels": 146, "calls": 144},
            {"arch": "sm_90a", "python": "3.98", "kernels": 0, "error": "the DSL died"},
            {"arch": "sm_90a", "python": "3.97", "flavour": "cu12.9", "kernels": 146,
             "same_as": {"python": "3.99", "fingerprint": "f" * 64}}]
    describe(caps=(HOPPER,), build=make_build("full", fa4={**FA4_RECORD, "precompile": {
        **FA4_RECORD["precompile"], "runs": runs}}))
    report = cli.collect()
    assert report["build"]["fa4"]["precompiled"] == [
        {"arch": "sm_90a", "python": "3.99", "flavour": "cu12.9", "kernels": 146},  # a failed run ships none
        {"arch": "sm_90a", "python": "3.97", "flavour": "cu12.9", "kernels": 146, "files_of": "3.99"}]
    text = cli.render(report)
    assert ("precompiled kernels: sm_90a Python 3.99: 146 (cu12.9), "
            "sm_90a Python 3.97: 146 (cu12.9, Python 3.99's files)") in text
    assert f"none for this Python ({here}): its kernels compile at first use" in text
    describe(caps=(HOPPER,), build=WITH_FA4)
    assert "precompiled kernels: none (each kernel compiles at its first use" in cli.render(cli.collect())
