"""benchmarks/serving.py and its scheduler model (benchmarks/serving_schedule.py) on the CPU:
the V1 scheduler model's invariants, the KV sizing, the call inputs each step hands to the
interface (through the fake ops, so the package's own checks pass them), the CUDA-graph
buffers' padding, the float64 reference, and the result arithmetic (totals, ratios, the
end-to-end model, the table)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from runtime_fakes import AMPERE, HOPPER
from test_benchmarks_cpu import BENCH, load

sched = load("serving_schedule")
serving = load("serving")


def small(num_blocks=400, **kw):
    args = dict(num_requests=24, prompt=300, output=20, max_num_batched_tokens=1024, max_num_seqs=64,
                block_size=16, num_blocks=num_blocks)
    args.update(kw)
    return sched.Workload(**args)


def replay_requests(schedule):
    """Per request, its entries in step order, checking each step's invariants on the way."""
    w = schedule.workload
    per_request: dict[int, list] = {}
    for step in schedule.steps:
        assert step.num_tokens <= w.max_num_batched_tokens
        assert step.num_reqs <= w.max_num_seqs
        used = set()
        for e in step.entries:
            ids = schedule.block_ids(e)
            assert len(ids) == math.ceil(e.seq_len / w.block_size)
            assert all(0 < b < w.num_blocks for b in ids), "the null block 0 or a block outside the pool"
            assert used.isdisjoint(ids), f"step {step.index}: two requests share a block"
            used.update(ids)
            per_request.setdefault(e.rid, []).append(e)
    return per_request


@pytest.mark.parametrize("blocks, preempts", [(2000, False), (120, True)])
def test_every_request_is_prefilled_then_decoded_to_its_output(blocks, preempts):
    schedule = sched.simulate(small(num_blocks=blocks))
    w = schedule.workload
    assert (schedule.preemptions > 0) == preempts
    per_request = replay_requests(schedule)
    assert sorted(per_request) == list(range(w.num_requests))
    for rid, entries in per_request.items():
        computed, generation, sampled = 0, entries[0].generation, 0
        for e in entries:
            if e.generation != generation:  # preempted: recomputed from nothing
                generation, computed = e.generation, 0
            assert e.seq_len == computed + e.query_len
            computed = e.seq_len
            if computed >= w.prompt + sampled:  # caught up: one token sampled
                sampled += 1
        assert sampled == w.output, (rid, sampled)
        assert entries[-1].query_len == 1 and entries[-1].seq_len == w.prompt + w.output - 1
    summary = schedule.summary()
    assert summary["tokens"] == w.num_requests * (w.prompt + w.output - 1) + schedule.recomputed_tokens


def test_no_request_is_admitted_in_a_step_that_preempted():
    """vLLM's scheduler admits waiting requests only when it preempted nothing that step."""
    # a small budget: the preempting step has budget left for the waiting queue's head
    schedule = sched.simulate(small(num_blocks=120, max_num_batched_tokens=256))
    seen = set()
    preempting = 0
    for step in schedule.steps:
        fresh = [e for e in step.entries if (e.rid, e.generation) not in seen]
        seen.update((e.rid, e.generation) for e in step.entries)
        if step.preempted:
            preempting += 1
            assert fresh == [], f"step {step.index} preempted and admitted {fresh}"
    assert preempting > 0


def test_chunked_prefill_fills_the_budget_and_running_requests_go_first():
    schedule = sched.simulate(small())
    first, second = schedule.steps[0], schedule.steps[1]
    # 1024 tokens: three whole 300-token prompts and a 124-token chunk of the fourth
    assert [e.query_len for e in first.entries] == [300, 300, 300, 124]
    assert first.kind == "prefill" and first.num_tokens == 1024
    # next step: the three decodes and the fourth prompt's remaining 176 tokens first, then new prompts
    assert [(e.rid, e.query_len) for e in second.entries[:4]] == [(0, 1), (1, 1), (2, 1), (3, 176)]
    assert second.entries[3].seq_len == 300 and second.num_tokens == 1024


def test_decode_steps_are_uniform_batches():
    schedule = sched.simulate(small(num_requests=4))
    decode = [s for s in schedule.steps if s.kind == "decode"]
    assert decode and all(e.query_len == 1 for s in decode for e in s.entries)
    assert decode[-1].num_reqs >= 1 and decode[-1].max_seq_len == 319


def test_a_cache_too_small_for_one_request_is_refused():
    with pytest.raises(ValueError, match="cannot hold one request"):
        small(num_blocks=10)
    with pytest.raises(ValueError, match="multiples of 16"):
        small(block_size=24)


def test_kv_sizing_of_the_seed_on_an_h200():
    """(0.9 x 140.4 GiB - 16.06 GB of weights - 4 GiB) / 128 KiB per token (bf16, 32 layers,
    8 KV heads, d 128): 879,824 tokens in 16-token blocks; FP8 twice that."""
    assert sched.kv_bytes_per_token(2) == 131072
    bf16 = sched.kv_cache_blocks(sched.H200_BYTES, 2, 16)
    assert bf16 == 54990 and (bf16 - 1) * 16 == 879_824
    assert sched.kv_cache_blocks(sched.H200_BYTES, 1, 16) == pytest.approx(2 * bf16, abs=1)
    with pytest.raises(ValueError, match="no memory left"):
        sched.kv_cache_blocks(16 * 2**30, 2, 16)


def test_capture_sizes_and_padding():
    sizes = sched.capture_sizes(512)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 512 and len(sizes) == 67
    assert [sched.padded_size(b, sizes) for b in (1, 3, 9, 512, 513)] == [1, 4, 16, 512, None]


# --- the calls each step makes, through the package's checks (fake ops) -----------------------

def _cpu_pools(schedule, page_sizes=(16,)):
    tokens = max(s.num_tokens for s in schedule.steps)
    return serving.make_pools(schedule.workload.num_blocks * schedule.workload.block_size // 16, max(tokens, 8),
                              "cpu", page_sizes=page_sizes)


@pytest.fixture
def tiny():
    return sched.simulate(small(num_requests=6, prompt=40, output=4, max_num_batched_tokens=64, num_blocks=64))


@pytest.mark.parametrize("name", ["fa2", "fa3", "fa3_fp8"])
def test_each_step_is_a_valid_call(describe, fake_ops, tiny, name):
    """Every step's eager call passes the interface's checks and reaches the op with vLLM's
    arguments: FA3 with the scheduler metadata of that step (checked against the call by the
    package), FP8 with the expanded descales, 16-bit calls with the descales dropped."""
    from vendored_flash_attn import flash_attn_varlen_func

    describe(caps=(HOPPER if name != "fa2" else AMPERE,))
    variant = serving.BY_NAME[name]
    pools = _cpu_pools(tiny)
    for step in tiny.steps:
        kwargs, metadata = serving.eager_call(variant, tiny, step, pools, "cpu")
        if metadata is not None:
            metadata()
        fake_ops.calls.clear()
        flash_attn_varlen_func(**kwargs)
        op, got = fake_ops.calls[-1]
        assert op == ("varlen_fwd" if name == "fa2" else "fwd")
        assert got["max_seqlen_q"] == step.max_query_len and got["max_seqlen_k"] == step.max_seq_len
        assert got["cu_seqlens_q"].tolist()[-1] == step.num_tokens
        assert got["seqused_k"].tolist() == [e.seq_len for e in step.entries]
        if name != "fa2":
            assert got["scheduler_metadata"] is kwargs["scheduler_metadata"]
            assert got["num_splits"] == 0
            if name == "fa3_fp8":
                assert got["q"].dtype == torch.float8_e4m3fn and got["k_descale"].stride() == (0, 0)
            else:
                assert got["q_descale"] is None


def test_graph_buffers_pad_the_batch_and_hand_views_to_the_call(describe, fake_ops, tiny):
    from vendored_flash_attn import flash_attn_varlen_func

    describe(caps=(HOPPER,))
    decode = next(s for s in tiny.steps if s.kind == "decode" and s.num_reqs > 1)
    size = sched.padded_size(decode.num_reqs, sched.capture_sizes(16))
    assert size > decode.num_reqs
    pools = _cpu_pools(tiny)
    buffers = serving.GraphBuffers(serving.BY_NAME["fa3"], tiny, pools, 16, 2048, "cpu")
    assert buffers.table.shape == (16, 128)  # as wide as max_model_len needs
    buffers.write(decode, size)
    buffers.metadata.fill_(-1)  # what a larger batch's metadata left behind
    buffers.refresh_metadata(size)
    call = buffers.call(size)
    assert buffers.cu[:size + 1].tolist() == list(range(size + 1))  # one token per request, pads too
    used = buffers.used[:size].tolist()
    assert used[:decode.num_reqs] == [e.seq_len for e in decode.entries]
    assert used[decode.num_reqs:] == [1] * (size - decode.num_reqs)   # pads: one token...
    assert (buffers.table[decode.num_reqs:size] == 0).all()           # ...in the null block
    metadata = call["scheduler_metadata"]
    assert metadata.data_ptr() == buffers.metadata.data_ptr()         # a view of the persistent buffer
    assert (buffers.metadata[metadata.numel():] == 0).all()
    flash_attn_varlen_func(**call)
    op, got = fake_ops.calls[-1]
    assert got["num_splits"] == serving.GRAPH_NUM_SPLITS and got["max_seqlen_k"] == 2048
    assert got["q"].data_ptr() == buffers.q.data_ptr() and got["out"].data_ptr() == buffers.out.data_ptr()
    meta_call = [a for n, a in fake_ops.calls if n == "get_scheduler_metadata"][-1]
    assert meta_call["batch_size"] == size and meta_call["num_splits"] == serving.GRAPH_NUM_SPLITS


def test_pools_view_as_each_page_size_and_fp8_is_the_quantized_cache():
    pools = serving.make_pools(20, 8, "cpu", page_sizes=(16, 128))
    assert pools.k.shape[0] == 24  # rounded to whole 128-token pages
    k16, _ = pools.kv("bf16", 16)
    k128, v128 = pools.kv("fp8", 128)
    assert k16.shape == (24, 16, 8, 128) and k128.shape == (3, 128, 8, 128) and k128.dtype == torch.float8_e4m3fn
    assert torch.equal(k128.view(-1)[:1000].float(), pools.k.view(-1)[:1000].to(torch.float8_e4m3fn).float())
    assert abs(float(pools.v.float().mean()) - serving.V_MEAN) < 0.05  # values with a non-zero mean


def test_the_reference_is_causal_attention_per_sequence(tiny):
    torch.manual_seed(0)
    pools = _cpu_pools(tiny)
    step = next(s for s in tiny.steps if s.kind == "prefill" and any(
        e.seq_len > e.query_len > 1 for e in s.entries))
    index = next(i for i, e in enumerate(step.entries) if e.seq_len > e.query_len > 1)
    e = step.entries[index]
    k, v = pools.kv("bf16", 16)
    q = pools.q[:step.num_tokens]
    rows, ref = serving.reference_rows(tiny, step, index, q, k, v, q_rows=3)
    assert rows.stop - rows.start == 3
    ids = tiny.block_ids(e)
    keys = k[ids].reshape(-1, 8, 128)[:e.seq_len].double()
    values = v[ids].reshape(-1, 8, 128)[:e.seq_len].double()
    for r, token in enumerate(range(rows.start, rows.stop)):
        position = e.seq_len - (rows.stop - token)      # this query's place in its sequence
        for head in (0, 5, 31):
            scores = keys[:position + 1, head // 4] @ q[token, head].double() / math.sqrt(128)
            want = torch.softmax(scores, 0) @ values[:position + 1, head // 4]
            assert torch.allclose(ref[r, head], want, rtol=1e-9, atol=1e-12)


# --- result arithmetic ------------------------------------------------------------------------

def _row(variant, page, prefill, eager, graph, tokens=(1000, 200), ungraphed_s=0.0, status="ok"):
    row = {"variant": variant, "page": page, "block_size": 16, "status": status, "note": "", "graphs": True,
           "decode_ungraphed_steps": 1 if ungraphed_s else 0, "decode_ungraphed_s": ungraphed_s,
           "phases": {"prefill": {"gpu_s": prefill, "tokens": tokens[0], "steps": 2},
                      "decode_eager": {"gpu_s": eager, "tokens": tokens[1], "steps": 3},
                      "decode_graph": {"gpu_s": graph, "tokens": tokens[1], "steps": 2}},
           "errors": [{"rel_l2": 0.002}]}
    row["totals"] = serving.totals(row)
    return row


def test_totals_ratios_and_winners():
    rows = [_row("fa2", "16", 4.0, 3.0, 2.5), _row("fa3", "16", 2.0, 2.0, 1.5, ungraphed_s=0.5),
            _row("fa3_fp8", "16", 1.8, 1.2, 1.0), _row("fa4", "16", 2.5, 2.2, 2.0)]
    assert rows[1]["totals"]["graphed_s"] == pytest.approx(2.0 + 1.5 + 0.5)
    assert rows[0]["totals"]["tokens_per_s_eager"] == pytest.approx(1200 / 7.0)
    serving.ratios(rows)
    assert rows[1]["vs_fa2"]["prefill"] == pytest.approx(2.0)
    assert rows[1]["vs_fa2"]["total_graphed"] == pytest.approx(6.5 / 4.0)
    # FP8 on its own schedule: totals only (its steps are not FA3 bf16's)
    assert "prefill" not in rows[2]["vs_fa3_bf16"] and rows[2]["vs_fa3_bf16"]["total_eager"] == pytest.approx(4 / 3)
    best = serving.winners(rows)["16"]
    assert best["prefill"]["bf16"] == "fa3" and best["total_graphed"]["bf16"] == "fa3"
    assert best["decode_graph"]["seconds"]["fa4"] == 2.0
    # The graphed decode of a row counts its steps too large for a graph at their eager time:
    # compared with a row whose every step was graphed, it covers the same decode.
    assert best["decode_graph"]["seconds"]["fa3"] == pytest.approx(1.5 + 0.5)
    assert rows[1]["vs_fa2"]["decode_graph"] == pytest.approx(2.5 / 2.0)


def test_the_tables_show_the_whole_graphed_decode(tmp_path, capsys):
    # A JSON written before decode_graphed_s existed reads the same (its totals lack it).
    row = _row("fa3_fp8", "16", 6.3, 3.3, 1.1, ungraphed_s=2.2)
    del row["totals"]["decode_graphed_s"]
    assert serving.phase_seconds(row, "decode_graph") == pytest.approx(3.3)
    result = {"rows": [row]}
    assert "| 6.300 | 3.300 | 3.300 |" in serving.markdown_table(result)


def test_the_end_to_end_model_is_calibrated_on_fa2():
    rows = [_row("fa2", "16", 4.0, 3.0, 2.5), _row("fa3", "16", 2.0, 2.0, 1.5)]
    steps = [(16384, 8)] * 100 + [(300, 300)] * 100
    ceilings = {"copy_gbs": 4000.0, "bf16_matmul_tflops": 700.0}
    e2e = serving.end_to_end(rows, {("bf16", "16"): steps}, ceilings, {"num_requests": 1000})
    assert e2e["rows"]["fa2@16"]["req_s"] == pytest.approx(serving.SEED["fa2_req_s"])
    # same rest for both: FA3's graphed attention is 3.5 s, FA2's 6.5 s
    fa2_run = 1000 / serving.SEED["fa2_req_s"]
    assert e2e["rows"]["fa3@16"]["run_s"] == pytest.approx(fa2_run - 3.0)
    assert e2e["fa3_over_fa2"] == pytest.approx(fa2_run / (fa2_run - 3.0))
    assert e2e["alpha_ms"] > 0 and "warning" not in e2e
    gemm = sum(max(2 * (serving.LINEAR_PARAMS + serving.LM_HEAD_PARAMS) / 4e12,
                   (2 * serving.LINEAR_PARAMS * t + 2 * serving.LM_HEAD_PARAMS * s) / 700e12) for t, s in steps)
    assert e2e["alpha_ms"] == pytest.approx((fa2_run - 6.5 - gemm) / 200 * 1e3)
    assert "error" in serving.end_to_end(rows[1:], {("bf16", "16"): steps}, ceilings, {"num_requests": 1000})


def test_the_table_renders(capsys):
    rows = [_row("fa2", "16", 4.0, 3.0, 2.5), _row("fa3", "16", 2.0, 2.0, 1.5)]
    serving.ratios(rows)
    result = {"rows": rows, "workload": {"num_requests": 1000}, "settings": {"layers": 4},
              "schedules": {"bf16@16": {"steps": 5, "prefill_steps": 2, "decode_steps": 3, "mean_decode_batch": 300.0,
                                        "preemptions": 0, "kv_tokens": 1000}},
              "absent": {"fa4": "not in this wheel"}, "winners": serving.winners(rows),
              "end_to_end": serving.end_to_end(rows, {("bf16", "16"): [(100, 1)] * 5},
                                               {"copy_gbs": 4000.0, "bf16_matmul_tflops": 700.0},
                                               {"num_requests": 1000}), "elapsed_s": 1.0}
    serving.print_results(result, plain=True)
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("FA3 bf16"))
    assert "1.857x" in line and "0.20 %" in line  # FA2 6.5 s over FA3 3.5 s, graphed
    assert "fa4 absent: not in this wheel" in out and "FA3/FA2 end to end: model" in out


@pytest.mark.parametrize("argv", [["--help"], ["--dry-run", "--quick"]])
def test_runs_without_a_gpu(argv):
    result = subprocess.run([sys.executable, str(BENCH / "serving.py"), *argv], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert ("usage:" in result.stdout) if argv == ["--help"] else ("schedule bf16 page 16: 153 steps" in result.stdout)


def test_quick_and_bad_arguments():
    args = serving.parse_args(["--quick"])
    assert (args.num_requests, args.layers, args.reps, args.pages) == (200, 1, 1, ["16"])
    with pytest.raises(SystemExit):
        serving.parse_args(["--layers", "0"])
    with pytest.raises(SystemExit):
        serving.parse_args(["--max-capture-size", "1024"])


# --- the whole run on the CPU: fake ops, CUDA's timing and graphs stood in for ------------------

class _FakeGraph:
    captured: list = []

    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1


class _Capture:
    def __init__(self, graph, pool=None):
        self.graph = graph

    def __enter__(self):
        _FakeGraph.captured.append(self.graph)

    def __exit__(self, *exc):
        return False


def test_the_whole_run_on_the_cpu(describe, fake_ops, monkeypatch, tmp_path, capsys):
    """run() end to end with tiny requests: every row of both page sizes replays every step
    through the package (fake ops), decode steps through the graph path, and the result is
    written and printed. Catches what only the GPU run would otherwise find (names, shapes,
    bookkeeping), not the timing itself (stood in for)."""
    import contextlib
    import json
    import types

    import torch

    describe(caps=(HOPPER,))
    monkeypatch.setattr(serving, "DEVICE", "cpu")
    enqueued = []

    def timed(enqueue, reps, spin=None):
        enqueue()
        enqueued.append(enqueue)
        return 1e-3, 1e-4, True

    monkeypatch.setattr(serving, "_timed", timed)
    monkeypatch.setattr(serving.common, "time_first_call", lambda fn: (fn(), 0.5)[1])
    monkeypatch.setattr(serving.common, "measure_ceilings",
                        lambda **kw: {"copy_gbs": 4000.0, "bf16_matmul_tflops": 700.0})
    monkeypatch.setattr(serving.common, "machine_info", lambda: {"gpu": "none"})
    stream = types.SimpleNamespace(wait_stream=lambda other: None)
    for name, value in (("graph_pool_handle", lambda: None), ("Stream", lambda: stream),
                        ("stream", lambda s: contextlib.nullcontext()), ("current_stream", lambda: stream),
                        ("CUDAGraph", _FakeGraph), ("graph", _Capture), ("synchronize", lambda: None),
                        ("empty_cache", lambda: None)):
        monkeypatch.setattr(torch.cuda, name, value)
    _FakeGraph.captured = []
    args = serving.parse_args(["--num-requests", "6", "--prompt", "48", "--output", "3", "--kv-tokens", "4000",
                               "--layers", "2", "--reps", "1", "--max-capture-size", "8", "--out", str(tmp_path),
                               "--gpu-memory-bytes", str(sched.H200_BYTES)])
    result = serving.run(args)
    rows = {(r["variant"], r["block_size"]): r for r in result["rows"]}
    assert set(rows) == {(v, page) for v in ("fa2", "fa3", "fa3_fp8", "fa3_fp8_same") for page in (16, 128)}
    assert "fa4" in result["absent"]
    for r in result["rows"]:
        assert r["status"] == "ok", r
        assert r["phases"]["prefill"]["steps"] and r["phases"]["decode_graph"]["steps"] == r["phases"]["decode_eager"]["steps"]
        assert r["captures"] >= 1 and r["totals"]["graphed_s"] > 0
        assert {e["mode"] for e in r["errors"]} == {"eager", "graph"}
        if "fp8" in r["variant"]:
            assert all("rel_l2_vs_bf16_values" in e for e in r["errors"])
        # every timing stands at 1 ms: the layers (2 replayed) count 32 / 2 = 16 times; FA3's
        # metadata (1 ms, in the step's 1 ms here) once per step, its layers then at 0 ms
        steps = r["phases"]["prefill"]["steps"] + r["phases"]["decode_eager"]["steps"]
        per_step = 1e-3 if r["variant"].startswith("fa3") else 16e-3
        assert r["totals"]["eager_s"] == pytest.approx(per_step * steps)
    graphs_replayed = sum(g.replays for g in _FakeGraph.captured)
    assert graphs_replayed == sum(r["phases"]["decode_graph"]["steps"] for r in result["rows"])
    assert result["end_to_end"]["rows"]["fa2@16"]["req_s"] == pytest.approx(serving.SEED["fa2_req_s"])
    path = serving.common.write_json(tmp_path / "serving.json", result)
    assert json.loads(path.read_text())["rows"][0]["phases"]["prefill"]["steps"] > 0
    serving.print_results(result, plain=True)
    assert "Serving replay" in capsys.readouterr().out


def test_the_markdown_table_for_the_docs(tmp_path, capsys):
    rows = [_row("fa2", "16", 4.0, 3.0, 2.5), _row("fa3", "16", 2.0, 2.0, 1.5),
            dict(_row("fa4", "16", 1.0, 1.0, 1.0), status="error", note="boom")]
    serving.ratios(rows)
    run = tmp_path / "serving.json"
    run.write_text(__import__("json").dumps({"rows": rows}))
    assert serving.main(["--markdown", str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == "| FA2 | 16 | 4.000 | 3.000 | 2.500 | 7.000 | 6.500 | - | 0.20 % |"
    assert lines[3] == "| FA3 bf16 | 16 | 2.000 | 2.000 | 1.500 | 4.000 | 3.500 | 1.857× | 0.20 % |"
    assert lines[4].startswith("| FA4 bf16 | 16 | error: boom")
    # The speed-ups, recomputed from the phases (not the JSON's stored ratios: a run's FP8 row
    # stored the graphed decode without its ungraphed steps), and nothing for the failed row.
    fp8 = _row("fa3_fp8_same", "16", 1.0, 1.5, 0.5, ungraphed_s=1.0)
    fp8["vs_fa3_bf16"] = {"decode_graph": 3.0}  # what such a run stored
    run.write_text(__import__("json").dumps({"rows": rows + [fp8]}))
    assert serving.main(["--markdown", str(run)]) == 0
    out = capsys.readouterr().out
    assert "| 16 | FA3 bf16 / FA2 | 2.000× | 1.500× | 1.667× | 1.750× | 1.857× |" in out
    assert "| 16 | FA3 FP8 KV / FA3 bf16, bf16 steps | 2.000× | 1.333× | 1.000× |" in out
    assert "FA4 / FA2" not in out


def test_what_a_row_does_differently_is_read_from_its_familys_declaration():
    """A row's calls pass scheduler metadata when its family declares it, and are loaded before
    timing when its kernels are CuTe DSL Python: the benchmark names no family version."""
    rows = {v.name: (v.scheduler_metadata, v.compiles_at_first_use) for v in serving.VARIANTS}
    assert rows == {"fa2": (False, False), "fa3": (True, False), "fa3_fp8": (True, False),
                    "fa3_fp8_same": (True, False), "fa4": (False, True)}
