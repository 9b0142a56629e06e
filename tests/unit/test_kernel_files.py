"""tests/gpu/test_kernel_files_gpu.py on CPU: the files its calls are expected to run
(gpu_helpers.kernel_file of each call shape of each kernel set the build info lists, less
the shapes whose FA3 feature the wheel lacks: those are refused and skipped) are exactly
the FA3 instantiations and FA2 units (sparse aside: tests/gpu/test_sparse_gpu.py) that the
build compiles for the same knobs (cmake/KernelSelection.cmake through
cmake/kernel_units.cmake), for `full`, `minimal` and every slice of `full`. On the H200,
tests/gpu/kernel_coverage.py then checks from the kernels launched that each file ran."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from runtime_fakes import make_build

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT / "tests/gpu", ROOT / "benchmarks"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import dist_model  # noqa: E402  (benchmarks/, on the path above)
import gpu_helpers  # noqa: E402  (tests/gpu, on the path above)

SELECTIONS = {
    "full": {"VFA_PRESET": "full"},
    "minimal": {"VFA_PRESET": "minimal"},
    **{name: dist_model.slice_knobs(spec) for name, spec in dist_model.load_slices().items()},
    "full-without-softcap-split": {"VFA_PRESET": "full", "VFA_FA3_FEATURES": "paged,local,hdimdiff"},
}
FIELDS = {"HEAD_DIMS": "head_dims", "DTYPES": "dtypes", "FEATURES": "features"}
MODULE_UNITS = ("flash_fwd_combine.cu", "tile_scheduler.cu")  # every FA3 build's, no kernel set's


def fake_build(knobs: dict[str, str]):
    """The build info CMake writes for these knobs, as far as the kernel selection goes."""
    records = {}
    for family in ("fa2", "fa3"):
        prefix = f"VFA_{family.upper()}_"
        if knobs.get(f"VFA_BUILD_{family.upper()}", "").upper() == "OFF":
            records[family] = {"built": False, "head_dims": [], "dtypes": [], "features": [],
                               "reason": f"VFA_BUILD_{family.upper()}=off"}
            continue
        record = {}
        for suffix, field in FIELDS.items():
            if prefix + suffix in knobs:
                values = knobs[prefix + suffix].split(",")
                record[field] = [int(v) for v in values] if field == "head_dims" else values
        records[family] = record
    return make_build(knobs["VFA_PRESET"], **records)


def expected_files(build) -> set[tuple[str, str]]:
    files = set()
    for version in (2, 3):
        for head_dim, head_dim_v, dtype in gpu_helpers.kernel_sets(version, build):
            for shape in gpu_helpers.CALL_SHAPES[version]:
                needs = dict(paged=shape.page_size is not None, softcap=shape.softcap,
                             num_splits=shape.num_splits, causal=shape.causal)
                if gpu_helpers.fa3_missing_feature(version, needs, build) is None:
                    files.add((f"fa{version}", gpu_helpers.kernel_file(version, head_dim, head_dim_v, dtype, shape)))
    return files


@pytest.mark.parametrize("name", SELECTIONS)
def test_the_calls_reach_every_compiled_kernel_file(name):
    knobs = SELECTIONS[name]
    compiled = {(module, unit) for module, unit in dist_model.kernel_units(knobs)
                if "sparse" not in unit and unit not in MODULE_UNITS}
    expected = expected_files(fake_build(knobs))
    assert compiled, name
    assert sorted(compiled - expected) == [], "compiled, no call of test_kernel_files_gpu.py reaches it"
    assert sorted(expected - compiled) == [], "a call expects a file the build does not compile"


def test_the_names_follow_upstreams_dispatch():
    """A few files by hand: PackGQA only where neither paged K/V nor split forces it unnamed,
    and for MHA only with equal head dims (FLASHATTENTION_PACKGQA_ONLY)."""
    shapes = {s.name: s for s in gpu_helpers.FA3_CALL_SHAPES}
    assert gpu_helpers.kernel_file(3, 128, 128, "bf16", shapes["mha"]) == "flash_fwd_hdim128_bf16_packgqa_sm90.cu"
    assert gpu_helpers.kernel_file(3, 64, 512, "bf16", shapes["mha"]) == "flash_fwd_hdim64_512_bf16_sm90.cu"
    assert (gpu_helpers.kernel_file(3, 192, 128, "e4m3", shapes["mha-softcap"])
            == "flash_fwd_hdim192_128_e4m3_softcap_sm90.cu")
    assert (gpu_helpers.kernel_file(3, 256, 256, "fp16", shapes["paged-split-softcap"])
            == "flash_fwd_hdim256_fp16_paged_split_softcap_sm90.cu")
    fa2 = {s.name: s for s in gpu_helpers.FA2_CALL_SHAPES}
    assert gpu_helpers.kernel_file(2, 96, 96, "fp16", fa2["paged-align-causal"]) == \
        "flash_fwd_split_align_hdim96_fp16_causal_sm80.cu"
    assert gpu_helpers.kernel_file(2, 256, 256, "bf16", fa2["packed"]) == "flash_fwd_hdim256_bf16_sm80.cu"
