"""The paged decode call captured in a CUDA graph, for each family the wheel holds, as vLLM
captures its decode steps: persistent input buffers (q, K/V cache, ``cu_seqlens_q``,
``seqused_k``, block table, FP8 descales, out) that each step rewrites in place, and for FA3 its
scheduler metadata copied into the head of a persistent buffer (the rest zeroed) whose view
the captured call holds. The graph is captured on one batch, then replayed on another batch
(new queries, cache contents, lengths, block tables and descales written into the same
buffers) and must give what an eager call on those inputs gives, within the reference's
tolerance.

No host synchronisation inside a call: the eager call and the capture run under
``torch.cuda.set_sync_debug_mode("error")`` (a ``.item()``, ``.tolist()`` or a device-to-host
copy added to the call path raises), and the capture itself fails on any sync. What cannot be
captured must be refused under capture with a clear error before anything is enqueued: the
debug checks (they read index values), and a family declared ``call.cuda_graphs: false``
(none is at the pin; checked with a copy of the declaration).

Families the wheel holds may not skip (tests/gpu/conftest.py for FA2/FA3; FA4's skip says
"FA4 not usable", which tests/gpu/fa4_h200.sh and serving_h200.sh refuse).
"""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch

from gpu_helpers import (OUT_TOL, TORCH_DTYPES, check, decode_lengths, fa3_has_fp8, has_feature, make_problem,
                         primary_head_dim, reference, relative_l2)

HEADS, KV_HEADS, PAGE, BATCH = 32, 8, 16, 8
GRAPH_NUM_SPLITS = 16  # what vLLM passes FA3 under full CUDA graphs


@contextlib.contextmanager
def no_host_sync():
    """Any synchronising CUDA call in the block raises (torch's sync debug mode)."""
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _needs(version: int, dtype: str) -> None:
    import vendored_flash_attn

    if version == 4:
        reason = vendored_flash_attn.fa_version_unsupported_reason(4)
        if reason:
            pytest.skip(f"FA4 not usable: {reason}")
    if dtype == "e4m3" and not fa3_has_fp8():
        pytest.skip("this wheel has no FA3 e4m3 kernels")


class DecodeBuffers:
    """vLLM's persistent inputs of a captured decode step (module docstring)."""

    def __init__(self, version: int, dtype: str, problems, head_dim: int):
        self.version, self.dtype = version, dtype
        blocks = max(p.k.shape[0] for p in problems)
        cols = max(p.block_table.shape[1] for p in problems)
        self.capacity = cols * PAGE  # capture-static max_seqlen_k
        kv_dtype = TORCH_DTYPES[dtype]
        # FP8 tensors made by conversion from float32 (no fill kernel is asked for float8)
        self.q = torch.zeros(BATCH, HEADS, head_dim, device="cuda").to(kv_dtype)
        self.k = torch.zeros(blocks, PAGE, KV_HEADS, head_dim, device="cuda").to(kv_dtype)
        self.v = torch.zeros(blocks, PAGE, KV_HEADS, head_dim, device="cuda").to(kv_dtype)
        # cache slots a problem does not use: large garbage, as after other requests
        self.k_garbage = torch.full(self.k.shape, 50.0, device="cuda").to(kv_dtype)
        self.v_garbage = torch.full(self.v.shape, -50.0, device="cuda").to(kv_dtype)
        self.cu = torch.zeros(BATCH + 1, dtype=torch.int32, device="cuda")
        self.used = torch.zeros(BATCH, dtype=torch.int32, device="cuda")
        self.table = torch.zeros(BATCH, cols, dtype=torch.int32, device="cuda")
        self.out = torch.zeros(BATCH, HEADS, head_dim, dtype=problems[0].out_dtype, device="cuda")
        self.descales = tuple(torch.ones(BATCH, KV_HEADS, device="cuda") for _ in range(3))
        self.metadata = torch.zeros(4 * math.ceil(BATCH / 4) * 4 + 1, dtype=torch.int32, device="cuda")
        self.metadata_size = None
        self.splits = GRAPH_NUM_SPLITS if version == 3 and has_feature("split") else 0

    def load(self, p) -> None:
        """Write problem ``p`` into the buffers in place (and FA3's metadata for it)."""
        self.q.copy_(p.q)
        self.k.copy_(self.k_garbage)
        self.v.copy_(self.v_garbage)
        self.k[:p.k.shape[0]].copy_(p.k)
        self.v[:p.v.shape[0]].copy_(p.v)
        self.cu.copy_(p.cu_seqlens_q)
        self.used.copy_(p.seqused_k)
        self.table.zero_()
        self.table[:, :p.block_table.shape[1]].copy_(p.block_table)
        if p.descales is not None:
            for buffer, value in zip(self.descales, p.descales):
                buffer.copy_(value)
        if self.version == 3:
            from vendored_flash_attn import get_scheduler_metadata

            fresh = get_scheduler_metadata(
                BATCH, 1, self.capacity, HEADS, KV_HEADS, self.q.shape[-1], self.used,
                qkv_dtype=self.q.dtype, cu_seqlens_q=self.cu, page_size=PAGE, causal=True,
                num_splits=self.splits)
            n = fresh.numel()
            assert self.metadata_size in (None, n) and n <= self.metadata.numel(), (n, self.metadata.numel())
            self.metadata_size = n
            self.metadata[:n].copy_(fresh)
            self.metadata[n:].zero_()

    def call(self):
        from vendored_flash_attn import flash_attn_varlen_func

        fp8 = self.dtype == "e4m3"
        return flash_attn_varlen_func(
            self.q, self.k, self.v, max_seqlen_q=1, cu_seqlens_q=self.cu, max_seqlen_k=self.capacity,
            seqused_k=self.used, block_table=self.table, causal=True, out=self.out,
            scheduler_metadata=self.metadata[:self.metadata_size] if self.version == 3 else None,
            q_descale=self.descales[0] if fp8 else None, k_descale=self.descales[1] if fp8 else None,
            v_descale=self.descales[2] if fp8 else None, num_splits=self.splits, fa_version=self.version)


CASES = [pytest.param(2, "bf16", id="fa2-bf16"), pytest.param(3, "bf16", id="fa3-bf16"),
         pytest.param(3, "e4m3", id="fa3-e4m3"), pytest.param(4, "bf16", id="fa4-bf16")]


@pytest.mark.parametrize("version, dtype", CASES)
def test_paged_decode_replays_new_inputs_written_in_place(version, dtype, rng):
    _needs(version, dtype)
    head_dim = primary_head_dim(3 if version == 3 else 2) if version != 4 else 128
    problems = [make_problem(rng, dtype=dtype, num_heads=HEADS, num_heads_k=KV_HEADS, head_dim=head_dim,
                             q_lens=[1] * BATCH, k_lens=decode_lengths(rng, batch=BATCH)[1], page_size=PAGE)
                for _ in range(2)]
    first, second = problems
    buffers = DecodeBuffers(version, dtype, problems, head_dim)

    buffers.load(first)
    buffers.call()  # warm-up, as vLLM runs each capture size once before capturing it (FA4: its load)
    torch.cuda.synchronize()
    buffers.out.fill_(float("nan"))
    with no_host_sync():
        buffers.call()  # eager
    torch.cuda.synchronize()
    eager_first = buffers.out.clone()
    graph = torch.cuda.CUDAGraph()
    buffers.out.fill_(float("nan"))
    with torch.cuda.graph(graph):
        with no_host_sync():
            buffers.call()
    graph.replay()
    torch.cuda.synchronize()
    assert relative_l2(buffers.out, eager_first) <= 1e-3, "the replay differs from the eager call it captured"

    # The next step: everything rewritten in place, the same graph replayed.
    buffers.load(second)
    buffers.out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    replayed = buffers.out.clone()
    assert torch.isfinite(replayed).all(), "the replay left output rows unwritten"
    assert relative_l2(replayed, eager_first) > 0.05, "the replay did not read the new inputs"
    with no_host_sync():
        buffers.call()
    torch.cuda.synchronize()
    assert relative_l2(replayed, buffers.out) <= 1e-3, "graph and eager call disagree on the same inputs"
    ref_out, _ = reference(second, causal=True)
    check(second, replayed, None, ref_out, None, label=f"FA{version} {dtype} graph replay, decode page {PAGE}")


@pytest.fixture
def call_once_captured():
    """Capture one call of FA2's paged decode (the first family every wheel holds) and return
    what the capture raised; the CUDA context must stay usable afterwards."""
    def run(buffers):
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                buffers.call()
        except Exception as exc:  # noqa: BLE001 - returned for the test to judge
            return exc
        return None

    return run


def _fa2_buffers(rng):
    from gpu_helpers import require

    require(2)
    head_dim = primary_head_dim(2)
    p = make_problem(rng, dtype="bf16", num_heads=HEADS, num_heads_k=KV_HEADS, head_dim=head_dim,
                     q_lens=[1] * BATCH, k_lens=decode_lengths(rng, batch=BATCH)[1], page_size=PAGE)
    buffers = DecodeBuffers(2, "bf16", [p], head_dim)
    buffers.load(p)
    return p, buffers


def test_debug_checks_are_refused_under_capture(rng, monkeypatch, real_machine, call_once_captured):
    """VFA_DEBUG_CHECKS=1 reads index values on the host: refused under capture, clearly,
    before anything is enqueued; the same call runs (checked) eagerly afterwards."""
    from vendored_flash_attn import FlashAttnCaptureError
    from vendored_flash_attn.selection.environment import set_environment

    p, buffers = _fa2_buffers(rng)
    monkeypatch.setenv("VFA_DEBUG_CHECKS", "1")
    set_environment(None)
    raised = call_once_captured(buffers)
    assert isinstance(raised, FlashAttnCaptureError), repr(raised)
    assert "VFA_DEBUG_CHECKS" in str(raised)
    torch.cuda.synchronize()
    buffers.call()
    torch.cuda.synchronize()
    ref_out, _ = reference(p, causal=True)
    assert relative_l2(buffers.out, ref_out) <= OUT_TOL["bf16"]


def test_a_family_declared_not_capturable_is_refused_under_capture(rng, real_machine, call_once_captured):
    from vendored_flash_attn import FlashAttnCaptureError
    from vendored_flash_attn.declaration import knob_values as declaration, families
    from vendored_flash_attn.selection.environment import set_environment

    p, buffers = _fa2_buffers(rng)
    data = copy.deepcopy(declaration.load())
    data["families"]["fa2"].setdefault("call", {}).update(cuda_graphs=False, cuda_graphs_why="declared so by a test")
    previous = families.set_registry(families.parse(data))
    set_environment(None)
    try:
        raised = call_once_captured(buffers)
        assert isinstance(raised, FlashAttnCaptureError), repr(raised)
        assert "FA2 cannot be captured in a CUDA graph: declared so by a test" in str(raised)
        torch.cuda.synchronize()
        buffers.call()  # eagerly it runs
        torch.cuda.synchronize()
    finally:
        families.set_registry(previous)
        set_environment(None)
    ref_out, _ = reference(p, causal=True)
    assert relative_l2(buffers.out, ref_out) <= OUT_TOL["bf16"]
