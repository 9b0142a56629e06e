"""benchmarks/overhead.py against upstream's own wrappers, on the CPU: how upstream's file is
had (its pinned git blob checked before it runs), how it is loaded over this wheel's ops, and
the isolated side-by-side with fake ops, a synthetic stand-in for upstream's wrapper (tests
never read the real one: it is not in this repository) and a stand-in for FA4's cute interface."""

from __future__ import annotations

import types

import pytest
import torch

from runtime_fakes import FA4_RECORD, HOPPER, make_build
from test_benchmarks_cpu import load

overhead = load("overhead")
upstream_interface = load("upstream_interface")

# Upstream's structure, in small: the relative import of the compiled module, the FA4 probe
# through flash_attn, and the op calls through torch.ops._vllm_fa*_C in the schemas' order.
SYNTHETIC = b'''
import torch
try:
    from . import _vllm_fa3_C  # noqa: F401
    FA3_AVAILABLE = True
except ImportError:
    FA3_AVAILABLE = False
try:
    from flash_attn.cute.interface import _flash_attn_fwd  # noqa: F401
    FA4_AVAILABLE = True
except ImportError:
    FA4_AVAILABLE = False


def flash_attn_varlen_func(q, k, v, max_seqlen_q, cu_seqlens_q, max_seqlen_k, cu_seqlens_k=None, seqused_k=None,
                           block_table=None, causal=False, fa_version=2, softmax_scale=None, **kw):
    softmax_scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    if fa_version == 2:
        out, lse = torch.ops._vllm_fa2_C.varlen_fwd(
            q, k, v, None, cu_seqlens_q, torch.empty_like(cu_seqlens_q), seqused_k, None, block_table, None,
            max_seqlen_q, max_seqlen_k, 0.0, softmax_scale, False, causal, -1, -1, 0.0, False, 0, None)
    else:
        out, lse, _, _ = torch.ops._vllm_fa3_C.fwd(
            q, k, v, None, None, None, None, cu_seqlens_q, cu_seqlens_k, None, None, seqused_k, max_seqlen_q,
            max_seqlen_k, block_table, None, None, None, None, None, None, None, None, softmax_scale, causal,
            -1, -1, 0.0, True, None, 0, None, 0, None, 1, 0, None)
    return out
'''

CUTE = '''
calls = []


def _flash_attn_fwd(q, k, v, **kwargs):
    calls.append(kwargs)
    return kwargs["out"] if kwargs.get("out") is not None else q.new_zeros(q.shape), None, None, None


def flash_attn_varlen_func(q, k, v, cu_seqlens_q=None, max_seqlen_q=None, max_seqlen_k=None, seqused_k=None,
                           page_table=None, causal=False, **kw):
    out, lse, _, _ = _flash_attn_fwd(q, k, v, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k,
                                     max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                     page_table=page_table, causal=causal)
    return out
'''


def test_the_pinned_blob_is_checked_before_anything_runs(tmp_path):
    path = tmp_path / "flash_attn_interface.py"
    path.write_bytes(SYNTHETIC)
    with pytest.raises(upstream_interface.UpstreamFileError, match="not the pinned file, not run"):
        upstream_interface.read_source(path)
    data, info = upstream_interface.read_source(path, allow_other=True)
    assert data == SYNTHETIC and info["matches_pin"] is False
    assert info["blob"] == upstream_interface.git_blob_hash(SYNTHETIC)
    with pytest.raises(upstream_interface.UpstreamFileError, match=r"git -C .* show 617264c1.*:vllm_flash_attn/"):
        upstream_interface.read_source(tmp_path / "missing.py")


def test_git_blob_hash_is_gits():
    # `printf 'hello\n' | git hash-object --stdin`
    assert upstream_interface.git_blob_hash(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_the_file_loads_over_this_wheels_ops_and_imports_no_flash_attn(fake_ops):
    module = upstream_interface.load(SYNTHETIC)
    assert module.FA4_AVAILABLE is False  # flash_attn made unimportable while it loaded
    import sys

    assert "flash_attn" not in sys.modules
    with upstream_interface.op_aliases():
        assert torch.ops._vllm_fa3_C is torch.ops._vendored_fa3_C
        with pytest.raises(upstream_interface.UpstreamFileError, match="already has _vllm_fa2_C, _vllm_fa3_C"):
            with upstream_interface.op_aliases():
                pass
    assert "_vllm_fa3_C" not in vars(torch.ops)


@pytest.fixture
def cute(monkeypatch):
    from vendored_flash_attn.families.fa4 import adapter as fa4

    module = types.ModuleType("fake_cute_interface")
    exec(CUTE, module.__dict__)  # noqa: S102
    monkeypatch.setattr(fa4, "_loaded", fa4.Loaded(module, {}))
    return module


def test_side_by_side_isolated(describe, fake_ops, cute):
    """Every variant runs against a stub; what the stubs recorded is this package's own op
    call (the raw variants replay it); everything real is back afterwards."""
    from vendored_flash_attn import flash_attn_varlen_func, interface

    describe(caps=(HOPPER,), build=make_build("minimal", fa4=FA4_RECORD))
    inp = overhead.DecodeInputs(4, [40, 16, 33, 64], device="cpu")
    kwargs = overhead.call_kwargs(inp)
    with upstream_interface.op_aliases():
        upstream = upstream_interface.load(SYNTHETIC)
        result = overhead.side_by_side(inp.q, inp.k, inp.v, kwargs, upstream, cute, [3, None, 2, 4],
                                       rounds=2, calls=3)
    assert set(result["isolated"]) == set(overhead.SIDE_LABELS)
    assert all(r["samples"] == 2 and r["median_us"] > 0 for r in result["isolated"].values())
    families = [r["family"] for r in result["isolated_overhead"]]
    assert families == ["FA3", "FA3 (selector)", "FA3 (selector, keyword call)", "FA2", "FA4"]
    assert all("ours_minus_upstream_us" in r for r in result["isolated_overhead"])
    # the real ops are back: this package's next call reaches the fake op, FA4 the real stand-in
    fake_ops.calls.clear()
    flash_attn_varlen_func(inp.q, inp.k, inp.v, fa_version=3, **kwargs)
    assert [n for n, _ in fake_ops.calls] == ["fwd"]
    assert all(getattr(entry.op, "__name__", None) != "stub" for entry in interface._resolved.values())
    before = len(cute.calls)
    flash_attn_varlen_func(inp.q, inp.k, inp.v, fa_version=4, **kwargs)
    assert len(cute.calls) == before + 1 and cute.calls[-1]["page_table"] is inp.block_table
    assert "_vllm_fa3_C" not in vars(torch.ops)


def test_side_by_side_rows_and_goals():
    medians = {"a_interface_fa3": 44.0, "b_interface_selector": 45.0, "u3_upstream_fa3": 46.0, "c_raw_fa3": 40.0,
               "a2_interface_fa2": 70.0, "u2_upstream_fa2": 69.0, "c2_raw_fa2": 65.0,
               "a4_interface_fa4": 95.0, "c4_raw_fa4": 60.0}
    rows = {r["family"]: r for r in overhead.side_by_side_rows(medians)}
    assert rows["FA3"]["ours_us"] == pytest.approx(4.0) and rows["FA3"]["goal_not_above_upstream"] == "PASS"
    assert rows["FA3 (selector)"]["goal_selector"] == "FAIL"  # 5 us over the raw op, goal 3
    assert rows["FA2"]["goal_not_above_upstream"] == "FAIL" and rows["FA2"]["ours_minus_upstream_us"] == pytest.approx(1.0)
    assert rows["FA4"]["ours_us"] == pytest.approx(35.0) and "upstream_us" not in rows["FA4"]


def test_cpu_mode_times_every_family_with_fake_ops(tmp_path, monkeypatch):
    """--cpu: the isolated side-by-side on a machine without a GPU, FA4 included; an upstream
    file that is not the pinned one is not run, and the package's rows are timed regardless."""
    import json

    from vendored_flash_attn.families.fa4 import adapter as fa4

    monkeypatch.setattr(fa4, "_loaded", None)
    wrong = tmp_path / "flash_attn_interface.py"
    wrong.write_bytes(SYNTHETIC)
    rc = overhead.main(["--cpu", "--out", str(tmp_path), "--num-seqs", "4", "--isolated-rounds", "2",
                        "--isolated-calls", "8", "--upstream-file", str(wrong), "--plain"])
    assert rc == 0
    section = json.loads((tmp_path / "overhead-cpu.json").read_text())["modes"]["upstream"]
    assert set(section["isolated"]) == {"a_interface_fa3", "b_interface_selector", "b_interface_selector_keywords",
                                        "c_raw_fa3", "a2_interface_fa2", "c2_raw_fa2", "c2u_raw_fa2_upstream_args",
                                        "a4_interface_fa4", "c4_raw_fa4"}
    assert [r["family"] for r in section["isolated_overhead"]] == ["FA3", "FA3 (selector)",
                                                                   "FA3 (selector, keyword call)", "FA2", "FA4"]
    assert "not the pinned file, not run" in section["upstream_error"]
    assert "stand-in" in section["cpu"] and "stalled" not in section
    assert section["full_path_calls"] == 0  # what is timed is the quick path, FA4's included


def test_runs_are_summarized_as_medians_with_their_spread(tmp_path, capsys):
    """--summarize: several runs' side-by-side rows read together, per mode and family: the
    median of the runs with their min and max; a goal is met by the median, and a range that
    crosses the bar is called within noise."""
    import json

    def run(ours, theirs, selector):
        rows = [{"family": "FA3", "ours_us": ours, "upstream_us": theirs, "ours_minus_upstream_us": ours - theirs},
                {"family": "FA3 (selector)", "ours_us": selector, "upstream_us": theirs,
                 "ours_minus_upstream_us": selector - theirs, "goal_selector_us": 3.0}]
        return {"modes": {"upstream": {"isolated_overhead": rows, "stalled_overhead": rows[:1]}}}

    paths = []
    for i, (ours, theirs, selector) in enumerate(((4.0, 5.0, 2.5), (4.2, 4.0, 2.9), (9.0, 4.5, 3.4),
                                                   (4.1, 4.6, 2.8), (4.3, 4.4, 2.7))):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(run(ours, theirs, selector)), encoding="utf-8")
    assert overhead.main(["--summarize", *map(str, paths), "--out", str(tmp_path), "--plain"]) == 0
    summary = json.loads((tmp_path / "overhead-runs.json").read_text(encoding="utf-8"))
    fa3, selector, stalled = summary["rows"]
    assert (fa3["mode"], fa3["family"], fa3["runs"], stalled["mode"]) == ("isolated", "FA3", 5, "stalled")
    assert fa3["ours_us"] == {"median": 4.2, "min": 4.0, "max": 9.0}
    assert fa3["ours_minus_upstream_us"]["median"] == pytest.approx(-0.1)
    assert fa3["goal_not_above_upstream"].startswith("PASS (within noise")
    assert selector["goal_selector"] == "PASS (within noise: the runs range from +2.50 to +3.40)"
    assert "median [min, max] of 5 runs" in capsys.readouterr().out


def test_the_keyword_call_is_the_same_call(describe, fake_ops):
    """(b')/(u3') write call_kwargs out as keywords, as vLLM's backend calls: the op receives
    exactly what the **kwargs call (b) gives it, and a keyword the writer does not know is refused
    rather than dropped."""
    from vendored_flash_attn import flash_attn_varlen_func

    describe(caps=(HOPPER,), build=make_build("minimal"))
    inp = overhead.DecodeInputs(4, [40, 16, 33, 64], device="cpu")
    kwargs = overhead.call_kwargs(inp)
    flash_attn_varlen_func(inp.q, inp.k, inp.v, fa_version=None, **kwargs)
    overhead.keyword_call(flash_attn_varlen_func, inp.q, inp.k, inp.v, kwargs, None)()
    (name_a, harness), (name_b, keywords) = fake_ops.calls[-2:]
    assert name_a == name_b == "fwd"
    assert all(harness[n] is keywords[n] if isinstance(harness[n], torch.Tensor) else harness[n] == keywords[n]
               for n in harness)
    with pytest.raises(ValueError, match="softcap"):
        overhead.keyword_call(flash_attn_varlen_func, inp.q, inp.k, inp.v, {**kwargs, "softcap": 1.0}, None)


def test_the_keyword_row_is_held_to_the_selector_goal():
    medians = {"b_interface_selector": 45.0, "b_interface_selector_keywords": 42.5, "u3_upstream_fa3_keywords": 44.0,
               "c_raw_fa3": 40.0}
    rows = {r["family"]: r for r in overhead.side_by_side_rows(medians)}
    keyword = rows["FA3 (selector, keyword call)"]
    assert keyword["ours_us"] == pytest.approx(2.5) and keyword["goal_selector"] == "PASS"
    assert keyword["ours_minus_upstream_us"] == pytest.approx(-1.5)


def test_compare_reads_minima_over_raw_and_the_trees_difference():
    """overhead_compare.summarize: each tree's minimum over the rounds minus its raw row's
    minimum (a loaded machine only slows a sample, so one slow round moves nothing); the
    metadata reads and raw rows as they are; after - before of those minima."""
    compare = load("overhead_compare")

    def sample(none, raw, reads=2.0):
        return {"none_harness": none, "raw_fa3": raw, "metadata_reads": reads}

    before = [sample(5.0, 0.3), sample(9.0, 0.25), sample(5.2, 0.4)]
    after = [sample(4.5, 0.3), sample(4.4, 0.2), sample(30.0, 0.2, reads=1.5)]
    rows = compare.summarize({"before": {"isolated": before, "polluted": []},
                              "after": {"isolated": after, "polluted": []}})["isolated"]
    assert rows["none_harness"]["before"] == pytest.approx(5.0 - 0.25)
    assert rows["none_harness"]["after"] == pytest.approx(4.4 - 0.2)
    assert rows["none_harness"]["after_minus_before"] == pytest.approx(4.2 - 4.75)
    assert rows["metadata_reads"]["after"] == pytest.approx(1.5) and rows["raw_fa3"]["before"] == pytest.approx(0.25)
    assert "fa2" not in rows  # a row no sample has is left out


def test_compare_runs_two_trees(tmp_path):
    """The whole tool, one round of two calls: HEAD's package against the working tree, each in
    its own process; every row of both modes measured, every timed call on the quick path."""
    import json

    compare = load("overhead_compare")
    assert compare.main(["--before", "HEAD", "--rounds", "1", "--calls", "2", "--out", str(tmp_path),
                         "--plain"]) == 0
    result = json.loads((tmp_path / "overhead-compare.json").read_text(encoding="utf-8"))
    for mode in ("isolated", "polluted"):
        rows = result["modes"][mode]
        assert {"none_harness", "none_keywords", "fa3", "fa2", "metadata_reads"} <= set(rows)
        assert all("after_minus_before" in row for row in rows.values())
    assert result["full_path_calls"] == {"before": 0, "after": 0}


def test_the_fa2_op_with_upstreams_cu_seqlens_k(describe, fake_ops):
    """(c2u): this package's FA2 op call for a paged cache with cu_seqlens_k a tensor of its own
    (equal values, not cu_seqlens_q itself), every other argument the very object this package
    passed; a call that passes its own cu_seqlens_k has no such row."""
    from vendored_flash_attn import flash_attn_varlen_func

    describe(caps=(HOPPER,), build=make_build("minimal"))
    inp = overhead.DecodeInputs(4, [40, 16, 33, 64], device="cpu")
    flash_attn_varlen_func(inp.q, inp.k, inp.v, fa_version=2, **overhead.call_kwargs(inp))
    name, passed = fake_ops.calls[-1]
    ours = tuple(passed.values())
    theirs = overhead.upstream_fa2_args(ours)
    assert name == "varlen_fwd" and list(passed)[4:6] == ["cu_seqlens_q", "cu_seqlens_k"]
    assert theirs[5] is not inp.cu_seqlens_q and torch.equal(theirs[5], inp.cu_seqlens_q)
    assert all(a is b for i, (a, b) in enumerate(zip(ours, theirs)) if i != 5) and len(theirs) == len(ours)
    assert overhead.upstream_fa2_args(ours[:5] + (inp.cu_seqlens_q.clone(),) + ours[6:]) is None
