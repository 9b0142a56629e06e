#!/usr/bin/env python3
"""Serving benchmark: the attention of vLLM's seed workload, replayed call by call.

The workload the project exists for (issue 27): Llama-3.1-8B-Instruct (32 query / 8 KV heads,
head dim 128, 32 layers), 1000 requests of 2048 prompt and 128 output tokens, vLLM's V1 engine
with ``--max-num-batched-tokens 16384``; vLLM measured FA2 12.81 req/s and FA3 14.24 req/s
there (+11 %). This script replays the attention calls such a run makes, through this
package's ``flash_attn_varlen_func``, for every family the installed wheel holds, and times them.

The model (stated, each part a choice that can be argued with):

* Steps: vLLM V1's scheduler over a KV cache sized as vLLM sizes it on this GPU
  (benchmarks/serving_schedule.py: chunked prefill under the 16384-token budget, running
  requests first, admission while blocks are free, preemption of the newest request when a
  decode cannot get a block, all 1000 requests at once). KV capacity: gpu_memory_utilization
  0.9 of the GPU's memory, less the bf16 weights (16.06 GB) and 4 GiB for the profiled peak;
  an FP8 cache holds twice the tokens, so FP8 runs its own schedule (fewer, larger steps).
* Calls: one ``flash_attn_varlen_func`` per layer and step, as vLLM's FlashAttention backend
  makes it (vllm/v1/attention/backends/flash_attn.py): all requests of the step in one varlen
  call (prefill chunks and decodes together), paged KV (``block_table`` + ``seqused_k``),
  ``causal=True``, ``out=``, softmax scale 1/sqrt(128), ``window_size=(-1, -1)``,
  ``softcap=0``, descales passed on every call as per-tensor scales (1.0, vLLM's default
  without checkpoint scales) expanded to ``(num_seqs, num_kv_heads)`` with stride 0,
  ``num_splits=0``. FA3 gets scheduler metadata computed once per step with
  ``get_scheduler_metadata`` (vLLM's AOT schedule: batch size, max query/KV length of the
  step, page size, causal, ``cu_seqlens_q``). FP8 KV (``--kv-cache-dtype fp8``): q, k, v in
  float8_e4m3fn (vLLM quantizes q per layer: its cost, read bf16 + write e4m3 at the measured
  copy bandwidth, enters the end-to-end model, not the attention time), bf16 out.
* Paged KV: block size 16 (vLLM's default) and the kernels' tile (FA3's kBlockN for head dim
  128, causal paged: 128; FA4's sm90 tile_n, read from its interface, must agree) as a second
  case, each with its own schedule.
* Families (rows): FA2 (``fa_version=2``), FA3 bf16 (3), FA3 FP8 KV on its own schedule,
  FA3 FP8 KV on the bf16 schedule (same steps as FA3 bf16: the kernels compared like for
  like), FA4 bf16 (4). FA4's FP8 KV path is declared for head dim 512 only at the pin
  (cmake/knobs.json, families.fa4.call.fp8_kv_head_dims): no FA4 FP8 row.
* Decode steps (every request one token) also run captured in CUDA graphs, as vLLM's
  FULL_AND_PIECEWISE mode does for uniform decode batches up to its largest capture size
  (512; sizes 1, 2, 4, 8, 16, ... 512): persistent buffers (q, out, ``cu_seqlens_q``,
  ``seqused_k``, a block table as wide as ``max_model_len`` needs, FA3's scheduler metadata)
  written in place each step, the batch padded to the capture size with one-token requests
  whose one KV token is in the null block 0 (vLLM pads with empty requests; a non-empty one
  asks no family about a case it might treat apart), graphs captured largest first into one
  memory pool, calls captured with ``max_seqlen_k = max_model_len`` (capture-static, as vLLM's
  runner captures). FA3 in a graph: ``num_splits=16`` (vLLM's bound for graphs), its metadata
  recomputed each step for the padded batch (``num_splits=16``) and copied into the head of a
  persistent buffer, the rest zeroed, the call given the view (vLLM's builder). Prefill
  steps run eagerly (vLLM runs mixed batches piecewise: attention outside the graphs), so
  do decode steps of more than 512 requests.
* Replayed layers: ``--layers`` (default 4) calls per step on the same KV pool, scaled to 32
  layers (the pool of one layer is far larger than L2: no layer reads another's data hot).
* Timing: per step, a spin kernel first holds the GPU so the host enqueues the whole step
  ahead (CUDA events then time the GPU's work, not the host's); the host's enqueue time is
  recorded apart. FA3's scheduler metadata (once per step, not per layer) is in the step's
  time. The median of ``--reps`` repeats. The first call of each row is timed apart.
* Errors: on sampled steps (two prefill, two decode), output rows of a few sequences against a
  float64 reference computed from the same cache (FP8: against the bf16 values before
  quantization, the error a user sees, and against the dequantized values, the kernel's own).
  Value vectors have mean 0.5 (zero-mean values hide FP8's accumulation error).
* End to end: step time = attention (graphed decode where vLLM graphs it) + the rest, where
  the rest is alpha + max(weight bytes / copy bandwidth, linear-layer FLOPs / bf16 matmul
  rate), the bandwidth and rate measured in the same run; alpha (per step: sampling, host
  work, norms, launches) is fitted so that FA2 at block size 16 gives the seed's 12.81 req/s.
  The model then predicts every other row; FA3's prediction stands next to the seed's 14.24.

Run: ``python benchmarks/serving.py --out DIR`` (about 2-4 minutes on an H200; ``--quick``:
200 requests, one layer, one repeat, under a minute); ``--dry-run`` prints the schedules and
the plan without a GPU. Writes DIR/serving.json and prints the tables.
"""

from __future__ import annotations

# One file over 500 lines, on purpose: one experiment (its plan, calls, timing, analysis, tables
# and record) whose parts all work on the rows and records defined here (Variant, Row,
# PhaseTime); the schedule, which tests and dist_model use alone, is serving_schedule.py, and
# what every benchmark shares is common.py.

# Why this file names families: its rows (VARIANTS) are families measured by name, and its
# recorded figures (measured.json) are keyed by them; what a row's calls do differently
# (scheduler metadata, a CuTe DSL family's load) is read from the family's declaration.

import argparse
import math
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import serving_schedule as sched  # noqa: E402
from common import LLAMA_8B  # noqa: E402

SEED = {"fa2_req_s": 12.81, "fa3_req_s": 14.24, "source": "vLLM's V1 measurement quoted in issue 27"}
GRAPH_NUM_SPLITS = 16            # vLLM's max_num_splits for FA3 under full CUDA graphs
KV_SCALE = 1.0                   # vLLM's q/k/v scale without checkpoint scales
V_MEAN = 0.5
LINEAR_PARAMS = sched.LAYERS * (4096 * (4096 + 1024 + 1024) + 4096 * 4096 + 3 * 4096 * 14336)
LM_HEAD_PARAMS = 4096 * 128256


@dataclass(frozen=True)
class Variant:
    name: str
    label: str
    version: int
    kv: str                      # "bf16" or "fp8": the cache (and q) dtype of the calls
    schedule_kv: str             # the KV cache the schedule was made for

    # A row is a family by its version (the rows and the figures recorded from them are per
    # family by design); what a row's calls do differently is read from the family's declaration.
    @property
    def family(self):
        from vendored_flash_attn.declaration.families import registry

        return registry()[self.version]

    @property
    def scheduler_metadata(self) -> bool:
        """Its calls pass scheduler metadata, as vLLM's do for the family that declares it (FA3)."""
        return "scheduler_metadata" in self.family.features

    @property
    def compiles_at_first_use(self) -> bool:
        """Its kernels are upstream's CuTe DSL Python (FA4): loaded (and their cache set up)
        before anything is timed."""
        from vendored_flash_attn.declaration.families import CUTE_DSL

        return self.family.made == CUTE_DSL


VARIANTS = (
    Variant("fa2", "FA2", 2, "bf16", "bf16"),
    Variant("fa3", "FA3 bf16", 3, "bf16", "bf16"),
    Variant("fa3_fp8", "FA3 FP8 KV", 3, "fp8", "fp8"),
    Variant("fa3_fp8_same", "FA3 FP8 KV, bf16 steps", 3, "fp8", "bf16"),
    Variant("fa4", "FA4 bf16", 4, "bf16", "bf16"),
)
BY_NAME = {v.name: v for v in VARIANTS}
PAGES = ("16", "tile")
PHASES = ("prefill", "decode_eager", "decode_graph")


# --------------------------------------------------------------------------------------
# The plan (no torch)


def _importable_package() -> None:
    """--dry-run and --record from a checkout without the package installed: its sources
    (appended: an installed package comes first)."""
    try:
        import vendored_flash_attn  # noqa: F401
    except ImportError:
        sys.path.append(str(common.ROOT / "python"))


def tile_page_size(fa4_interface=None) -> tuple[int, str]:
    """The kernels' tile as a page size: FA3's kBlockN for head dim 128 causal paged calls
    (its tile rule, vendored_flash_attn.call.scheduler_metadata.tile_size_sm90), checked against
    FA4's sm90 tile_n where its interface is given."""
    _importable_package()
    from vendored_flash_attn.call.scheduler_metadata import tile_size_sm90

    _, n = tile_size_sm90(128, 128, True, False, False, False, False, False, True)
    note = f"FA3's kBlockN for head dim 128 causal paged: {n}"
    if fa4_interface is not None:
        fa4_n = fa4_interface._tile_size_fwd_sm90(128, 128, True, False).n_block_size
        note += f"; FA4's sm90 tile_n {fa4_n}" + ("" if fa4_n == n else " (differs: FA4 runs this case with cp.async)")
    return n, note


@dataclass
class Plan:
    schedules: dict              # (kv, page label) -> Schedule
    page_sizes: dict             # page label -> block size
    settings: dict


def make_plan(args, gpu_bytes: int, tile: int) -> Plan:
    page_sizes = {"16": 16, "tile": tile}
    schedules = {}
    for page in args.pages:
        for kv, elem in (("bf16", 2), ("fp8", 1)):
            if not any(BY_NAME[v].schedule_kv == kv for v in args.variants):
                continue
            size = page_sizes[page]
            if args.kv_tokens:
                blocks = args.kv_tokens * (2 // elem) // size + 1
            else:
                blocks = sched.kv_cache_blocks(gpu_bytes, elem, size, reserved_bytes=int(args.reserved_gib * 2**30))
            workload = sched.Workload(num_requests=args.num_requests, prompt=args.prompt, output=args.output,
                                      block_size=size, num_blocks=blocks,
                                      max_num_seqs=args.max_num_seqs,
                                      max_num_batched_tokens=args.max_num_batched_tokens)
            schedules[(kv, page)] = sched.simulate(workload)
    settings = {"gpu_bytes": gpu_bytes, "page_sizes": page_sizes}
    return Plan(schedules, page_sizes, settings)


def sampled_steps(schedule: sched.Schedule) -> list[int]:
    """Two prefill steps (the first full one, and the one with the most context behind its
    chunks) and two decode steps (the largest batch, and one near the end)."""
    prefill = [s for s in schedule.steps if s.kind == "prefill"]
    decode = [s for s in schedule.steps if s.kind == "decode"]
    chosen = []
    if prefill:
        chosen.append(prefill[0].index)
        chosen.append(max(prefill, key=lambda s: sum(e.seq_len - e.query_len for e in s.entries)).index)
    if decode:
        chosen.append(max(decode, key=lambda s: s.num_reqs).index)
        chosen.append(decode[-max(1, len(decode) // 10)].index)
    return sorted(set(chosen))


def error_rows(step: sched.Step, limit: int = 3) -> list[int]:
    """Indices (into step.entries) of the sequences whose output is compared: the longest
    query, the longest context, and one decode (query length 1) when there is one."""
    entries = step.entries
    picks = [max(range(len(entries)), key=lambda i: entries[i].query_len),
             max(range(len(entries)), key=lambda i: entries[i].seq_len)]
    ones = [i for i, e in enumerate(entries) if e.query_len == 1]
    if ones:
        picks.append(ones[len(ones) // 2])
    out = []
    for i in picks:
        if i not in out:
            out.append(i)
    return out[:limit]


# --------------------------------------------------------------------------------------
# Call inputs (torch; any device, so the CPU tests build them too)


def step_arrays(schedule: sched.Schedule, step: sched.Step, pad_to: Optional[int] = None):
    """(cu_seqlens_q, seqused_k, block_table) of a step as numpy int32 arrays; ``pad_to``:
    pad the batch to a capture size with one-token requests whose KV is one token of the null
    block 0 (the graph's inputs)."""
    import numpy as np

    entries = step.entries
    batch = len(entries) if pad_to is None else pad_to
    query = np.ones(batch, dtype=np.int32)
    used = np.ones(batch, dtype=np.int32)
    tables = [schedule.block_ids(e) for e in entries]
    width = max(len(t) for t in tables)
    table = np.zeros((batch, width), dtype=np.int32)
    for i, (e, ids) in enumerate(zip(entries, tables)):
        query[i] = e.query_len
        used[i] = e.seq_len
        table[i, :len(ids)] = ids
    cu = np.zeros(batch + 1, dtype=np.int32)
    np.cumsum(query, out=cu[1:])
    return cu, used, table


@dataclass
class Pools:
    """The KV cache of one layer (bf16, and its FP8 quantization) and a q buffer."""

    k: object
    v: object
    k8: object
    v8: object
    q: object
    q8: object
    out: object
    scales: object               # (q, k, v) per-tensor scales, 0-d float32

    def kv(self, kv: str, block_size: int):
        k, v = (self.k8, self.v8) if kv == "fp8" else (self.k, self.v)
        blocks = k.shape[0] * k.shape[1] // block_size
        shape = (blocks, block_size) + tuple(k.shape[2:])
        return k.view(shape), v.view(shape)


def make_pools(num_blocks16: int, max_tokens: int, device, seed: int = 0, model=LLAMA_8B,
               page_sizes=(16, 128)) -> Pools:
    """K ~ N(0, 1), V ~ N(0.5, 1) (non-zero mean), q ~ N(0, 1), in bf16; FP8 copies quantized
    with scale 1.0, as vLLM writes its cache without checkpoint scales."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    hk, d, h = model.heads_kv, model.head_dim, model.heads_q
    multiple = math.lcm(*(size // 16 for size in page_sizes))  # the pool views as pages of each size
    num_blocks16 = math.ceil(num_blocks16 / multiple) * multiple
    shape = (num_blocks16, 16, hk, d)
    k = torch.empty(shape, dtype=torch.bfloat16, device=device)
    v = torch.empty(shape, dtype=torch.bfloat16, device=device)
    k8 = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
    v8 = torch.empty(shape, dtype=torch.float8_e4m3fn, device=device)
    chunk = 4096
    for s in range(0, num_blocks16, chunk):
        n = min(chunk, num_blocks16 - s)
        k[s:s + n] = torch.randn((n,) + shape[1:], generator=g, device=device, dtype=torch.float32)
        v[s:s + n] = torch.randn((n,) + shape[1:], generator=g, device=device, dtype=torch.float32) + V_MEAN
        k8[s:s + n] = (k[s:s + n].float() / KV_SCALE).to(torch.float8_e4m3fn)
        v8[s:s + n] = (v[s:s + n].float() / KV_SCALE).to(torch.float8_e4m3fn)
    q = torch.randn(max_tokens, h, d, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)
    q8 = (q.float() / KV_SCALE).to(torch.float8_e4m3fn)
    out = torch.empty(max_tokens, h, d, dtype=torch.bfloat16, device=device)
    scales = torch.full((), KV_SCALE, dtype=torch.float32, device=device)
    return Pools(k, v, k8, v8, q, q8, out, scales)


def eager_call(variant: Variant, schedule: sched.Schedule, step: sched.Step, pools: Pools, device):
    """(kwargs of flash_attn_varlen_func for this step, a function computing FA3's scheduler
    metadata into them, or None). The index tensors are copied to the device here, outside
    any timed region."""
    import torch

    from vendored_flash_attn import get_scheduler_metadata

    cu, used, table = step_arrays(schedule, step)
    batch = len(used)
    size = schedule.workload.block_size
    k, v = pools.kv(variant.kv, size)
    q = (pools.q8 if variant.kv == "fp8" else pools.q)[:step.num_tokens]
    cu_t = torch.from_numpy(cu).to(device)
    used_t = torch.from_numpy(used).to(device)
    table_t = torch.from_numpy(table).to(device)
    expand = (batch, LLAMA_8B.heads_kv)
    kwargs = dict(q=q, k=k, v=v, out=pools.out[:step.num_tokens], cu_seqlens_q=cu_t,
                  max_seqlen_q=step.max_query_len, seqused_k=used_t, max_seqlen_k=step.max_seq_len,
                  softmax_scale=LLAMA_8B.head_dim ** -0.5, causal=True, alibi_slopes=None,
                  window_size=(-1, -1), block_table=table_t, softcap=0, scheduler_metadata=None,
                  fa_version=variant.version, q_descale=pools.scales.expand(expand),
                  k_descale=pools.scales.expand(expand), v_descale=pools.scales.expand(expand),
                  num_splits=0, s_aux=None)
    metadata = None
    if variant.scheduler_metadata:
        def metadata():
            kwargs["scheduler_metadata"] = get_scheduler_metadata(
                batch_size=batch, max_seqlen_q=step.max_query_len, max_seqlen_k=step.max_seq_len,
                num_heads_q=LLAMA_8B.heads_q, num_heads_kv=LLAMA_8B.heads_kv, headdim=LLAMA_8B.head_dim,
                cache_seqlens=used_t, qkv_dtype=q.dtype, cu_seqlens_q=cu_t, page_size=size, causal=True,
                window_size=(-1, -1), num_splits=0)
    return kwargs, metadata


class GraphBuffers:
    """vLLM's persistent inputs of a full CUDA graph, for capture sizes up to ``max_size``."""

    def __init__(self, variant: Variant, schedule: sched.Schedule, pools: Pools, max_size: int,
                 max_model_len: int, device):
        import torch

        self.variant, self.schedule, self.device = variant, schedule, device
        self.block_size = schedule.workload.block_size
        self.max_model_len = max_model_len
        self.k, self.v = pools.kv(variant.kv, self.block_size)
        source = pools.q8 if variant.kv == "fp8" else pools.q
        self.q = source[:max_size].clone()
        self.out = torch.zeros(max_size, LLAMA_8B.heads_q, LLAMA_8B.head_dim, dtype=torch.bfloat16, device=device)
        self.cu = torch.zeros(max_size + 1, dtype=torch.int32, device=device)
        self.used = torch.zeros(max_size, dtype=torch.int32, device=device)
        self.table = torch.zeros(max_size, math.ceil(max_model_len / self.block_size), dtype=torch.int32,
                                 device=device)
        self.scales = pools.scales
        # FA3's metadata at the pin: up to 3 vectors of round_up(batch, 4) ints and a semaphore.
        self.metadata = torch.zeros(4 * (math.ceil(max_size / 4) * 4) + 1, dtype=torch.int32, device=device)
        self.metadata_size: dict[int, int] = {}

    def write(self, step: sched.Step, size: int) -> int:
        """Write a decode step padded to ``size`` into the buffers (in place); the number of
        block-table columns written."""
        import torch

        cu, used, table = step_arrays(self.schedule, step, pad_to=size)
        self.cu[:size + 1].copy_(torch.from_numpy(cu))
        self.used[:size].copy_(torch.from_numpy(used))
        self.table[:size, :table.shape[1]].copy_(torch.from_numpy(table))
        return table.shape[1]

    def refresh_metadata(self, size: int) -> None:
        """FA3: this step's scheduler metadata into the persistent buffer's head, rest zeroed."""
        from vendored_flash_attn import get_scheduler_metadata

        fresh = get_scheduler_metadata(
            batch_size=size, max_seqlen_q=1, max_seqlen_k=self.max_model_len, num_heads_q=LLAMA_8B.heads_q,
            num_heads_kv=LLAMA_8B.heads_kv, headdim=LLAMA_8B.head_dim, cache_seqlens=self.used[:size],
            qkv_dtype=self.q.dtype, cu_seqlens_q=self.cu[:size + 1], page_size=self.block_size, causal=True,
            window_size=(-1, -1), num_splits=GRAPH_NUM_SPLITS)
        n = fresh.numel()
        if n > self.metadata.numel():
            raise RuntimeError(f"FA3's scheduler metadata for batch {size} has {n} entries, the persistent "
                               f"buffer {self.metadata.numel()}")
        self.metadata[:n].copy_(fresh)
        self.metadata[n:].zero_()
        self.metadata_size[size] = n

    def call(self, size: int) -> dict:
        """The kwargs of the captured call for capture size ``size`` (views of the buffers)."""
        expand = (size, LLAMA_8B.heads_kv)
        with_metadata = self.variant.scheduler_metadata  # FA3's graph calls: metadata, vLLM's max_num_splits
        return dict(q=self.q[:size], k=self.k, v=self.v, out=self.out[:size], cu_seqlens_q=self.cu[:size + 1],
                    max_seqlen_q=1, seqused_k=self.used[:size], max_seqlen_k=self.max_model_len,
                    softmax_scale=LLAMA_8B.head_dim ** -0.5, causal=True, alibi_slopes=None,
                    window_size=(-1, -1), block_table=self.table[:size], softcap=0,
                    scheduler_metadata=self.metadata[:self.metadata_size[size]] if with_metadata else None,
                    fa_version=self.variant.version, q_descale=self.scales.expand(expand),
                    k_descale=self.scales.expand(expand), v_descale=self.scales.expand(expand),
                    num_splits=GRAPH_NUM_SPLITS if with_metadata else 0, s_aux=None)


def _gather(cache, ids):
    """cache[ids]; FP8 pages gathered as bytes (indexing kernels need not exist for float8)."""
    import torch

    if cache.element_size() == 1 and cache.dtype != torch.uint8:
        return cache.view(torch.uint8)[ids].view(cache.dtype)
    return cache[ids]


def reference_rows(schedule: sched.Schedule, step: sched.Step, index: int, q, k, v, q_rows: int = 256,
                   scale: float = 1.0):
    """float64 attention of entry ``index`` of ``step`` (its last ``q_rows`` query rows) from
    ``q`` (the step's queries, tokens x heads x dim) and the paged ``k``/``v`` (any dtype, FP8
    included: the rows used are gathered, then dequantized as value * ``scale``). Returns (row
    slice into the step's tokens, reference (rows, heads, dim))."""
    import torch

    entries = step.entries
    start = sum(e.query_len for e in entries[:index])
    e = entries[index]
    rows = min(q_rows, e.query_len)
    first = start + e.query_len - rows
    ids = torch.tensor(schedule.block_ids(e), dtype=torch.long, device=k.device)
    heads_kv, dim = k.shape[-2], k.shape[-1]
    keys = _gather(k, ids).reshape(-1, heads_kv, dim)[:e.seq_len].float().double() * scale
    values = _gather(v, ids).reshape(-1, heads_kv, dim)[:e.seq_len].float().double() * scale
    qs = q[first:start + e.query_len].float().double() * scale
    group = qs.shape[1] // heads_kv
    keys = keys.repeat_interleave(group, dim=1)
    values = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", qs, keys) * dim ** -0.5
    # causal, bottom-right: query row r (absolute position seq_len - rows + r) sees keys <= it
    pos = torch.arange(e.seq_len - rows, e.seq_len, device=k.device)
    mask = torch.arange(e.seq_len, device=k.device)[None, :] > pos[:, None]
    scores.masked_fill_(mask[None], float("-inf"))
    out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), values)
    return slice(first, start + e.query_len), out


# --------------------------------------------------------------------------------------
# Timing (GPU)


@dataclass
class PhaseTime:
    gpu_s: float = 0.0           # scaled to 32 layers
    host_s: float = 0.0          # host enqueue time, scaled to 32 layers
    steps: int = 0
    tokens: int = 0
    metadata_s: float = 0.0      # FA3's per-step metadata (in gpu_s, once per step)
    unheld: int = 0              # steps whose spin ended before the host had enqueued them

    def add(self, gpu_s: float, host_s: float, tokens: int, metadata_s: float = 0.0, held: bool = True):
        self.gpu_s += gpu_s
        self.host_s += host_s
        self.steps += 1
        self.tokens += tokens
        self.metadata_s += metadata_s
        self.unheld += 0 if held else 1


@dataclass
class Row:
    variant: str
    page: str
    block_size: int = 0
    status: str = "ok"
    note: str = ""
    phases: dict = field(default_factory=lambda: {p: PhaseTime() for p in PHASES})
    decode_ungraphed_steps: int = 0
    decode_ungraphed_s: float = 0.0  # eager time of decode steps too large for a graph
    first_call_s: Optional[float] = None
    errors: list = field(default_factory=list)
    capture_s: float = 0.0
    captures: int = 0
    graphs: bool = False         # decode steps were replayed in CUDA graphs


DEVICE = "cuda"
SM_CLOCK_HZ = 1.98e9             # the H200's boost clock: spin cycles per second


class Spin:
    """How long the spin kernel before each timed enqueue holds the GPU: 1.5x the longest
    host enqueue seen so far (0.2 to 5 ms), so the GPU starts the step only after the host
    has enqueued all of it."""

    def __init__(self):
        self.seconds = 1e-3

    def saw(self, host_s: float) -> None:
        self.seconds = min(5e-3, max(self.seconds, 2e-4, 1.5 * host_s))


def _timed(enqueue, reps: int, spin: Optional[Spin] = None):
    """(median GPU seconds, median host seconds, all spins held) of ``enqueue()`` repeated."""
    import torch

    gpu, host, held_all = [], [], True
    for _ in range(reps):
        if spin is not None:
            torch.cuda._sleep(int(spin.seconds * SM_CLOCK_HZ))
        spun = torch.cuda.Event()
        spun.record()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        enqueue()
        t1 = time.perf_counter()
        end.record()
        held_all &= spin is None or not spun.query()
        end.synchronize()
        gpu.append(start.elapsed_time(end) * 1e-3)
        host.append(t1 - t0)
        if spin is not None:
            spin.saw(t1 - t0)
    return statistics.median(gpu), statistics.median(host), held_all


def run_row(variant: Variant, page: str, plan: Plan, pools: Pools, args, capture_sizes: list[int],
            watch: common.Stopwatch) -> Row:
    import torch

    from vendored_flash_attn import flash_attn_varlen_func

    schedule = plan.schedules[(variant.schedule_kv, page)]
    row = Row(variant.name, page, block_size=schedule.workload.block_size)
    scale = sched.LAYERS / args.layers
    device = pools.k.device
    sampled = set(sampled_steps(schedule))
    graphs = row.graphs = not args.no_graphs
    decode_graphable = []
    spin = Spin()
    for step in schedule.steps:
        if watch.over():
            row.status, row.note = "partial", f"time budget ({args.budget_s:.0f} s) spent at step {step.index}"
            break
        kwargs, metadata = eager_call(variant, schedule, step, pools, device)

        def enqueue():
            if metadata is not None:
                metadata()
            for _ in range(args.layers):
                flash_attn_varlen_func(**kwargs)

        if row.first_call_s is None:
            row.first_call_s = common.time_first_call(enqueue)
        meta_s = 0.0
        if metadata is not None:
            meta_s, _, _ = _timed(metadata, 1, spin)
        gpu_s, host_s, held = _timed(enqueue, args.reps, spin)
        phase = "prefill" if step.kind == "prefill" else "decode_eager"
        # metadata once per step, the layers scaled to 32
        step_s = meta_s + max(0.0, gpu_s - meta_s) * scale
        row.phases[phase].add(step_s, host_s * scale, step.num_tokens, meta_s, held)
        if step.index in sampled:
            row.errors += step_errors(variant, schedule, step, pools, kwargs["out"], "eager")
        if step.kind == "decode":
            size = sched.padded_size(step.num_reqs, capture_sizes)
            if graphs and size is not None:
                decode_graphable.append((step, size))
            else:
                row.decode_ungraphed_steps += 1
                row.decode_ungraphed_s += step_s
    if graphs and decode_graphable and row.status == "ok":
        run_graphs(variant, schedule, pools, args, decode_graphable, row, sampled, scale, spin)
    return row


def run_graphs(variant, schedule, pools, args, decode_steps, row: Row, sampled: set, scale: float,
               spin: Spin) -> None:
    import torch

    from vendored_flash_attn import flash_attn_varlen_func

    device = pools.k.device
    sizes = sorted({size for _, size in decode_steps}, reverse=True)
    buffers = GraphBuffers(variant, schedule, pools, sizes[0], args.max_model_len, device)
    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    t0 = time.perf_counter()
    # Capture inputs: the first decode step of each size, padded (any valid values do).
    first_of = {}
    for step, size in decode_steps:
        first_of.setdefault(size, step)
    for size in sizes:
        buffers.write(first_of[size], size)
        if variant.scheduler_metadata:
            buffers.refresh_metadata(size)
        call = buffers.call(size)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            flash_attn_varlen_func(**call)  # warm-up, as vLLM runs each size once before capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            for _ in range(args.layers):
                flash_attn_varlen_func(**call)
        graphs[size] = graph
    torch.cuda.synchronize()
    row.capture_s = time.perf_counter() - t0
    row.captures = len(graphs)
    for step, size in decode_steps:
        buffers.write(step, size)
        meta_s = 0.0
        if variant.scheduler_metadata:
            meta_s, _, _ = _timed(lambda: buffers.refresh_metadata(size), 1, spin)
        gpu_s, host_s, held = _timed(graphs[size].replay, args.reps, spin)
        row.phases["decode_graph"].add(meta_s + gpu_s * scale, host_s * scale, step.num_tokens, meta_s, held)
        if step.index in sampled:
            row.errors += step_errors(variant, schedule, step, pools, buffers.out, "graph",
                                      q=buffers.q[:step.num_reqs])
    del graphs
    torch.cuda.synchronize()


def step_errors(variant, schedule, step, pools: Pools, out, mode: str, q=None) -> list[dict]:
    """Relative L2 error of sampled rows against float64 references (module docstring)."""
    import torch

    torch.cuda.synchronize()
    size = schedule.workload.block_size
    results = []
    fp8 = variant.kv == "fp8"
    tokens = step.num_tokens
    q_used = (pools.q8 if fp8 else pools.q)[:tokens] if q is None else q
    q_plain = pools.q[:tokens]  # the graph's q buffer holds the pool's first rows too
    k, v = pools.kv(variant.kv, size)
    for index in error_rows(step):
        rows, ref = reference_rows(schedule, step, index, q_used, k, v, scale=KV_SCALE if fp8 else 1.0)
        got = out[rows].double()
        entry = {"step": step.index, "kind": step.kind, "mode": mode, "query_len": step.entries[index].query_len,
                 "seq_len": step.entries[index].seq_len, "rel_l2": common.relative_l2(got, ref)}
        if fp8:
            kb, vb = pools.kv("bf16", size)
            _, ref_bf16 = reference_rows(schedule, step, index, q_plain, kb, vb)
            entry["rel_l2_vs_bf16_values"] = common.relative_l2(got, ref_bf16)
        results.append(entry)
    return results


# --------------------------------------------------------------------------------------
# Results (no torch): totals, ratios, the end-to-end model


def totals(row: dict) -> dict:
    """Attention seconds of the whole run: eager (every step eager) and graphed (decode steps
    in graphs where vLLM graphs them, the rest eager), tokens per second of attention."""
    p = row["phases"]
    prefill, eager, graph = p["prefill"]["gpu_s"], p["decode_eager"]["gpu_s"], p["decode_graph"]["gpu_s"]
    # decode steps too large for a graph stay eager (their eager time)
    graph_total = graph + row.get("decode_ungraphed_s", 0.0) if row.get("graphs") else None
    tokens = p["prefill"]["tokens"] + p["decode_eager"]["tokens"]
    out = {"eager_s": prefill + eager, "graphed_s": None if graph_total is None else prefill + graph_total,
           "decode_graphed_s": graph_total, "tokens": tokens}
    out["tokens_per_s_eager"] = tokens / out["eager_s"] if out["eager_s"] else None
    out["tokens_per_s_graphed"] = tokens / out["graphed_s"] if out["graphed_s"] else None
    return out


def row_totals(row: dict) -> dict:
    """A row's totals as its run computed them, with decode_graphed_s derived from its phases
    where the JSON predates that figure."""
    t = dict(row.get("totals") or {})
    phases = row.get("phases")
    if "decode_graphed_s" not in t and phases:
        graph = phases["decode_graph"]["gpu_s"]
        t["decode_graphed_s"] = graph + row.get("decode_ungraphed_s", 0.0) if row.get("graphs") or graph else None
    return t


def phase_seconds(row: dict, phase: str) -> Optional[float]:
    """A phase's seconds as the tables compare them. decode_graph is the decode of a run with
    CUDA graphs: the graphed steps' replays plus the eager time of the steps too large for any
    capture size (vLLM runs those eagerly), so every row's figure covers all its decode steps."""
    if phase == "decode_graph":
        return row_totals(row).get("decode_graphed_s")
    return row["phases"][phase]["gpu_s"]


def _ratio(a, b):
    return a / b if a and b else None


def ratios(rows: list[dict]) -> None:
    """Fill each row's ``vs_fa2`` (FA2's time over the row's, same page: > 1 faster) per
    phase and in total, and the FP8 rows' ``vs_fa3_bf16``."""
    by = {(r["variant"], r["page"]): r for r in rows}
    for r in rows:
        for ref_name, key in (("fa2", "vs_fa2"), ("fa3", "vs_fa3_bf16")):
            ref = by.get((ref_name, r["page"]))
            if ref is None or ref is r or ref["status"] != "ok" or r["status"] != "ok":
                continue
            if key == "vs_fa3_bf16" and not r["variant"].startswith("fa3_fp8"):
                continue
            same_steps = BY_NAME[r["variant"]].schedule_kv == BY_NAME[ref_name].schedule_kv
            out = {}
            if same_steps:
                for phase in PHASES:
                    out[phase] = _ratio(phase_seconds(ref, phase), phase_seconds(r, phase))
            out["total_eager"] = _ratio(ref["totals"]["eager_s"], r["totals"]["eager_s"])
            out["total_graphed"] = _ratio(ref["totals"]["graphed_s"], r["totals"]["graphed_s"])
            r[key] = out


def end_to_end(rows: list[dict], schedules: dict, ceilings: dict, workload: dict, calibrate=("fa2", "16")) -> dict:
    """The end-to-end model of the module docstring. ``schedules``: (kv, page) -> per-step
    (num_tokens, sampled) lists; ``ceilings``: copy_gbs, bf16_matmul_tflops."""
    bw = ceilings["copy_gbs"] * 1e9
    rate = ceilings["bf16_matmul_tflops"] * 1e12
    weights = 2 * (LINEAR_PARAMS + LM_HEAD_PARAMS)

    def gemm(steps) -> float:
        return sum(max(weights / bw, (2 * LINEAR_PARAMS * t + 2 * LM_HEAD_PARAMS * s) / rate) for t, s in steps)

    def quant(steps) -> float:  # vLLM's q quantization per layer: read bf16, write e4m3
        return sum(sched.LAYERS * t * LLAMA_8B.heads_q * LLAMA_8B.head_dim * 3 / bw for t, _ in steps)

    result = {"model": "step = attention + alpha + max(weights / copy bandwidth, linear FLOPs / bf16 matmul rate); "
                       "alpha fitted so that FA2 at block size 16 gives the seed's FA2 req/s",
              "seed": SEED, "weights_bytes": weights, "copy_gbs": ceilings["copy_gbs"],
              "bf16_matmul_tflops": ceilings["bf16_matmul_tflops"], "rows": {}}
    ref = next((r for r in rows if (r["variant"], r["page"]) == calibrate and r["status"] == "ok"
                and r["totals"]["graphed_s"]), None)
    if ref is None:
        result["error"] = f"no {calibrate[0]} row at page {calibrate[1]} with graphed totals: nothing to calibrate on"
        return result
    steps = schedules[(BY_NAME[ref["variant"]].schedule_kv, ref["page"])]
    target = workload["num_requests"] / SEED["fa2_req_s"]
    alpha = (target - ref["totals"]["graphed_s"] - gemm(steps)) / len(steps)
    result.update(alpha_ms=alpha * 1e3, calibrated_on=f"{calibrate[0]} page {calibrate[1]}",
                  attention_share_fa2=ref["totals"]["graphed_s"] / target)
    if alpha < 0:
        result["warning"] = ("alpha < 0: attention and the GEMM bound alone exceed the seed's FA2 run time; "
                             "the model's rest is too large for this machine")
    base = None
    for r in rows:
        if r["status"] != "ok" or not r["totals"]["graphed_s"]:
            continue
        s = schedules[(BY_NAME[r["variant"]].schedule_kv, r["page"])]
        run_s = r["totals"]["graphed_s"] + len(s) * alpha + gemm(s)
        if BY_NAME[r["variant"]].kv == "fp8":
            run_s += quant(s)
        req_s = workload["num_requests"] / run_s
        result["rows"][f"{r['variant']}@{r['page']}"] = {"run_s": run_s, "req_s": req_s}
        if (r["variant"], r["page"]) == calibrate:
            base = req_s
    for entry in result["rows"].values():
        entry["vs_fa2"] = _ratio(entry["req_s"], base)
    fa3 = result["rows"].get(f"fa3@{calibrate[1]}")
    if fa3:
        result["fa3_over_fa2"] = fa3["vs_fa2"]
        result["seed_fa3_over_fa2"] = SEED["fa3_req_s"] / SEED["fa2_req_s"]
    return result


def winners(rows: list[dict]) -> dict:
    """Per page and phase, the fastest bf16-KV family (FP8 changes what is computed) and the
    fastest overall, with seconds: what the families declaration's not_default reasons quote."""
    out = {}
    for page in PAGES:
        page_rows = [r for r in rows if r["page"] == page and r["status"] == "ok"]
        if not page_rows:
            continue
        entry = {}
        for phase in PHASES + ("total_graphed",):
            def seconds(r, phase=phase):
                return r["totals"]["graphed_s"] if phase == "total_graphed" else phase_seconds(r, phase)
            candidates = [r for r in page_rows if BY_NAME[r["variant"]].kv == "bf16" and seconds(r)]
            if candidates:
                best = min(candidates, key=seconds)
                entry[phase] = {"bf16": best["variant"], "seconds": {r["variant"]: seconds(r) for r in candidates}}
        out[page] = entry
    return out


# --------------------------------------------------------------------------------------
# Output


def print_results(result: dict, plain: bool = False) -> None:
    rows = result["rows"]
    columns = ["row", "page", "prefill s", "decode eager s", "decode graph s", "total eager s", "total graphed s",
               "attn tok/s", "vs FA2 (graphed)", "vs FA3 bf16", "max err", "status"]
    table = []
    for r in rows:
        t = row_totals(r)
        p = r["phases"]
        errs = [e["rel_l2"] for e in r.get("errors", [])]
        fp8_errs = [e["rel_l2_vs_bf16_values"] for e in r.get("errors", []) if "rel_l2_vs_bf16_values" in e]
        err = common.fmt(max(errs) * 100, 2, " %") if errs else "-"
        if fp8_errs:
            err += f" ({max(fp8_errs) * 100:.2f} % vs bf16)"
        table.append([BY_NAME[r["variant"]].label, str(r["block_size"]),
                      common.fmt(p["prefill"]["gpu_s"], 3), common.fmt(p["decode_eager"]["gpu_s"], 3),
                      common.fmt(t.get("decode_graphed_s"), 3), common.fmt(t.get("eager_s"), 3),
                      common.fmt(t.get("graphed_s"), 3),
                      common.fmt((t.get("tokens_per_s_graphed") or t.get("tokens_per_s_eager") or 0) / 1e6, 2, " M"),
                      common.fmt((r.get("vs_fa2") or {}).get("total_graphed"), 3, "x"),
                      common.fmt((r.get("vs_fa3_bf16") or {}).get("total_graphed"), 3, "x"),
                      err, r["status"] + (f" ({r['note'][:50]})" if r.get("note") else "")])
    notes = [f"attention seconds of the whole run ({result['workload']['num_requests']} requests), GPU time, "
             f"{result['settings']['layers']} layers replayed per step and scaled to {sched.LAYERS}; "
             "vs: the reference row's time over this row's (> 1: faster)"]
    ungraphed = [f"{BY_NAME[r['variant']].label} at {r['block_size']}: {r['decode_ungraphed_steps']}"
                 for r in rows if r.get("decode_ungraphed_steps")]
    if ungraphed:
        notes.append("decode graph s: the decode of a run with CUDA graphs, decode steps larger than the largest "
                     "capture size (vLLM runs them eagerly) at their eager time; such steps: " + ", ".join(ungraphed))
    for name, s in result["schedules"].items():
        notes.append(f"schedule {name}: {s['steps']} steps ({s['prefill_steps']} prefill, {s['decode_steps']} decode, "
                     f"mean decode batch {s['mean_decode_batch']:.0f}), {s['preemptions']} preemptions, "
                     f"KV {s['kv_tokens']} tokens")
    for name, reason in (result.get("absent") or {}).items():
        notes.append(f"{name} absent: {reason}")
    e2e = result.get("end_to_end") or {}
    if "error" in e2e:
        notes.append(f"end to end: {e2e['error']}")
    elif e2e:
        notes.append(f"end to end (alpha {e2e['alpha_ms']:.2f} ms/step fitted to FA2 {SEED['fa2_req_s']} req/s; "
                     f"attention {e2e['attention_share_fa2'] * 100:.0f} % of FA2's run): "
                     + ", ".join(f"{k} {v['req_s']:.2f} req/s ({common.fmt(v['vs_fa2'], 3, 'x')})"
                                 for k, v in e2e["rows"].items()))
        if e2e.get("fa3_over_fa2"):
            notes.append(f"FA3/FA2 end to end: model {e2e['fa3_over_fa2']:.3f}x, seed {e2e['seed_fa3_over_fa2']:.3f}x")
        if e2e.get("warning"):
            notes.append(f"end to end: {e2e['warning']}")
    for page, entry in (result.get("winners") or {}).items():
        notes.append(f"fastest bf16 family, page {page}: " + ", ".join(f"{ph} {w['bf16']}" for ph, w in entry.items()))
    notes.append(f"elapsed {result.get('elapsed_s', 0):.0f} s")
    common.print_table("Serving replay: attention of the seed workload (seconds)", columns, table, notes, plain=plain)


RATIO_ROWS = (("fa3", "vs_fa2", "FA3 bf16 / FA2"), ("fa4", "vs_fa2", "FA4 / FA2"),
              ("fa3_fp8_same", "vs_fa3_bf16", "FA3 FP8 KV / FA3 bf16, bf16 steps"),
              ("fa3_fp8", "vs_fa3_bf16", "FA3 FP8 KV / FA3 bf16, own steps (totals only)"))


def markdown_ratios(result: dict) -> str:
    """docs/PERFORMANCE.md's ratio table (speed-up: the reference's seconds over the row's),
    recomputed from the run's phases, and the end-to-end model's FA3/FA2 beside the seed's."""
    import copy

    rows = copy.deepcopy(result["rows"])
    ratios(rows)
    by = {(r["variant"], r["page"]): r for r in rows}
    lines = ["| block size | speed-up | prefill | decode eager | decode graphed | total eager | total graphed |",
             "|---|---|---|---|---|---|---|"]
    for page in PAGES:
        for variant, key, label in RATIO_ROWS:
            r = by.get((variant, page))
            if r is None or r["status"] != "ok" or not r.get(key):
                continue
            got = r[key]
            cells = [str(r["block_size"]), label] + [common.fmt(got.get(k), 3, "×") for k in
                                                     ("prefill", "decode_eager", "decode_graph", "total_eager",
                                                      "total_graphed")]
            lines.append("| " + " | ".join(cells) + " |")
    e2e = result.get("end_to_end") or {}
    if e2e.get("fa3_over_fa2"):
        lines.append("")
        lines.append(f"End to end (the model of serving.py's docstring, alpha {e2e['alpha_ms']:.2f} ms per step "
                     f"fitted to FA2's {SEED['fa2_req_s']} req/s): FA3/FA2 {e2e['fa3_over_fa2']:.3f}× "
                     f"against vLLM's measured {e2e['seed_fa3_over_fa2']:.3f}×.")
    return "\n".join(lines)


def markdown_table(result: dict) -> str:
    """docs/PERFORMANCE.md's serving table, filled from a run's JSON (``--markdown``)."""
    lines = ["| row | block size | prefill s | decode eager s | decode graph s | total eager s | total graphed s | "
             "vs FA2 (graphed) | max error |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        t, p = row_totals(r), r["phases"]
        if r["status"] != "ok":
            lines.append(f"| {BY_NAME[r['variant']].label} | {r['block_size']} | {r['status']}: {r.get('note', '')} "
                         "| | | | | | |")
            continue
        errs = [e["rel_l2"] for e in r.get("errors", [])]
        fp8 = [e["rel_l2_vs_bf16_values"] for e in r.get("errors", []) if "rel_l2_vs_bf16_values" in e]
        err = f"{max(errs) * 100:.2f} %" if errs else "—"
        if fp8:
            err += f" ({max(fp8) * 100:.2f} % vs bf16 values)"
        cells = [BY_NAME[r["variant"]].label, str(r["block_size"]), common.fmt(p["prefill"]["gpu_s"], 3),
                 common.fmt(p["decode_eager"]["gpu_s"], 3), common.fmt(t.get("decode_graphed_s"), 3),
                 common.fmt(t["eager_s"], 3), common.fmt(t["graphed_s"], 3),
                 common.fmt((r.get("vs_fa2") or {}).get("total_graphed"), 3, "×"), err]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def print_plan(plan: Plan, args) -> None:
    for (kv, page), s in plan.schedules.items():
        summary = s.summary()
        graphable = sum(1 for st in s.steps if st.kind == "decode"
                        and sched.padded_size(st.num_reqs, sched.capture_sizes(args.max_capture_size)))
        print(f"schedule {kv} page {plan.page_sizes[page]}: {summary['steps']} steps, {summary['prefill_steps']} prefill, "
              f"{summary['decode_steps']} decode ({graphable} graphable), mean decode batch "
              f"{summary['mean_decode_batch']:.0f}, max batch {summary['max_batch']}, {summary['preemptions']} "
              f"preemptions, {summary['kv_tokens']} KV tokens, sampled steps {sampled_steps(s)}")
    for page in args.pages:
        for name in args.variants:
            v = BY_NAME[name]
            print(f"row {v.label} page {plan.page_sizes[page]}: schedule {v.schedule_kv}, fa_version={v.version}")


# --------------------------------------------------------------------------------------


def availability(variant: Variant) -> Optional[str]:
    import vendored_flash_attn as vfa

    reason = vfa.fa_version_unsupported_reason(variant.version)
    if reason:
        return reason
    if variant.kv == "fp8":
        from vendored_flash_attn.selection.environment import current_environment

        if "e4m3" not in current_environment().build_info().component(variant.version).dtypes:
            return f"this wheel's FA{variant.version} has no e4m3 kernels"
    if variant.compiles_at_first_use:
        try:
            from vendored_flash_attn.families.fa4 import adapter as fa4  # the CuTe DSL family's adapter

            fa4.load()
        except Exception as exc:  # noqa: BLE001
            return f"FA4 failed to load: {type(exc).__name__}: {exc}".splitlines()[0][:300]
    return None


def run(args) -> dict:
    import torch

    t_start = time.perf_counter()
    machine = common.machine_info()
    build = common.build_info_dict()
    absent = {}
    variants = []
    for name in args.variants:
        reason = availability(BY_NAME[name])
        if reason:
            absent[name] = reason
            print(f"[serving] {BY_NAME[name].label} absent: {reason}", file=sys.stderr)
        else:
            variants.append(BY_NAME[name])
    fa4_interface = None
    if any(v.compiles_at_first_use for v in variants):
        from vendored_flash_attn.families.fa4 import adapter as fa4  # the CuTe DSL family's adapter: its tile sets the paged layout

        fa4_interface = fa4.load().interface
    tile, tile_note = tile_page_size(fa4_interface)
    gpu_bytes = args.gpu_memory_bytes or torch.cuda.get_device_properties(0).total_memory
    plan = make_plan(args, gpu_bytes, tile)
    print(f"[serving] schedules ready ({time.perf_counter() - t_start:.1f} s); {tile_note}", file=sys.stderr)
    ceilings = common.measure_ceilings(quick=True, timer="events")
    max_blocks16 = max(s.workload.num_blocks * s.workload.block_size // 16 for s in plan.schedules.values())
    max_tokens = max(st.num_tokens for s in plan.schedules.values() for st in s.steps)
    pools = make_pools(max_blocks16, max(max_tokens, args.max_capture_size), DEVICE, seed=args.seed,
                       page_sizes=tuple(plan.page_sizes[p] for p in args.pages))
    capture = sched.capture_sizes(args.max_capture_size)
    watch = common.Stopwatch(args.budget_s)
    rows = []
    for page in args.pages:
        for variant in variants:
            if (variant.schedule_kv, page) not in plan.schedules:
                continue
            label = f"{variant.label} page {plan.page_sizes[page]}"
            t_row = time.perf_counter()
            try:
                row = run_row(variant, page, plan, pools, args, capture, watch)
            except Exception as exc:  # noqa: BLE001
                row = Row(variant.name, page, block_size=plan.page_sizes[page], status="error",
                          note=f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
                if args.verbose:
                    traceback.print_exc()
                if "CUDA error" in str(exc) or "illegal" in str(exc):
                    print("[serving] CUDA error: the context may be unusable; stopping", file=sys.stderr)
                    watch.budget_s = 0.0
            data = _row_dict(row)
            rows.append(data)
            print(f"[serving] {label}: {data['status']} eager {data['totals']['eager_s']:.3f} s, graphed "
                  f"{common.fmt(data['totals']['graphed_s'], 3)} s ({time.perf_counter() - t_row:.1f} s)",
                  file=sys.stderr)
            torch.cuda.empty_cache()
    ratios(rows)
    schedules_out = {f"{kv}@{plan.page_sizes[page]}": s.summary() for (kv, page), s in plan.schedules.items()}
    step_lists = {key: [(st.num_tokens, st.sampled) for st in s.steps] for key, s in plan.schedules.items()}
    workload = {"num_requests": args.num_requests, "prompt": args.prompt, "output": args.output,
                "max_num_batched_tokens": args.max_num_batched_tokens, "max_num_seqs": args.max_num_seqs,
                "max_model_len": args.max_model_len}
    return {
        "benchmark": "serving",
        "machine": machine,
        "build_info": build,
        "model_text": __doc__,
        "workload": workload,
        "settings": {"layers": args.layers, "reps": args.reps, "pages": {p: plan.page_sizes[p] for p in args.pages},
                     "tile_note": tile_note, "graphs": not args.no_graphs, "max_capture_size": args.max_capture_size,
                     "gpu_bytes": gpu_bytes, "reserved_gib": args.reserved_gib, "kv_tokens": args.kv_tokens,
                     "quick": args.quick, "budget_s": args.budget_s},
        "ceilings": ceilings,
        "schedules": schedules_out,
        "absent": absent,
        "rows": rows,
        "winners": winners(rows),
        "end_to_end": end_to_end(rows, step_lists, ceilings, workload),
        "elapsed_s": time.perf_counter() - t_start,
    }


def _row_dict(row: Row) -> dict:
    data = {"variant": row.variant, "page": row.page, "block_size": row.block_size, "status": row.status,
            "note": row.note, "phases": {k: vars(v) for k, v in row.phases.items()},
            "decode_ungraphed_steps": row.decode_ungraphed_steps, "decode_ungraphed_s": row.decode_ungraphed_s,
            "first_call_s": row.first_call_s,
            "errors": row.errors, "capture_s": row.capture_s, "captures": row.captures, "graphs": row.graphs}
    data["totals"] = totals(data)
    return data


# --------------------------------------------------------------------------------------
# Recording a run for the selector's defaults (measured.json, the declaration's not_default)


def measured_entry(result: dict) -> tuple[int, dict]:
    """(GPU generation, the measured.json entry) of a serving.json: attention seconds per block
    size, family and phase, with where they come from. Refuses what is not the seed workload
    run in full (a --quick run, another request count, failed rows)."""
    settings, workload = result.get("settings") or {}, result.get("workload") or {}
    if settings.get("quick") or workload.get("num_requests") != sched.NUM_REQUESTS or \
            workload.get("prompt") != sched.PROMPT or workload.get("output") != sched.OUTPUT:
        raise ValueError("not the seed workload in full (--quick, or other requests/prompt/output): not recorded")
    gpu = (result.get("machine") or {}).get("gpu") or {}
    if not gpu.get("capability"):
        raise ValueError("the run's JSON names no GPU (machine.gpu.capability)")
    major = int(str(gpu["capability"]).split(".")[0])
    rows: dict = {}
    for r in result["rows"]:
        if r["status"] != "ok":
            continue
        p, t = r["phases"], row_totals(r)
        figures = {"prefill_s": p["prefill"]["gpu_s"], "decode_eager_s": p["decode_eager"]["gpu_s"],
                   "decode_graph_s": t.get("decode_graphed_s"), "total_eager_s": t["eager_s"],
                   "total_graphed_s": t["graphed_s"]}
        errors = [e["rel_l2"] for e in r.get("errors", [])]
        if errors:
            figures["max_rel_l2"] = max(errors)
        fp8 = [e["rel_l2_vs_bf16_values"] for e in r.get("errors", []) if "rel_l2_vs_bf16_values" in e]
        if fp8:
            figures["max_rel_l2_vs_bf16_values"] = max(fp8)
        rows.setdefault(str(r["block_size"]), {})[r["variant"]] = {
            k: (round(v, 4) if isinstance(v, float) and k.endswith("_s") else v) for k, v in figures.items()}
    if not rows:
        raise ValueError("no row of the run succeeded: nothing to record")
    machine = result.get("machine") or {}
    argv = machine.get("argv") or []
    e2e = result.get("end_to_end") or {}
    build = result.get("build_info") or {}
    entry = {"gpu": gpu.get("name"), "date": str(machine.get("date", ""))[:10],
             "command": " ".join(["python", "benchmarks/serving.py", *_portable_argv(argv[1:])]),
             "source": {"git_commit": machine.get("git_commit"), "package_version": build.get("_package_version"),
                        "preset": build.get("preset")},
             "workload": workload, "layers_replayed": settings.get("layers"), "rows": rows,
             "winners": {str(result["settings"]["pages"].get(page, page)): {ph: w["bf16"] for ph, w in best.items()}
                         for page, best in (result.get("winners") or {}).items()},
             "end_to_end": {k: e2e.get(k) for k in ("fa3_over_fa2", "seed_fa3_over_fa2", "alpha_ms")
                            if e2e.get(k) is not None}}
    return major, entry


def not_default_text(entry: dict, family: str, default: str, generation: str) -> str:
    """The sentence for the families declaration's not_default[major] of ``family``, from a
    recorded entry: its attention seconds against the default family's, per block size."""
    per_size, faster = [], []
    for size, rows in sorted(entry["rows"].items(), key=lambda kv: int(kv[0])):
        ours, theirs = rows.get(family), rows.get(default)
        if not ours or not theirs:
            continue
        parts = []
        for key, label in (("prefill_s", "prefill"), ("decode_graph_s", "decode in CUDA graphs"),
                           ("total_graphed_s", "total")):
            if ours.get(key) and theirs.get(key):
                parts.append(f"{label} {ours[key]:.3f} s against {theirs[key]:.3f} s")
                if ours[key] < theirs[key]:
                    faster.append(f"{label} at block size {size}")
        per_size.append(f"block size {size}: " + ", ".join(parts))
    head = (f"{default.upper()} stays the default on {generation}: on the {entry['gpu']} ({entry['date']}), "
            f"benchmarks/serving.py's replay of vLLM's seed workload measured {family.upper()}'s attention at "
            + "; ".join(per_size) + f" ({family.upper()} against {default.upper()}; measured.json)")
    if faster:
        head += f". {family.upper()} is faster in " + ", ".join(faster) + ": the default needs a decision"
    return head


def _portable_argv(args: list) -> list:
    """The run's arguments with the output folder (a path of the machine it ran on) as DIR:
    measured.json ships in the package."""
    out = []
    for i, arg in enumerate(args):
        if i and args[i - 1] == "--out":
            arg = "DIR"
        elif arg.startswith("--out="):
            arg = "--out=DIR"
        out.append(arg)
    return out


def record(json_path: Path, measured_path: Path) -> int:
    """--record: the run's figures into measured.json, and the not_default sentences to paste
    into cmake/knobs.json."""
    import json

    result = json.loads(Path(json_path).read_text())
    try:
        major, entry = measured_entry(result)
    except ValueError as exc:
        print(f"serving.py --record {json_path}: {exc}", file=sys.stderr)
        return 1
    data = json.loads(measured_path.read_text())
    data.setdefault("serving", {})[str(major)] = entry
    measured_path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    print(f"recorded compute capability {major}.x ({entry['gpu']}, {entry['date']}) in {measured_path}")
    for size, winners in entry["winners"].items():
        print(f"  fastest bf16 family at block size {size}: " + ", ".join(f"{ph} {w}" for ph, w in winners.items()))
    _importable_package()
    from vendored_flash_attn.declaration.families import registry

    families = registry()
    default = next((f for f in families.in_default_order() if f.is_default_on(major)), None)
    for family in families:
        if default is None or family is default or family.is_default_on(major):
            continue
        if major not in family.generations and family.generations:
            continue
        generation = {9: "Hopper", 10: "Blackwell", 11: "Blackwell"}.get(major, f"compute capability {major}.x")
        print(f"\ncmake/knobs.json families.{family.name}.not_default[\"{major}\"], to paste (and extend with what "
              f"else it rests on):\n  {json.dumps(not_default_text(entry, family.name, default.name, generation))}")
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="folder for serving.json")
    p.add_argument("--quick", action="store_true",
                   help="200 requests, 1 layer, 1 repeat, block size 16 only (a check that everything runs)")
    p.add_argument("--num-requests", type=int, default=sched.NUM_REQUESTS)
    p.add_argument("--prompt", type=int, default=sched.PROMPT, help="prompt tokens per request")
    p.add_argument("--output", type=int, default=sched.OUTPUT, help="output tokens per request")
    p.add_argument("--layers", type=int, default=4, help="calls replayed per step, scaled to 32 layers")
    p.add_argument("--reps", type=int, default=3, help="timed repeats per step (median)")
    p.add_argument("--variants", nargs="*", default=[v.name for v in VARIANTS], choices=[v.name for v in VARIANTS])
    p.add_argument("--pages", nargs="*", default=list(PAGES), choices=PAGES)
    p.add_argument("--kv-tokens", type=int, default=None,
                   help="bf16 KV cache capacity in tokens (vLLM's 'GPU KV cache size'); default: sized as vLLM "
                        "sizes it on this GPU (FP8 holds twice as many)")
    p.add_argument("--gpu-memory-bytes", type=int, default=None,
                   help="GPU memory the KV sizing assumes (default: this GPU's; --dry-run: an H200's)")
    p.add_argument("--reserved-gib", type=float, default=sched.RESERVED_GIB)
    p.add_argument("--max-num-batched-tokens", type=int, default=sched.MAX_NUM_BATCHED_TOKENS)
    p.add_argument("--max-num-seqs", type=int, default=sched.MAX_NUM_SEQS)
    p.add_argument("--max-model-len", type=int, default=sched.MAX_MODEL_LEN)
    p.add_argument("--max-capture-size", type=int, default=sched.MAX_CAPTURE_SIZE)
    p.add_argument("--no-graphs", action="store_true", help="eager decode only")
    p.add_argument("--budget-s", type=float, default=300.0, help="stop replaying new steps after this many seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="print the schedules and rows, no GPU")
    p.add_argument("--record", type=Path, metavar="SERVING_JSON",
                   help="write a run's figures into the package's measured.json (what `info` shows and the "
                        "declaration's not_default cites) and print the not_default sentences; no GPU")
    p.add_argument("--markdown", type=Path, metavar="SERVING_JSON",
                   help="print docs/PERFORMANCE.md's serving table from a run's JSON; no GPU")
    p.add_argument("--measured", type=Path, default=common.ROOT / "python" / "vendored_flash_attn" / "measured.json",
                   help=argparse.SUPPRESS)
    p.add_argument("--plain", action="store_true")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.num_requests = min(args.num_requests, 200)
        args.layers, args.reps = 1, 1
        args.pages = ["16"]
    if args.layers < 1 or args.reps < 1 or args.num_requests < 1:
        p.error("--layers, --reps and --num-requests must be >= 1")
    if args.max_capture_size > 992:
        p.error("--max-capture-size above 992: FA3's dynamic split stops at 992 sequences (vLLM refuses it too)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.record:
        return record(args.record, args.measured)
    if args.markdown:
        import json

        result = json.loads(args.markdown.read_text())
        print(markdown_table(result))
        print()
        print(markdown_ratios(result))
        return 0
    if args.dry_run:
        tile, note = tile_page_size()
        plan = make_plan(args, args.gpu_memory_bytes or sched.H200_BYTES, tile)
        print(note)
        print_plan(plan, args)
        return 0
    import torch

    if not torch.cuda.is_available():
        print("serving.py needs a CUDA GPU (--dry-run works without)", file=sys.stderr)
        return 2
    result = run(args)
    path = common.write_json(args.out / "serving.json", result)
    print(f"[serving] wrote {path}", file=sys.stderr)
    print_results(result, plain=args.plain)
    return 0 if all(r["status"] == "ok" for r in result["rows"]) and result["rows"] else 1


if __name__ == "__main__":
    sys.exit(main())
