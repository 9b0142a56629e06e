"""The version selector over a table of machines, builds and requests."""

from __future__ import annotations

import warnings

import pytest
import torch

from runtime_fakes import ADA, AMPERE, BLACKWELL, BLACKWELL_12, HOPPER, TURING, make_build
from vendored_flash_attn.selection import selector
from vendored_flash_attn.selection.environment import SystemEnvironment, set_environment
from vendored_flash_attn.errors import FlashAttnFallbackWarning

NO_FP16_FA3 = make_build("full", fa3={"dtypes": ["bf16", "e4m3"]})
FA3_128_ONLY = make_build("full", fa3={"head_dims": [128]})
NO_FA3 = make_build("full", fa3={"built": False, "reason": "nvcc 12.2 is older than 12.3"})
NO_E4M3 = make_build("full", fa3={"dtypes": ["bf16", "fp16"]})
NO_HDIMDIFF = make_build("full", fa3={"features": ["paged", "split"]})
LOAD_ERROR = "ImportError: undefined symbol: _ZN5flash12run_mha_fwd"
# FA2 without its PTX (VFA_FA2_PTX=OFF): sm_80 SASS, which runs on 8.x only (the arch table).
FA2_SASS_ONLY = make_build("full", fa2={"gencode": ["sm_80"]})
FA2_SM90_SASS_ONLY = make_build("full", fa2={"gencode": ["sm_80", "sm_90"]}, fa3={"built": False, "reason": "off"})

# (id, capabilities, VLLM_FLASH_ATTN_VERSION, build, module errors, request) ->
#     (version, reason fragment, warning fragment or None)
CASES = [
    ("hopper-default", HOPPER, None, "full", {}, {}, 3, "default for compute capability 9.0", None),
    ("hopper-minimal", HOPPER, None, "minimal", {}, {}, 3, "FA3 is built and loads", None),
    ("ampere-default", AMPERE, None, "full", {}, {}, 2, "default for compute capability 8.0", None),
    ("ada-default", ADA, None, "full", {}, {}, 2, "runs on sm90 only", None),
    ("blackwell-default", BLACKWELL, None, "full", {}, {}, 2, "compute capability 10.0", None),
    ("blackwell12-default", BLACKWELL_12, None, "full", {}, {}, 2, "compute capability 12.0", None),
    ("env-2-on-hopper", HOPPER, "2", "full", {}, {}, 2, "VLLM_FLASH_ATTN_VERSION=2", None),
    ("env-3-on-hopper", HOPPER, "3", "full", {}, {}, 3, "VLLM_FLASH_ATTN_VERSION=3", None),
    ("env-empty-is-unset", HOPPER, " ", "full", {}, {}, 3, "default", None),
    ("env-3-on-ampere", AMPERE, "3", "full", {}, {}, 2, "VLLM_FLASH_ATTN_VERSION=3", "runs on sm90 only"),
    ("env-3-on-ada", ADA, "3", "full", {}, {}, 2, "VLLM_FLASH_ATTN_VERSION=3", "compute capability 8.9"),
    ("env-3-on-blackwell", BLACKWELL, "3", "full", {}, {}, 2, "VLLM_FLASH_ATTN_VERSION=3", "10.0"),
    ("env-3-on-blackwell12", BLACKWELL_12, "3", "full", {}, {}, 2, "VLLM_FLASH_ATTN_VERSION=3", "12.0"),
    ("alibi-on-hopper", HOPPER, None, "full", {}, {"requires_alibi": True}, 2, "default", "ALiBi"),
    ("alibi-env-3", HOPPER, "3", "full", {}, {"requires_alibi": True}, 2, "=3", "ALiBi"),
    ("alibi-on-ampere", AMPERE, None, "full", {}, {"requires_alibi": True}, 2, "default", None),
    ("head-size-not-in-fa3", HOPPER, None, FA3_128_ONLY, {}, {"head_size": 256}, 2, "default",
     "larger than the largest FA3 head dim"),
    ("head-size-rounds-up-fa3", HOPPER, None, FA3_128_ONLY, {}, {"head_size": 64}, 3, "default", None),
    ("head-size-nowhere", HOPPER, None, "minimal", {}, {"head_size": 256}, None, "hdim256", "FA3 cannot serve"),
    ("head-size-odd", AMPERE, None, "full", {}, {"head_size": 36}, None, "multiples of 8", None),
    ("head-size-72-fa2", AMPERE, None, "full", {}, {"head_size": 72}, 2, "default", None),
    ("dtype-not-in-fa3", HOPPER, None, NO_FP16_FA3, {}, {"dtype": torch.float16}, 2, "default",
     "no FA3 kernels for float16"),
    ("dtype-nowhere", HOPPER, None, "minimal", {}, {"dtype": torch.float16}, None,
     "no FA2 kernels for float16", "no FA3 kernels for float16"),
    ("fp8-hopper", HOPPER, None, "full", {}, {"dtype": torch.float8_e4m3fn}, 3, "default", None),
    ("fp8-ampere", AMPERE, None, "full", {}, {"dtype": torch.float8_e4m3fn}, None, "FP8", None),
    ("fp8-not-built", HOPPER, None, NO_E4M3, {}, {"dtype": "fp8"}, None, "FA2 supports dtypes",
     "no FA3 kernels for float8_e4m3fn"),
    ("float32-nowhere", HOPPER, None, "full", {}, {"dtype": torch.float32}, None, "got float32",
     "FA3 supports dtypes"),
    ("hdimdiff-hopper", HOPPER, None, "full", {}, {"head_size": 192, "head_size_v": 128}, 3, "default", None),
    ("hdimdiff-not-built", HOPPER, None, NO_HDIMDIFF, {}, {"head_size": 192, "head_size_v": 128},
     None, "same head size for V", "hdimdiff"),
    ("sinks-hopper", HOPPER, None, "full", {}, {"has_sinks": True}, 3, "default", None),
    ("sinks-ampere", AMPERE, None, "full", {}, {"has_sinks": True}, None, "sinks", None),
    ("fa3-fails-to-import", HOPPER, None, "full", {3: LOAD_ERROR}, {}, 2, "failed to import",
     "FA3 is built but unusable"),
    ("fa3-fails-env-3", HOPPER, "3", "full", {3: LOAD_ERROR}, {}, 2, "=3", "failed to import"),
    ("fa3-not-built", HOPPER, None, NO_FA3, {}, {}, 2, "built without FA3: nvcc 12.2", None),
    ("fa2-fails-to-import", AMPERE, None, "full", {2: LOAD_ERROR}, {}, None, "undefined symbol", None),
    ("both-fail-hopper", HOPPER, None, "full", {2: LOAD_ERROR, 3: LOAD_ERROR}, {}, None,
     "FA2 cannot be used", "FA3 is built but unusable"),
    # The build record's code against the GPU, by the arch table (cuda_archs): SASS runs on its own
    # major only, so a GPU newer than the arch list gets nothing from an FA2 built without PTX.
    ("fa2-sass-on-ampere", ADA, None, FA2_SASS_ONLY, {}, {}, 2, "default for compute capability 8.9", None),
    ("fa2-sass-on-blackwell", BLACKWELL, None, FA2_SASS_ONLY, {}, {}, None,
     "FA2 is sm_80 code, which does not run on compute capability 10.0 (GPU 0): rebuild it with 10.0", None),
    ("fa2-sass-on-hopper", HOPPER, None, FA2_SASS_ONLY, {}, {}, 3, "default", None),
    ("fa2-sass-env-2-on-hopper", HOPPER, "2", FA2_SASS_ONLY, {}, {}, None, "sm_80 code, which does not run", None),
    ("fa2-sm90-sass-on-hopper", HOPPER, None, FA2_SM90_SASS_ONLY, {}, {}, 2, "FA3 unusable", None),
    ("turing", TURING, None, "full", {}, {}, None, "compute capability 7.5", None),
    ("no-gpu", None, None, "full", {}, {}, None, "no CUDA GPU is visible", None),
    ("no-gpu-env-3", None, "3", "full", {}, {}, None, "no CUDA GPU", None),
    ("no-build-info", HOPPER, None, None, {}, {}, None, "build_info.json is missing", None),
]


def _fallback_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, FlashAttnFallbackWarning)]


@pytest.mark.parametrize(
    "caps, env_value, build, errors, request_, version, reason, warning",
    [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_selector_table(describe, caps, env_value, build, errors, request_, version, reason, warning):
    describe(caps=() if caps is None else (caps,), build=build, module_errors=errors,
             env={} if env_value is None else {"VLLM_FLASH_ATTN_VERSION": env_value})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        selection = selector.select_flash_attn_version(**request_)
        again = selector.get_flash_attn_version(**request_)
    assert selection.version == version
    assert again == version
    assert reason in selection.reason
    emitted = _fallback_warnings(record)
    if warning is None:
        assert emitted == [] and selection.fallbacks == ()
    else:
        # Exactly one warning, even though the question was asked twice.
        assert len(emitted) == 1, emitted
        assert warning in emitted[0]
        assert selection.fallbacks == (emitted[0],)


def test_one_warning_per_distinct_reason(describe):
    describe(caps=(HOPPER,), build=FA3_128_ONLY)
    with pytest.warns(FlashAttnFallbackWarning, match="ALiBi") as record:
        for _ in range(3):
            assert selector.get_flash_attn_version(requires_alibi=True) == 2
            assert selector.get_flash_attn_version(requires_alibi=True, head_size=128) == 2
    assert len(_fallback_warnings(record)) == 1
    with pytest.warns(FlashAttnFallbackWarning, match="head dim") as record:
        selector.get_flash_attn_version(head_size=256)
        selector.get_flash_attn_version(head_size=256)
    assert len(_fallback_warnings(record)) == 1


@pytest.mark.parametrize("value", ["5", "1", "fa3", "3.0", "v2", "2,3", "-1"])
def test_invalid_env_value_raises_without_gpu(describe, value):
    describe(caps=(), env={"VLLM_FLASH_ATTN_VERSION": value})
    with pytest.raises(ValueError, match="VLLM_FLASH_ATTN_VERSION"):
        selector.get_flash_attn_version()
    with pytest.raises(ValueError, match=f"VLLM_FLASH_ATTN_VERSION={value!r}"):
        selector.select_flash_attn_version(requires_alibi=True, head_size=128)


def test_invalid_env_value_raises_on_this_machine(monkeypatch):
    # The real probe, on the CPU-only test machine.
    set_environment(SystemEnvironment())
    monkeypatch.setenv("VLLM_FLASH_ATTN_VERSION", "three")
    with pytest.raises(ValueError, match="VLLM_FLASH_ATTN_VERSION='three'.*set it to 2, 3 or 4"):
        selector.get_flash_attn_version()
    monkeypatch.delenv("VLLM_FLASH_ATTN_VERSION")
    if not torch.cuda.is_available():
        assert selector.get_flash_attn_version() is None
        assert "no CUDA GPU" in selector.flash_attn_version_reason()


def test_per_device_answers(describe):
    describe(caps=(AMPERE, HOPPER))
    assert selector.get_flash_attn_version(device=0) == 2
    assert selector.get_flash_attn_version(device=1) == 3
    assert selector.get_flash_attn_version(device="cuda:1") == 3
    assert selector.get_flash_attn_version(device=torch.device("cuda", 0)) == 2
    assert selector.get_flash_attn_version() == 2  # current device is 0
    missing = selector.select_flash_attn_version(device=5)
    assert missing.version is None and "no CUDA device 5 (2 visible)" in missing.reason


def test_supported_and_reason(describe):
    describe(caps=(AMPERE,))
    assert selector.is_fa_version_supported(2)
    assert selector.fa_version_unsupported_reason(2) is None
    assert not selector.is_fa_version_supported(3)
    assert "runs on sm90 only" in selector.fa_version_unsupported_reason(3)
    # vLLM probes FA4 on newer GPUs: an answer, not an error.
    assert not selector.is_fa_version_supported(4)
    assert "FA4" in selector.fa_version_unsupported_reason(4)
    with pytest.raises(ValueError, match="must be 2, 3 or 4"):
        selector.is_fa_version_supported(1)


def test_supported_without_gpu_or_build(describe):
    describe(caps=())
    assert "no CUDA GPU" in selector.fa_version_unsupported_reason(2)
    describe(caps=(HOPPER,), build=None)
    assert not selector.is_fa_version_supported(3)
    assert "build_info.json is missing" in selector.fa_version_unsupported_reason(3)


@pytest.mark.parametrize("caps, build, expected", [
    (HOPPER, "full", True), (HOPPER, "minimal", True), (HOPPER, NO_E4M3, False),
    (AMPERE, "full", False), (BLACKWELL, "full", False), (None, "full", False),
])
def test_supports_fp8(describe, caps, build, expected):
    describe(caps=() if caps is None else (caps,), build=build)
    assert selector.flash_attn_supports_fp8() is expected


def test_supports_fp8_follows_env_override(describe):
    describe(caps=(HOPPER,), env={"VLLM_FLASH_ATTN_VERSION": "2"})
    assert selector.flash_attn_supports_fp8() is False


@pytest.mark.parametrize("caps, version", [(HOPPER, 3), (AMPERE, 2)])
def test_selections_are_cached(describe, caps, version):
    # A selection probes the module it picks (the described machine counts each probe;
    # the real one caches imports itself, test_system_environment_probes_once). Asked
    # again, the same question is answered from the selector's cache: no probe.
    machine = describe(caps=(caps,))
    for _ in range(5):
        assert selector.get_flash_attn_version() == version
    assert machine.load_calls.count(version) == 1, machine.load_calls
    for _ in range(5):  # another question: one more selection, then cached as well
        assert selector.get_flash_attn_version(head_size=128) == version
    assert machine.load_calls.count(version) == 2, machine.load_calls
    # Support queries are not selections: they ask the environment every time.
    selector.is_fa_version_supported(version)
    assert machine.load_calls.count(version) == 3, machine.load_calls


def test_system_environment_probes_once(monkeypatch):
    calls = []

    def fake_import(version, name):
        calls.append(name)
        return "ImportError: nope"

    machine = SystemEnvironment()
    monkeypatch.setattr("vendored_flash_attn.selection.environment._import_module", fake_import)
    assert machine.load_module(3) == "ImportError: nope"
    assert machine.load_module(3) == "ImportError: nope"
    assert len(calls) == 1
    capability_calls = []
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda index: capability_calls.append(index) or (9, 0))
    assert machine.capability(0) == (9, 0) and machine.capability(0) == (9, 0)
    assert capability_calls == [0]


def test_missing_module_is_reported_not_raised():
    from vendored_flash_attn.selection.environment import _import_module

    error = _import_module(3, "_no_such_module")
    assert error.startswith("ModuleNotFoundError") and "_no_such_module" in error


# --- a damaged build_info.json: the selector answers None with the reason, never raises ----

# The real SystemEnvironment (which reads the installed file) on a machine that looks like
# one with a Hopper GPU: without a GPU the selector answers before it reads the build info.
_PROBE = """
import json, torch
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.current_device = lambda: 0
torch.cuda.get_device_capability = lambda index=None: (9, 0)
import vendored_flash_attn as vfa
print(json.dumps({"version": vfa.get_flash_attn_version(),
                  "reason": vfa.flash_attn_version_reason(),
                  "supported": vfa.is_fa_version_supported(3),
                  "why_not": vfa.fa_version_unsupported_reason(3)}))
"""


@pytest.mark.parametrize("damage", ["truncated", "not-an-object", "wrong-type"])
def test_a_damaged_build_info_file_is_a_reason_not_an_exception(tmp_path, damage):
    """The installed package with a build_info.json cut short by a full disk or an
    interrupted copy (or edited by hand): the selector says why it picks nothing, and
    ``info`` reports the file as unreadable with the fix, exit status 1, no traceback."""
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    site = tmp_path / "site"
    package = Path(selector.__file__).parents[1]  # the package root
    shutil.copytree(package, site / package.name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    # The wheel installs the project's declaration beside the package (cmake/BuildInfo.cmake).
    shutil.copy(package.parents[1] / "cmake" / "knobs.json", site / package.name / "knobs.json")
    text = json.dumps(make_build("minimal").raw)
    damaged = {"truncated": text[: len(text) // 2],
               "not-an-object": "[1, 2]",
               "wrong-type": json.dumps({**make_build("minimal").raw, "fa3": "yes"})}[damage]
    (site / package.name / "build_info.json").write_text(damaged)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1",
           "CUDA_VISIBLE_DEVICES": ""}
    probe = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
    assert probe.returncode == 0, probe.stderr
    answer = json.loads(probe.stdout.strip().splitlines()[-1])
    assert answer["version"] is None and answer["supported"] is False, answer
    assert "build_info.json" in answer["reason"] and "reinstall" in answer["reason"], answer
    assert "build_info.json" in answer["why_not"], answer

    info = subprocess.run([sys.executable, "-m", "vendored_flash_attn", "info"], env=env,
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert info.returncode == 1, info.stdout + info.stderr
    assert "Traceback" not in info.stderr, info.stderr
    expected = {"truncated": "is not valid JSON", "not-an-object": "not an object",
                "wrong-type": "a field this package cannot read"}[damage]
    assert expected in info.stdout and "reinstall the package" in info.stdout, info.stdout


# --- each family's declared rules (cmake/knobs.json families), not FA3's for all --------------

def _fa4_build():
    from runtime_fakes import FA4_RECORD

    return make_build("full", fa4=FA4_RECORD)


@pytest.fixture
def declared(describe):
    """Swap in a copy of the family declaration edited by the test; the real one after."""
    from vendored_flash_attn.declaration import knob_values as declaration, families

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


def _pick(describe, caps, build, **request):
    describe(caps=(caps,), build=build)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        selection = selector.select_flash_attn_version(**request)
    return selection, _fallback_warnings(record)


def test_fa4_takes_sinks_with_different_head_sizes_as_it_declares_no_such_rule(describe, declared):
    # FA3 declares sinks only with equal Q/K and V head sizes (sinks_same_head_sizes); FA4 does
    # not, so on Blackwell the selector keeps FA4 for such a model. It once applied FA3's rule
    # to every family and answered None.
    request = dict(has_sinks=True, head_size=192, head_size_v=128)
    selection, warned = _pick(describe, BLACKWELL, _fa4_build(), **request)
    assert selection.version == 4 and warned == [], (selection, warned)
    selection, _ = _pick(describe, HOPPER, "full", **request)  # FA3's own rule still holds for FA3
    assert selection.version is None
    assert "FA3 does not support attention sinks (s_aux) with different Q/K and V head sizes" in selection.reason
    assert "FA2 has no sinks" in selection.reason
    # Declared for FA4 too, the same rule applies to it: the declaration decides.
    declared(lambda section: section["fa4"]["call"].update(sinks_same_head_sizes=True))
    selection, _ = _pick(describe, BLACKWELL, _fa4_build(), **request)
    assert selection.version is None and "FA4 does not support attention sinks" in selection.reason


@pytest.mark.parametrize("caps, head_size, head_size_v, version, warning", [
    (BLACKWELL, 128, None, 4, None),
    (BLACKWELL, 256, None, 4, None),
    (BLACKWELL, 192, 128, 4, None),
    (BLACKWELL, 160, None, 2, "FA4 cannot serve this model: FA4 takes head sizes (Q/K x V) on sm100"),
    (BLACKWELL, 96, 64, 4, None),
])
def test_fa4s_declared_head_sizes_decide_on_blackwell(describe, caps, head_size, head_size_v, version, warning):
    # FA4 has no head-dim knob, but its kernels take only the head sizes its declaration lists
    # per generation (call.head_sizes): the selector once skipped the head-size question for a
    # family without a knob, so a model FA4 cannot run got FA4 and failed at its first call.
    selection, warned = _pick(describe, caps, _fa4_build(), head_size=head_size, head_size_v=head_size_v)
    assert selection.version == version, selection
    if warning is None:
        assert warned == []
    else:
        assert len(warned) == 1 and warning in warned[0] and "using FA2" in warned[0], warned


def test_a_head_size_rule_edited_in_the_declaration_changes_the_pick(describe, declared):
    declared(lambda section: section["fa4"]["call"]["head_sizes"].update(sm100=[[8, 64, 8, 64]]))
    selection, warned = _pick(describe, BLACKWELL, _fa4_build(), head_size=128)
    assert selection.version == 2 and "on sm100: 8-64 x 8-64" in warned[0]
