"""What tests/gpu/test_hdimdiff_gpu.py expects of a wheel, checked on CPU:

* which FA3 kernels for a V head size different from Q/K's a build info lists
  (gpu_helpers.hdimdiff_unbuilt) is what the build compiles for the same knobs (the
  build's own rule, cmake/KernelSelection.cmake through cmake/kernel_units.cmake), for
  `full`, `minimal`, every slice of `full` and narrower selections;
* where a kernel is not listed, the package refuses the call (kernels.py, what validation
  and the selector say) with the fragment the GPU test expects, and where it is listed the
  package takes the call;
* the float64 reference with ``q_v``: the scores of [q, q_v] against [k, v].
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from runtime_fakes import make_build
from vendored_flash_attn.declaration.families import registry
from vendored_flash_attn.declaration.kernels import dtype_problem, head_size_problem

ROOT = Path(__file__).resolve().parents[2]
for extra in (ROOT / "tests/gpu", ROOT / "benchmarks"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import dist_model  # noqa: E402  (benchmarks/, on the path above)
import gpu_helpers  # noqa: E402  (tests/gpu, on the path above)
from reference import attention_ref  # noqa: E402

FA3_FIELDS = {"VFA_FA3_HEAD_DIMS": "head_dims", "VFA_FA3_DTYPES": "dtypes", "VFA_FA3_FEATURES": "features"}
SELECTIONS = {
    "full": {"VFA_PRESET": "full"},
    "minimal": {"VFA_PRESET": "minimal"},
    **{name: dist_model.slice_knobs(spec) for name, spec in dist_model.load_slices().items()},
    "full-without-hdimdiff": {"VFA_PRESET": "full", "VFA_FA3_FEATURES": "paged,split,softcap,local"},
    "hd64-192-bf16-e4m3": {"VFA_PRESET": "full", "VFA_FA3_HEAD_DIMS": "64,192", "VFA_FA3_DTYPES": "bf16,e4m3"},
    "hd128-hdimdiff": {"VFA_PRESET": "full", "VFA_FA3_HEAD_DIMS": "128"},
}
HDIMDIFF_FILE = re.compile(r"flash_fwd_hdim(\d+)_(\d+)_(bf16|fp16|e4m3)_")
CASES = [(pair, dtype) for pair in gpu_helpers.HDIMDIFF_KERNELS for dtype in ("bf16", "fp16", "e4m3")]


def fake_build(knobs: dict[str, str]):
    """The build info CMake writes for these knobs, as far as the FA3 selection goes."""
    if knobs.get("VFA_BUILD_FA3", "").upper() == "OFF":
        return make_build(knobs["VFA_PRESET"], fa3={"built": False, "head_dims": [], "dtypes": [],
                                                     "features": [], "reason": "VFA_BUILD_FA3=off"})
    fa3 = {}
    for knob, field in FA3_FIELDS.items():
        if knob in knobs:
            values = knobs[knob].split(",")
            fa3[field] = [int(v) for v in values] if field == "head_dims" else values
    return make_build(knobs["VFA_PRESET"], fa3=fa3)


@pytest.mark.parametrize("name", SELECTIONS)
def test_listed_kernels_are_the_ones_the_build_compiles(name):
    knobs = SELECTIONS[name]
    compiled = set()
    for module, file_name in dist_model.kernel_units(knobs):
        match = HDIMDIFF_FILE.search(file_name)
        if module == "fa3" and match:
            compiled.add(((int(match[1]), int(match[2])), match[3]))
    build = fake_build(knobs)
    listed = {(pair, dtype) for pair, dtype in CASES if gpu_helpers.hdimdiff_unbuilt(*pair, dtype, build) is None}
    assert listed == compiled


def test_the_slices_hold_the_hdimdiff_kernels_where_the_docs_say():
    """fa3-hd192: 192/128 in all three dtypes; fa3-hd64: 64/256 and 64/512 in bf16/fp16."""
    def listed(name):
        build = fake_build(SELECTIONS[name])
        return {(pair, d) for pair, d in CASES if gpu_helpers.hdimdiff_unbuilt(*pair, d, build) is None}

    assert listed("fa3-hd192") == {((192, 128), d) for d in ("bf16", "fp16", "e4m3")}
    assert listed("fa3-hd64") == {(pair, d) for pair in ((64, 256), (64, 512)) for d in ("bf16", "fp16")}
    assert listed("hd128") == listed("hd256") == listed("fa2-hd32-64") == listed("fa3-hd96-fa2-hd96-192") == set()


@pytest.mark.parametrize("name", SELECTIONS)
@pytest.mark.parametrize("pair,dtype", CASES)
def test_package_refuses_what_is_not_listed_with_the_expected_words(name, pair, dtype):
    build = fake_build(SELECTIONS[name])
    head_dim, head_dim_v = pair
    fa3 = registry().by_name("fa3")
    problem = dtype_problem(fa3, build.fa3, dtype) or head_size_problem(fa3, build.fa3, head_dim, head_dim_v, dtype)
    unbuilt = gpu_helpers.hdimdiff_unbuilt(head_dim, head_dim_v, dtype, build)
    if unbuilt is None:
        assert problem is None, f"{name}: the build info lists {pair} {dtype}; the package refuses: {problem}"
        return
    reason, fragment = unbuilt
    assert problem is not None, f"{name}: {pair} {dtype} is not built ({reason}) but the package takes it"
    assert fragment.lower() in problem.lower(), (fragment, problem)


def test_unbuilt_reason_names_the_build_info():
    build = fake_build(SELECTIONS["fa3-hd192"])
    reason, fragment = gpu_helpers.hdimdiff_unbuilt(64, 512, "bf16", build)
    assert "FA3 head dims 192" in reason and "head dim 64" in reason and fragment == "head size"
    reason, fragment = gpu_helpers.hdimdiff_unbuilt(192, 128, "bf16", fake_build(SELECTIONS["full-without-hdimdiff"]))
    assert "not 'hdimdiff'" in reason and fragment == "'hdimdiff'"
    no_fa3 = make_build(fa3={"built": False, "head_dims": [], "dtypes": [], "features": [],
                             "reason": "VFA_BUILD_FA3=off"})
    assert "VFA_BUILD_FA3=off" in gpu_helpers.hdimdiff_unbuilt(192, 128, "bf16", no_fa3)[0]


# --- the reference with q_v ---------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_reference_with_q_v_is_attention_of_the_concatenation(causal):
    """MLA's identity: q.k + q_v.v is the product of [q, q_v] and [k, v]; MQA (1 KV head)."""
    gen = torch.Generator().manual_seed(7)
    heads, d, dv = 4, 8, 32
    q_lens, k_lens = [1, 3, 5], [4, 3, 9]
    q = [torch.randn(n, heads, d, generator=gen) for n in q_lens]
    qv = [torch.randn(n, heads, dv, generator=gen) for n in q_lens]
    k = [torch.randn(n, 1, d, generator=gen) for n in k_lens]
    v = [torch.randn(n, 1, dv, generator=gen) for n in k_lens]
    scale = 0.11
    out, lse = attention_ref(q, k, v, softmax_scale=scale, causal=causal, qv_seqs=qv)
    q_cat = [torch.cat([a, b], dim=-1) for a, b in zip(q, qv, strict=True)]
    k_cat = [torch.cat([a, b], dim=-1) for a, b in zip(k, v, strict=True)]
    scores_out, scores_lse = attention_ref(q_cat, k_cat, v, softmax_scale=scale, causal=causal)
    assert out.shape == (sum(q_lens), heads, dv)
    torch.testing.assert_close(out, scores_out, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse, scores_lse, rtol=1e-6, atol=1e-6)
    # q_v changes the result (it is not ignored)
    plain, _ = attention_ref(q, k, v, softmax_scale=scale, causal=causal)
    assert (plain - out).abs().max() > 1e-2
