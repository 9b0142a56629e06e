"""What a compiled family's module is built from, declared in cmake/knobs.json
("families.<name>.build", the selection knobs' "presets"): the validator's refusals, and the
rule's files and defines as cmake/KernelSelection.cmake applies it (script mode). The same
rule in whole configures: tests/build/test_configure.py; a fifth family built from nothing but
its declaration: tests/build/test_fifth_family.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cmake_runner import clean_env, run, tool
from vendored_flash_attn.declaration import knob_values as declaration, families

CMAKE_DIR = Path(__file__).resolve().parents[2] / "cmake"


def _kernels(d, name):
    return d["families"][name]["build"]["kernels"]


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["families"]["fa3"].pop("build"), "families.fa3: missing fields ['build']"),
    (lambda d: d["families"]["fa3"]["build"].update(sourcs=[]), "families.fa3.build must be an object of"),
    (lambda d: d["families"]["fa3"]["build"].update(sources=["/etc/passwd"]),
     "families.fa3.build.sources names '/etc/passwd' of flash_attention, but it is an absolute path, outside the "
     "verified sources. Fix families.fa3.build.sources in cmake/knobs.json"),
    (lambda d: d["families"]["fa3"]["build"].update(sources=[3]),
     "families.fa3.build.sources must be a list of paths inside the upstream tree"),
    # A '..' leaves the verified sources: said so, not as a format error ("must be a list of [component, ...]").
    (lambda d: d["families"]["fa2"]["build"].update(include_dirs=[["flash_attention", "csrc/../csrc/common"]]),
     "families.fa2.build.include_dirs names the include directory 'csrc/../csrc/common' of flash_attention, but "
     "its '..' part leaves the folder before it, so it could reach files outside the verified sources"),
    (lambda d: d["families"]["fa2"]["build"].update(include_dirs=[["cutlass", "../include"]]),
     "families.fa2.build.include_dirs names the include directory '../include' of cutlass, but its '..' part"),
    (lambda d: d["families"]["fa2"]["build"].update(include_dirs=[["csrc", "flash_attn"]]),
     "families.fa2.build.include_dirs must be a list of [component, folders...]"),
    (lambda d: d["families"]["fa2"]["build"].update(memory_sixteenths=20), "memory_sixteenths must be a whole number"),
    (lambda d: d["families"]["fa2"]["build"].update(unit_kinds=[["FA2|CUDA", "1", "", ""]]),
     "unit_kinds must be a list of [kind, seconds, path text, cached seconds]"),
    (lambda d: _kernels(d, "fa3")["variants"][2].update(features=["splitkv"]),
     "families.fa3.build.kernels.variants[2].features must be a list of the choices of its knob"),
    (lambda d: _kernels(d, "fa3").update(file="hopper/instantiations/flash_fwd_hdim{kernel}_{dtype}{variant}{arch}.cu"),
     "families.fa3.build.kernels.variants[0] leaves {arch} of families.fa3.build.kernels.file unfilled"),
    (lambda d: _kernels(d, "fa2")["variants"][0].update(stub="forward"),
     "families.fa2.build.kernels.variants[0].stub 'forward' names no kind of families.fa2.build.kernels.stubs.kinds"),
    (lambda d: _kernels(d, "fa2")["stubs"]["types"].pop("fp16"),
     "families.fa2.build.kernels.stubs must hold includes, namespace, a C++ type for each of bf16, fp16"),
    (lambda d: _kernels(d, "fa3").update(left_out="skip"), "families.fa3.build.kernels.left_out must be stub or disable"),
    (lambda d: _kernels(d, "fa3")["extra_kernels"][0].update(head_dim="72"), "families.fa3.build.kernels.extra_kernels"),
    (lambda d: _kernels(d, "fa3")["disable"]["dtypes"].append(["fp32", "X"]),
     "families.fa3.build.kernels.disable.dtypes must be a list of [one of ['bf16', 'fp16', 'e4m3']"),
    (lambda d: _kernels(d, "fa3")["knob_defines"][0].__setitem__(0, "VFA_PRESET"),
     "families.fa3.build.kernels.knob_defines: ['VFA_PRESET', 'OFF', "),
    (lambda d: d["families"]["fa3"].update(dtypes_knob=None), "families.fa3.dtypes_knob: a compiled family names"),
    (lambda d: d["knobs"]["VFA_FA3_HEAD_DIMS"]["presets"].update(minimal=["72"]),
     "VFA_FA3_HEAD_DIMS.presets (the head_dims families.fa3 selects in a preset) must map presets of VFA_PRESET"),
    (lambda d: d["knobs"]["VFA_FA2_DTYPES"]["presets"].update(tiny=["bf16"]), "VFA_FA2_DTYPES.presets"),
])
def test_a_mistake_in_a_familys_build_is_refused(edit, message):
    data = declaration.load()
    edit(data)
    found = families.problems(data)
    assert any(message in line for line in found), found
    if "'..'" in message:
        assert not any("must be a list of [component" in line for line in found), found


SELECTION = """include("{cmake}/KernelSelection.cmake")
vfa_preset_values(heads {head_knob} minimal)
vfa_preset_values(dtypes {dtype_knob} minimal)
vfa_preset_values(features {feature_knob} minimal)
vfa_family_selection({family} "${{heads}}" "${{dtypes}}" "${{features}}")
string(TOUPPER {family} part)
message(NOTICE "FILES ${{VFA_${{part}}_INSTANTIATIONS}}")
message(NOTICE "DEFINES ${{VFA_${{part}}_DEFINES}}")
message(NOTICE "MISSING ${{VFA_${{part}}_MISSING}}")
"""


def _selection(tmp_path, family: str) -> dict[str, list[str]]:
    entry = declaration.load()["families"][family]
    script = tmp_path / f"{family}.cmake"
    script.write_text(SELECTION.format(cmake=CMAKE_DIR, family=family, head_knob=entry["head_dims_knob"],
                                       dtype_knob=entry["dtypes_knob"], feature_knob=entry["features_knob"]))
    result = run([tool("cmake"), "-P", str(script)], env=clean_env())
    assert result.returncode == 0, result.output
    return {line.split(" ", 1)[0]: [v for v in line.split(" ", 1)[1].split(";") if v]
            for line in result.output.splitlines() if line.startswith(("FILES ", "DEFINES ", "MISSING "))}


def test_the_minimal_selection_by_each_familys_declared_rule(tmp_path):
    """The minimal preset's files, defines and stubs, as the rule of each family's declaration
    gives them: FA3 switches off what is left out; FA2 stubs it."""
    fa3 = _selection(tmp_path, "fa3")
    assert fa3["FILES"] == [f"hopper/instantiations/flash_fwd_hdim128_{dt}_{v}_sm90.cu"
                            for dt in ("bf16", "e4m3") for v in ("packgqa", "split", "paged", "paged_split")]
    assert [d for d in fa3["DEFINES"] if "HDIM" in d or "FP16" in d or "SOFTCAP" in d or "FP8" in d] == [
        "FLASHATTENTION_DISABLE_HDIM64", "FLASHATTENTION_DISABLE_HDIM96", "FLASHATTENTION_DISABLE_HDIM192",
        "FLASHATTENTION_DISABLE_HDIM256", "FLASHATTENTION_DISABLE_FP16", "FLASHATTENTION_DISABLE_SOFTCAP",
        "FLASHATTENTION_DISABLE_HDIMDIFF64", "FLASHATTENTION_DISABLE_HDIMDIFF192"]
    assert fa3["MISSING"] == []
    fa2 = _selection(tmp_path, "fa2")
    assert fa2["FILES"] == [f"csrc/flash_attn/src/flash_{k}_hdim128_bf16{c}_sm80.cu"
                            for c in ("", "_causal") for k in ("fwd", "fwd_split", "fwd_split_align")]
    # Every other (dtype, head dim, causal) kernel (22 of 24: its fwd and split-KV dispatch) and the
    # four sparse ones (head dim 128 only; no `sparse` feature) stubbed.
    assert len(fa2["MISSING"]) == 22 * 2 + 4
    assert "sparse:bf16:128:3" in fa2["MISSING"] and "fwd:fp16:32:4" in fa2["MISSING"]
    assert fa2["DEFINES"] == ["FLASHATTENTION_DISABLE_BACKWARD", "FLASHATTENTION_DISABLE_DROPOUT",
                              "FLASHATTENTION_DISABLE_PYBIND"]
