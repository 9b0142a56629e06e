"""The steps vLLM's V1 scheduler makes of the seed workload, and the attention call of each:
a model of ``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule``) with the KV cache
manager's block accounting, in plain Python (no torch, no GPU), for benchmarks/serving.py.

What is modelled, per step (one forward pass of the model):

* a token budget of ``max_num_batched_tokens``; the RUNNING requests are scheduled first, in
  the order they were admitted, each with the tokens it has not computed yet (a prefill
  chunk, or the one token sampled last step), cut to the budget left (chunked prefill);
* each scheduled request needs KV blocks for all its computed tokens plus this step's
  (``ceil(tokens / block_size)``); when the pool has too few free blocks, the running request
  admitted last is preempted (its blocks freed, its progress dropped: recomputed later from
  scratch, prompt and generated tokens alike) and put first in the waiting queue, until the
  request fits or is itself the one preempted;
* then, if nothing was preempted this step, WAITING requests are admitted in order while
  budget, ``max_num_seqs`` and free blocks allow, each with as much of its prompt as the budget
  leaves (chunked prefill); the first one that does not fit stops admission;
* after the step, every request whose computed tokens reached its total sampled one token;
  a request that has its ``output`` tokens is finished and its blocks go back to the pool.

Blocks: block 0 is the null block (vLLM's BlockPool reserves it); the free queue hands out
from its head and takes freed blocks at its tail, a request's blocks in reverse order (the
order vLLM frees them), so block tables scatter over the pool as serving goes on. All
requests arrive at once (vLLM's offline throughput benchmark). No prefix-cache hits (random
prompts), no cascade attention (no common prefix), no speculative decoding.

The batch of a step is the scheduled requests in scheduling order; its attention call (one
per layer: vLLM's FlashAttention backend makes a single varlen call for prefill chunks and
decodes together) has query lengths = tokens scheduled, KV lengths = computed + scheduled.
A step is a "decode" step when every query length is 1 (vLLM's uniform decode batch, what
its full CUDA graphs capture), otherwise a "prefill" step (chunked prefill, usually mixed
with decodes).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Optional

# Llama-3.1-8B-Instruct and the seed workload (issue 27: vLLM's measurement behind the choice
# of FA3: FA2 12.81 req/s, FA3 14.24 req/s, +11 %).
LAYERS = 32
PARAMS = 8_030_261_248           # Llama-3.1-8B-Instruct, bf16 weights
NUM_REQUESTS = 1000              # vLLM's throughput benchmark default --num-prompts
PROMPT = 2048
OUTPUT = 128
MAX_NUM_BATCHED_TOKENS = 16384
MAX_NUM_SEQS = 1024              # vLLM V1's default for an offline LLM on a >= 70 GiB GPU
MAX_MODEL_LEN = 131072           # Llama-3.1's context, vLLM's default max_model_len for it
GPU_MEMORY_UTILIZATION = 0.9
RESERVED_GIB = 4.0               # activations of the profiling run, non-torch memory, graphs
H200_BYTES = 143_771 * 2**20     # what torch reports for an H200 (used when no GPU is asked)


def kv_bytes_per_token(kv_elem: int, layers: int = LAYERS, heads_kv: int = 8, head_dim: int = 128) -> int:
    """K and V of one token over all layers."""
    return layers * 2 * heads_kv * head_dim * kv_elem


def kv_cache_blocks(gpu_bytes: int, kv_elem: int, block_size: int, *,
                    utilization: float = GPU_MEMORY_UTILIZATION, weights_bytes: int = 2 * PARAMS,
                    reserved_bytes: int = int(RESERVED_GIB * 2**30)) -> int:
    """Blocks of the KV cache as vLLM sizes it: what gpu_memory_utilization leaves after the
    weights and the profiled peak (``reserved_bytes``), in blocks of ``block_size`` tokens of
    every layer."""
    available = gpu_bytes * utilization - weights_bytes - reserved_bytes
    if available <= 0:
        raise ValueError(f"no memory left for the KV cache ({gpu_bytes / 2**30:.1f} GiB GPU)")
    return int(available // (kv_bytes_per_token(kv_elem) * block_size))


@dataclass(frozen=True)
class Workload:
    num_requests: int = NUM_REQUESTS
    prompt: int = PROMPT
    output: int = OUTPUT
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = MAX_NUM_SEQS
    block_size: int = 16
    num_blocks: int = 0          # the KV cache, null block included

    def __post_init__(self):
        if min(self.num_requests, self.prompt, self.output, self.max_num_batched_tokens, self.max_num_seqs,
               self.block_size) < 1:
            raise ValueError(f"workload values must be >= 1: {self}")
        if self.block_size % 16:
            raise ValueError(f"vLLM's FlashAttention backend takes block sizes that are multiples of 16, "
                             f"got {self.block_size}")
        need = math.ceil((self.prompt + self.output) / self.block_size) + 1
        if self.num_blocks < need:
            raise ValueError(f"a KV cache of {self.num_blocks} blocks cannot hold one request "
                             f"({need} blocks with the null block)")


@dataclass
class _Request:
    rid: int
    prompt: int
    output: int
    computed: int = 0
    generated: int = 0
    blocks: list = field(default_factory=list)
    generation: int = 0          # bumped on preemption: its block list starts again

    @property
    def total(self) -> int:
        return self.prompt + self.generated


@dataclass(frozen=True)
class Entry:
    """One request of a step's batch: ``query_len`` new tokens, ``seq_len`` KV tokens after
    them; its blocks are ``Schedule.blocks[(rid, generation)][:ceil(seq_len / block_size)]``."""

    rid: int
    generation: int
    query_len: int
    seq_len: int


@dataclass
class Step:
    index: int
    entries: tuple[Entry, ...]
    preempted: int = 0

    @property
    def kind(self) -> str:
        return "decode" if all(e.query_len == 1 for e in self.entries) else "prefill"

    @property
    def num_reqs(self) -> int:
        return len(self.entries)

    @property
    def num_tokens(self) -> int:
        return sum(e.query_len for e in self.entries)

    @property
    def max_query_len(self) -> int:
        return max(e.query_len for e in self.entries)

    @property
    def max_seq_len(self) -> int:
        return max(e.seq_len for e in self.entries)

    @property
    def sampled(self) -> int:
        """Requests that sample a token this step (prefill complete, or decoding)."""
        return self._sampled

    def __post_init__(self):
        self._sampled = 0


@dataclass
class Schedule:
    workload: Workload
    steps: list[Step]
    blocks: dict                 # (rid, generation) -> block ids, in the order they were given
    preemptions: int
    recomputed_tokens: int

    def block_ids(self, entry: Entry) -> list[int]:
        return self.blocks[(entry.rid, entry.generation)][:math.ceil(entry.seq_len / self.workload.block_size)]

    def summary(self) -> dict:
        kinds = collections.Counter(s.kind for s in self.steps)
        tokens = sum(s.num_tokens for s in self.steps)
        decode_tokens = sum(1 for s in self.steps for e in s.entries if e.query_len == 1)
        return {
            "steps": len(self.steps), "prefill_steps": kinds["prefill"], "decode_steps": kinds["decode"],
            "tokens": tokens, "decode_tokens": decode_tokens, "prefill_tokens": tokens - decode_tokens,
            "preemptions": self.preemptions, "recomputed_tokens": self.recomputed_tokens,
            "max_batch": max(s.num_reqs for s in self.steps),
            "mean_decode_batch": (sum(s.num_reqs for s in self.steps if s.kind == "decode")
                                  / max(1, kinds["decode"])),
            "num_blocks": self.workload.num_blocks, "block_size": self.workload.block_size,
            "kv_tokens": (self.workload.num_blocks - 1) * self.workload.block_size,
        }


def simulate(w: Workload, max_steps: Optional[int] = None) -> Schedule:
    """Run the scheduler model until every request has finished (or ``max_steps``)."""
    free = collections.deque(range(1, w.num_blocks))
    waiting = collections.deque(_Request(i, w.prompt, w.output) for i in range(w.num_requests))
    running: list[_Request] = []
    blocks: dict = {}
    steps: list[Step] = []
    preemptions = recomputed = 0

    def release(req: _Request) -> None:
        free.extend(reversed(req.blocks))
        req.blocks = []

    def allocate(req: _Request, tokens: int) -> bool:
        need = math.ceil((req.computed + tokens) / w.block_size) - len(req.blocks)
        if need > len(free):
            return False
        for _ in range(need):
            req.blocks.append(free.popleft())
        blocks[(req.rid, req.generation)] = list(req.blocks)
        return True

    while (waiting or running) and (max_steps is None or len(steps) < max_steps):
        budget = w.max_num_batched_tokens
        scheduled: list[tuple[_Request, int]] = []
        preempted_now = 0
        index = 0
        while index < len(running) and budget > 0:
            req = running[index]
            tokens = min(req.total - req.computed, budget)
            fits = True
            while not allocate(req, tokens):
                victim = running.pop()
                release(victim)
                recomputed += victim.computed
                victim.computed = 0
                victim.generation += 1
                waiting.appendleft(victim)
                preemptions += 1
                preempted_now += 1
                if victim is req:
                    fits = False
                    break
            if not fits:
                break
            scheduled.append((req, tokens))
            budget -= tokens
            index += 1
        if not preempted_now:
            while waiting and budget > 0 and len(running) < w.max_num_seqs:
                req = waiting[0]
                tokens = min(req.total - req.computed, budget)
                if not allocate(req, tokens):
                    break
                waiting.popleft()
                running.append(req)
                scheduled.append((req, tokens))
                budget -= tokens
        if not scheduled:
            raise RuntimeError(f"step {len(steps)}: nothing could be scheduled ({len(waiting)} waiting, "
                               f"{len(free)} free blocks): the KV cache is too small for one request")
        entries = tuple(Entry(r.rid, r.generation, n, r.computed + n) for r, n in scheduled)
        step = Step(len(steps), entries, preempted_now)
        sampled = 0
        for req, n in scheduled:
            req.computed += n
            if req.computed == req.total:
                req.generated += 1
                sampled += 1
                if req.generated >= req.output:
                    running.remove(req)
                    release(req)
        step._sampled = sampled
        steps.append(step)
    return Schedule(w, steps, blocks, preemptions, recomputed)


# --- CUDA graph capture sizes ---------------------------------------------------------------

MAX_CAPTURE_SIZE = 512


def capture_sizes(max_size: int = MAX_CAPTURE_SIZE) -> list[int]:
    """vLLM's default cudagraph capture sizes: 1, 2, 4, then every multiple of 8 up to the
    maximum (512)."""
    return [s for s in [1, 2, 4] + list(range(8, max_size + 1, 8)) if s <= max_size]


def padded_size(batch: int, sizes: list[int]) -> Optional[int]:
    """The capture size a decode batch is padded to; None when it is larger than all (vLLM
    then runs the step without a full graph)."""
    for size in sizes:
        if size >= batch:
            return size
    return None
