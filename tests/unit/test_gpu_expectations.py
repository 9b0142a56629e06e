"""What the GPU tests expect of a wheel, derived from its build info, checked on CPU with
fake build infos: the full preset, the minimal one and the slices of `full` built on the
H200 (docs/full-preset-slices.md), whose GPU runs failed on tests that assumed head dim 128
and FA3. Each expectation is the one the GPU test uses (tests/gpu/gpu_helpers.py and the
test modules), held against the package's own rule where there is one.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from runtime_fakes import make_build
from vendored_flash_attn.declaration.families import registry
from vendored_flash_attn.declaration.kernels import sparse_problem
from vendored_flash_attn.call.scheduler_metadata import MetadataArgs, derive, mismatches

GPU_TESTS = Path(__file__).resolve().parents[1] / "gpu"
if str(GPU_TESTS) not in sys.path:
    sys.path.insert(0, str(GPU_TESTS))

import gpu_helpers  # noqa: E402  (tests/gpu, on the path above)

NO_FA3 = {"built": False, "head_dims": [], "dtypes": [], "features": [], "defines": [],
          "gencode": [], "reason": "VFA_BUILD_FA3=off"}
NO_FA2 = {"built": False, "head_dims": [], "dtypes": [], "features": [], "gencode": [],
          "reason": "VFA_BUILD_FA2=off"}
WHEELS = {
    "full": make_build("full"),
    "minimal": make_build("minimal"),
    # the slices of `full` (benchmarks/full_slices.json), as their build infos list them
    "hd128-256": make_build(fa2={"head_dims": [128, 256]}, fa3={"head_dims": [128, 256]}),
    "fa3-hd96-fa2-hd96-192": make_build(fa2={"head_dims": [96, 192]}, fa3={"head_dims": [96]}),
    "fa3-hd64": make_build(fa2=NO_FA2, fa3={"head_dims": [64]}),
    "fa3-hd192": make_build(fa2=NO_FA2, fa3={"head_dims": [192]}),
    "fa2-hd32-64": make_build(fa2={"head_dims": [32, 64]}, fa3=NO_FA3),
    # a minimal wheel without the sparse feature
    "fa2-no-sparse": make_build("minimal", fa2={"features": []}),
}


# --- sparse: the refusal names the wheel's own cause ------------------------------------

@pytest.mark.parametrize("name", WHEELS)
def test_sparse_refusal_expectation_is_the_packages_message(name):
    """test_refused_without_sparse_kernels expects these fragments; the package's refusal
    (sparse_problem, which sparse_attn_func raises before any kernel) must hold each."""
    build = WHEELS[name]
    fragments = gpu_helpers.sparse_refusal_fragments(build)
    problem = sparse_problem(registry().having("sparse")[0], build.fa2)
    if problem is None:
        assert fragments == [], "the wheel has the sparse kernels: nothing is refused"
        return
    assert fragments, f"{name}: the package refuses sparse calls ({problem}), the test expects none"
    for fragment in fragments:
        assert fragment.lower() in problem.lower(), (fragment, problem)


def test_sparse_refusal_names_head_dims_not_the_feature_on_a_slice():
    """The H200 runs of fa3-hd96-fa2-hd96-192 and fa2-hd32-64: 'sparse' is in the features,
    head dim 128 is not; the cause is the head dim, not the feature."""
    for name, dims in (("fa3-hd96-fa2-hd96-192", "96, 192"), ("fa2-hd32-64", "32, 64")):
        fragments = gpu_helpers.sparse_refusal_fragments(WHEELS[name])
        assert "VFA_FA2_FEATURES=sparse" not in fragments
        assert f"FA2 head dims built: {dims}" in fragments
    assert "VFA_FA2_FEATURES=sparse" in gpu_helpers.sparse_refusal_fragments(WHEELS["fa2-no-sparse"])


# --- smoke check: a head dim and dtype each built version has ----------------------------

@pytest.mark.parametrize("name", WHEELS)
def test_smoke_calls_are_built_kernels(name):
    build = WHEELS[name]
    calls = gpu_helpers.smoke_calls(build)
    assert [v for v, _, _ in calls] == [v for v in (2, 3) if build.component(v).built]
    for version, head_dim, dtype in calls:
        comp = build.component(version)
        assert head_dim in comp.head_dims and dtype in comp.dtypes, (version, head_dim, dtype)
        if 128 in comp.head_dims:
            assert head_dim == 128  # Llama's head dim where built, as before the slices


# --- scheduler metadata: which branch test_metadata_for_the_call_runs_and_is_right takes ---

def _chunked_prefill(head_dim: int, page_size, dtype=torch.bfloat16) -> MetadataArgs:
    """What _metadata records for test_vllm_surface_gpu's paged chunked prefill (32/8 heads,
    causal, cu_seqlens_q, num_splits 0), with or without page_size."""
    return MetadataArgs(batch_size=6, max_seqlen_q=281, max_seqlen_k=794, num_heads_q=32,
                        num_heads_kv=8, headdim=head_dim, headdim_v=head_dim, qkv_dtype=dtype,
                        cu_seqlens_q=True, page_size=page_size, causal=True,
                        window_size=(-1, -1), has_softcap=False, num_splits=0)


@pytest.mark.parametrize("name, omission_accepted", [
    ("full", True), ("minimal", True), ("hd128-256", True), ("fa3-hd64", True),
    ("fa3-hd192", True), ("fa3-hd96-fa2-hd96-192", False)])
def test_page_size_omission_is_accepted_where_the_tile_ignores_it(name, omission_accepted):
    """At the wheel's primary FA3 head dim (the one the GPU test calls), metadata without
    page_size for a paged 16-bit causal prefill gives FA3's schedule for the call (head dims
    64, 128, 192, 256: the GPU test runs it and checks the output) or a different tile (96:
    (192, 144) vs (192, 128), refused by upstream's op too, measured on the H200), which the
    GPU test expects refused. A wheel with head dim 128 keeps the stronger check: the kernel
    runs with the metadata that omits page_size."""
    build = WHEELS[name]
    head_dim = gpu_helpers.primary_head_dim(3, build)
    differences = mismatches(derive(_chunked_prefill(head_dim, None), build.fa3),
                             derive(_chunked_prefill(head_dim, 16), build.fa3))
    assert (differences == []) is omission_accepted, (head_dim, differences)
    if not omission_accepted:
        assert [line.split(":")[0] for line in differences] == ["tile"], differences


# --- bad input: the bar follows the versions the wheel holds ---------------------------------

def _load_bad_input():
    spec = importlib.util.spec_from_file_location("vfa_unit_gpu_bad_input", GPU_TESTS / "test_bad_input.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bad_input = _load_bad_input()


@pytest.fixture
def installed(monkeypatch):
    """install(build): the GPU tests see ``build`` as the installed wheel's, on a Hopper GPU
    where every built version imports."""

    def install(build):
        def version_skip_reason(version, check_gpu=True):
            comp = build.component(version)
            return None if comp.built else f"this wheel was built without FA{version}: {comp.reason}"

        monkeypatch.setattr(gpu_helpers, "BUILD", build)
        monkeypatch.setattr(bad_input, "BUILD", build)
        monkeypatch.setattr(bad_input, "version_skip_reason", version_skip_reason)
        return [v for v in (2, 3) if build.component(v).built]

    return install


@pytest.mark.parametrize("name", WHEELS)
def test_bad_input_bar_is_met_by_what_the_wheel_runs(installed, name):
    """The bad calls unmet() lets through on this wheel meet the bar (on fa2-hd32-64: 31
    of 87, all FA2; a fixed half of BAD failed it)."""
    usable = installed(WHEELS[name])
    refused = [bad.id for bad in bad_input.BAD if bad_input.unmet(bad) is None]
    skipped = [bad.id for bad in bad_input.BAD if bad_input.unmet(bad) is not None]
    bad_input.check_bad_calls_made(refused, skipped, usable)
    if name == "fa2-hd32-64":
        assert len(refused) == 31 and all(2 in bad_input.bad_versions(b) for b in bad_input.BAD
                                          if b.id in refused)


@pytest.mark.parametrize("name", ["full", "fa2-hd32-64", "fa3-hd192"])
def test_bad_input_bar_fails_when_calls_are_not_made(installed, name):
    """A rule that skips a call the wheel can make fails the bar: one call left out, or
    every call left out."""
    usable = installed(WHEELS[name])
    refused = [bad.id for bad in bad_input.BAD if bad_input.unmet(bad) is None]
    generic = next(bad.id for bad in bad_input.BAD if bad.id in refused and not bad.needs)
    with pytest.raises(AssertionError, match=generic):
        bad_input.check_bad_calls_made([i for i in refused if i != generic], [generic], usable)
    with pytest.raises(AssertionError, match="were not made"):
        bad_input.check_bad_calls_made([], refused, usable)
