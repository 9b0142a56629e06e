"""CPU checks of the benchmark scripts' pure helpers: FLOP/byte counting, the build-time
projection model, ninja-log and sccache-statistics parsing, and that every script's
--help works without a GPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SCRIPTS = ("kernels", "overhead", "first_call", "import_time", "fp8_accuracy", "build", "launcher_overhead", "serving",
           "build_estimate", "kernels_pair", "wheel_compare", "configure_compare")


def load(name: str):
    """Import benchmarks/<name>.py under a private module name (no clash with PyPI names)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"vfa_bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


common = load("common")
build = load("build")


# --- FLOPs and bytes -------------------------------------------------------------------

def brute_causal_pairs(lq: int, lk: int) -> int:
    return sum(1 for i in range(lq) for j in range(lk) if j <= lk - lq + i)


@pytest.mark.parametrize("lq,lk", [(1, 1), (4, 4), (1, 10), (3, 10), (10, 3), (7, 7), (16, 40), (0, 5)])
def test_causal_pairs_match_brute_force(lq, lk):
    assert common.causal_pairs(lq, lk) == brute_causal_pairs(lq, lk)


def test_flops_conventions():
    h, d = 32, 128
    # docs/anchors.md convention: 4 * b * s^2 * h * d, halved for causal
    assert common.attention_flops([2048] * 8, [2048] * 8, h, d, False, "half") == 4 * 8 * 2048**2 * h * d
    assert common.attention_flops([2048] * 8, [2048] * 8, h, d, True, "half") == 2 * 8 * 2048**2 * h * d
    # exact causal pairs: s(s+1)/2 per sequence
    assert common.attention_flops([2048] * 8, [2048] * 8, h, d, True) == 4 * 8 * (2048 * 2049 // 2) * h * d
    # decode: one query sees its whole context
    ctx = common.seed_decode_context_lengths(256)
    assert common.attention_flops([1] * 256, ctx, h, d, True) == 4 * sum(ctx) * h * d
    with pytest.raises(ValueError):
        common.attention_flops([1], [1], h, d, True, "bogus")


def test_seed_decode_contexts_spread_uniformly():
    ctx = common.seed_decode_context_lengths(256)
    assert len(ctx) == 256 and min(ctx) == 2048 and max(ctx) == 2175
    assert all(ctx.count(c) == 2 for c in range(2048, 2176))


def test_decode_bytes_count_kv_once_plus_q_and_out():
    # 64 x ctx 4096, 8 KV heads, d 128, bf16: the anchor's ~1.07 GB of K/V
    b = common.decode_bytes([4096] * 64, 32, 8, 128, kv_elem=2, q_elem=2)
    kv = 2 * 64 * 4096 * 8 * 128 * 2
    assert b == kv + 64 * 32 * 128 * 4
    fp8 = common.decode_bytes([4096] * 64, 32, 8, 128, kv_elem=1, q_elem=1)
    assert fp8 == kv // 2 + 64 * 32 * 128 * 3


def test_kernel_cases_and_filter():
    kernels = load("kernels")
    names = [c.name for c in kernels.all_cases()]
    assert {"paged_prefill_seed", "paged_decode_seed", "paged_decode_64x4k", "varlen_2k_full",
            "varlen_8k_causal"} <= set(names)
    seed = next(c for c in kernels.all_cases() if c.name == "paged_prefill_seed")
    assert sum(seed.q_lens) == common.SEED_BATCH_TOKENS and seed.causal
    assert "sdpa" not in seed.impls  # SDPA only on the varlen cases
    assert common.matches_filter("paged_decode_seed", ["decode"])
    assert common.matches_filter("varlen_2k_full", ["varlen_*_full"])
    assert not common.matches_filter("varlen_2k_full", ["paged"])
    assert common.matches_filter("anything", None)


def test_quantile_and_verdicts():
    assert common.quantile([1, 2, 3, 4, 5], 0.5) == 3
    assert common.quantile([1, 2], 0.5) == 1.5
    assert common.bar_verdict(1.8, 1.7) == "PASS"
    assert common.bar_verdict(1.6, 1.7) == "FAIL"
    assert common.bar_verdict(4.0, 5.0, higher_is_better=False) == "PASS"
    assert common.bar_verdict(None, 5.0) == "n/a"


def test_input_sets_rotate_only_small_inputs():
    l2 = 60 * 2**20
    assert common.input_sets_for(2 * 2**30, l2) == 1
    assert common.input_sets_for(10 * 2**20, l2) == 8  # capped
    assert common.input_sets_for(50 * 2**20, l2) == 3


# --- ninja log ---------------------------------------------------------------------------

NINJA_LOG = """# ninja log v7
0\t1000\t0\tCMakeFiles/_vendored_fa3_C.dir/src/hopper/flash_api.cpp.o\tabc
5\t200000\t0\tCMakeFiles/_vendored_fa3_C.dir/src/hopper/instantiations/flash_fwd_hdim128_bf16_paged_sm90.cu.o\tdef
5\t240000\t0\tCMakeFiles/_vendored_fa3_C.dir/src/hopper/instantiations/flash_fwd_hdim128_e4m3_sm90.cu.o\tdef
10\t60000\t0\tCMakeFiles/_vendored_fa3_C.dir/src/hopper/flash_fwd_combine.cu.o\tx
10\t150000\t0\tCMakeFiles/_vendored_fa2_C.dir/src/csrc/flash_attn/src/flash_fwd_hdim128_bf16_sm80.cu.o\ty
20\t30000\t0\tCMakeFiles/_vendored_fa2_C.dir/cache/generated/fa2_missing_kernels_0123.cpp.o\tz
240000\t250000\t0\t_vendored_fa3_C.abi3.so\tq
"""


def test_parse_ninja_log_and_classes():
    entries = build.parse_ninja_log(NINJA_LOG)
    assert len(entries) == 7
    stats = build.unit_stats(entries)
    classes = stats["classes"]
    assert classes["fa3_instantiation"]["count"] == 2
    assert classes["fa3_instantiation"]["mean_s"] == pytest.approx((199.995 + 239.995) / 2)
    assert classes["fa3_cpp"]["count"] == 1 and classes["fa3_cuda_other"]["count"] == 1
    assert classes["fa2_instantiation"]["count"] == 1 and classes["fa2_stubs"]["count"] == 1
    assert classes["fa3_link"]["max_s"] == pytest.approx(10.0)
    assert stats["span_s"] == pytest.approx(250.0)
    assert stats["units"][0]["seconds"] == pytest.approx(239.995)  # longest first


def test_ninja_log_keeps_the_last_session_and_last_entry():
    text = ("# ninja log v5\n"
            "0\t100\t0\ta.cu.o\th\n0\t500\t0\tb.cu.o\th\n"      # session 1
            "0\t50\t0\ta.cu.o\th\n0\t70\t0\tc.cu.o\th\n")        # session 2 (end time drops)
    last = build.parse_ninja_log(text, session="last")
    assert sorted(e.output for e in last) == ["a.cu.o", "c.cu.o"]
    assert next(e for e in last if e.output == "a.cu.o").end_ms == 50
    every = build.parse_ninja_log(text, session="all")
    assert sorted(e.output for e in every) == ["a.cu.o", "b.cu.o", "c.cu.o"]
    assert next(e for e in every if e.output == "a.cu.o").end_ms == 50  # last one wins


# --- sccache statistics ---------------------------------------------------------------

def test_sccache_rates_all_and_inner_rows():
    stats = {"stats": {"compile_requests": 12,
                       "cache_hits": {"counts": {"C/C++": 4, "CUDA (Device code)": 8, "PTX": 8, "CUBIN": 8}},
                       "cache_misses": {"counts": {"CUDA": 8}},
                       "cache_errors": {"counts": {}}},
             "version": "0.16.0"}
    r = build.parse_sccache_stats(json.dumps(stats))
    assert r["inner"]["hits"] == 24 and r["inner"]["misses"] == 0 and r["inner"]["rate"] == 1.0
    assert r["outer_cuda"]["rate"] == 0.0  # the outer row can read 0% while everything hit
    assert r["all"]["hits"] == 28 and r["all"]["misses"] == 8
    assert r["all"]["rate"] == pytest.approx(28 / 36)
    assert r["host"]["rate"] == 1.0
    empty = build.parse_sccache_stats({"stats": {"cache_hits": {"counts": {}}, "cache_misses": {"counts": {}}}})
    assert empty["all"]["rate"] is None


# --- projection model ---------------------------------------------------------------------

def test_lpt_makespan():
    assert build.lpt_makespan([3, 3, 2, 2, 2], 2) == 7  # LPT, not the optimum (6)
    assert build.lpt_makespan([4, 3, 3, 2], 2) == 6
    assert build.lpt_makespan([5], 4) == 5
    assert build.lpt_makespan([1] * 10, 3) == 4
    assert build.lpt_makespan([], 2) == 0.0


def test_projection_of_the_full_preset():
    costs = {"fa3_instantiation": 240.0, "fa3_cuda_other": 60.0, "fa3_cpp": 60.0,
             "fa2_instantiation": 180.0, "fa2_cpp": 50.0}
    rows = build.project_build(costs, build.FULL_PRESET_UNITS, [16, 1000], link_s=10.0)
    units = sum(build.FULL_PRESET_UNITS.values())
    assert units == 190 + 2 + 2 + 76 + 3
    total = 190 * 240 + 2 * 60 + 2 * 60 + 76 * 180 + 3 * 50
    r16 = rows[0]
    assert r16["units"] == units
    assert r16["lower_bound_s"] == pytest.approx(total / 16 + 10)
    assert r16["lower_bound_s"] <= r16["lpt_s"] <= r16["lower_bound_s"] + 240
    mean = total / units
    assert r16["homogeneous_s"] == pytest.approx(18 * mean + 10)  # ceil(273 / 16) = 18
    assert rows[1]["lpt_s"] == pytest.approx(240 + 10)  # one unit per worker: the longest unit


def test_class_costs_fill_missing_classes():
    classes = {"fa3_instantiation": {"count": 8, "mean_s": 200.0}, "fa2_cpp": {"count": 3, "mean_s": 40.0},
               "fa2_instantiation": {"count": 6, "mean_s": 150.0}}
    costs = build.class_costs(classes)
    assert costs["fa3_cpp"] == 40.0 and costs["fa3_cuda_other"] == 40.0


def test_time_log_and_unit_keys():
    log = "obj/a.cu.o\t12.5 4404000\nbad line\nobj/b.cpp.o\t3.0 1024\n"
    parsed = build.parse_time_log(log)
    assert parsed["obj/a.cu.o"]["wall_s"] == 12.5
    assert parsed["obj/b.cpp.o"]["max_rss_mb"] == pytest.approx(1.0)
    key = build.unit_key_from_cmdline
    assert key(["nvcc", "-c", "/x/hopper/instantiations/flash_fwd_hdim128_bf16_sm90.cu", "-o", "y.cu.o"]) \
        == "flash_fwd_hdim128_bf16_sm90"
    assert key(["cicc", "/tmp/tmpxft_0001a2b3_00000000-6_flash_fwd_hdim128_bf16_sm90.cpp1.ii"]) \
        == "flash_fwd_hdim128_bf16_sm90"
    assert key(["ptxas", "-arch=sm_90a", "/tmp/x/flash_api.ptx"]) == "flash_api"
    assert key(["ld", "-o", "lib.so"]) == "(link lib.so)"
    assert key(["c++", "-shared", "a/flash_fwd_x.cu.o", "-o", "_vendored_fa3_C.abi3.so"]) == \
        "(link _vendored_fa3_C.abi3.so)"
    assert key(["as", "--64"]) is None


def test_two_level_tag_from_build_info():
    fp8 = load("fp8_accuracy")
    on = {"options": {"VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION": {"value": "ON", "origin": "default"}},
          "fa3": {"defines": ["FLASHATTENTION_DISABLE_BACKWARD"]}}
    off = {"options": {"VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION": {"value": "OFF", "origin": "cmake"}},
           "fa3": {"defines": ["FLASHATTENTION_DISABLE_FP8_TWO_LEVEL_ACCUMULATION"]}}
    assert fp8.two_level_tag(on) == "two_level_on"
    assert fp8.two_level_tag(off) == "two_level_off"
    assert fp8.two_level_tag({"error": "missing"}) == "two_level_unknown"


def brute_attention(q, k, v, q_lens, k_lens):
    """float64 causal GQA attention, one query row at a time."""
    import torch

    group = q.shape[1] // k.shape[1]
    rows, qo, ko = [], 0, 0
    for lq, lk in zip(q_lens, k_lens):
        kk = k[ko:ko + lk].float().double().repeat_interleave(group, dim=1)
        vv = v[ko:ko + lk].float().double().repeat_interleave(group, dim=1)
        for i in range(lq):
            seen = lk - lq + i + 1
            s = torch.einsum("hd,khd->hk", q[qo + i].float().double(), kk[:seen]) * q.shape[-1] ** -0.5
            rows.append(torch.einsum("hk,khd->hd", s.softmax(-1), vv[:seen]))
        qo, ko = qo + lq, ko + lk
    return torch.stack(rows)


def test_long_context_inputs_and_float64_reference():
    """The long-context FP8 cases: the paged cache holds exactly the packed values, V has
    the mean the case names, and the float64 reference (GQA without expanding K/V,
    chunked queries) equals attention computed row by row."""
    import torch

    fp8 = load("fp8_accuracy")
    q_lens, k_lens = (1, 2, 37), (40, 17, 45)
    x = fp8.long_context_inputs("v_mean", q_lens, k_lens, seed=3, device="cpu")
    page = fp8.LONG_CONTEXT_PAGE
    # FA4's FP8 KV cases use pages of the kernel's tile: the same values, other pages.
    x128 = fp8.long_context_inputs("v_mean", q_lens, k_lens, seed=3, device="cpu", page=128)
    assert x128["k_cache"].shape[1] == 128 and x128["block_table"].shape == (3, 1)
    assert torch.equal(x128["k"].view(torch.uint8), x["k"].view(torch.uint8))
    assert torch.equal(x128["k_cache"].view(torch.uint8)[x128["block_table"][2, 0].long(), :45],
                       x["k"][57:102].view(torch.uint8))
    start = 0
    for b, n in enumerate(k_lens):
        blocks = x["block_table"][b, :(n + page - 1) // page].long()
        for cache, packed in ((x["k_cache"], x["k"]), (x["v_cache"], x["v"])):
            got = cache.view(torch.uint8)[blocks].reshape(-1, *packed.shape[1:])[:n]
            assert torch.equal(got, packed[start:start + n].view(torch.uint8))
        start += n
    assert x["seqused_k"].tolist() == list(k_lens) and x["cu_seqlens_q"].tolist() == [0, 1, 3, 40]
    assert 0.4 < float(x["v"].float().mean()) < 0.6
    assert abs(float(fp8.long_context_inputs("gaussian", q_lens, k_lens, seed=3, device="cpu")["v"]
                     .float().mean())) < 0.1
    ref = fp8.reference64(x["q"], x["k"], x["v"], q_lens, k_lens, causal=True, chunk=16)
    assert ref.dtype == torch.float64
    assert torch.allclose(ref, brute_attention(x["q"], x["k"], x["v"], q_lens, k_lens), atol=1e-12)


def test_long_context_bar():
    fp8 = load("fp8_accuracy")
    assert fp8.long_context_bar(0.0032, 0.0018)         # the two-level-on figures
    assert not fp8.long_context_bar(0.012, 0.0018)      # 1.2 % at 8k with it off
    assert not fp8.long_context_bar(0.0045, 0.0010)     # under 0.5 % but > 3x bf16
    assert set(fp8.BAR_DISTRIBUTIONS) < set(fp8.V_DISTRIBUTIONS)
    assert "gaussian" not in fp8.BAR_DISTRIBUTIONS       # zero-mean V hides the effect
    assert max(k for _, ks, _ in fp8.LONG_CONTEXT_SHAPES.values() for k in ks) == 131072


def test_fp8_compare_shows_long_context_by_build(tmp_path, capsys):
    fp8 = load("fp8_accuracy")
    row = {"shape": "decode_4x128k", "distribution": "v_mean", "bf16_same_inputs": 0.0017}
    paths = []
    for tag, err in (("two_level_on", 0.0019), ("two_level_off", 0.20)):
        result = {"tag": tag, "accuracy": [], "speed": [],
                  "long_context": [dict(row, fp8_kernel=err, bar=fp8.long_context_bar(err, 0.0017))]}
        paths.append(tmp_path / f"{tag}.json")
        paths[-1].write_text(json.dumps(result))
    assert fp8.compare(paths, plain=True) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if "decode_4x128k" in l)
    assert "0.19 %" in line and "20.00 %" in line and "pass" in line and "FAIL" in line


def test_overhead_rows_against_the_bar():
    overhead = load("overhead")
    rows = overhead.overhead_rows({"a_interface_fa3": 30.0, "b_interface_selector": 37.0, "c_raw_fa3": 27.0})
    assert [r["verdict"] for r in rows] == ["PASS", "FAIL"]
    assert rows[0]["overhead_us"] == pytest.approx(3.0)


def test_summary_bars_of_the_build_experiment():
    builds = {"cold": {"wall_s": 240.0, "analysis": {"ninja": {"span_s": 220.0}, "jobs": 16}},
              "warm": {"wall_s": 9.0, "analysis": {"ninja": {"span_s": 4.0},
                                                   "sccache": build.parse_sccache_stats(
                                                       {"stats": {"cache_hits": {"counts": {"PTX": 19, "C/C++": 4}},
                                                                  "cache_misses": {"counts": {"CUDA": 1}}}})}}}
    s = build.summarise(builds)
    assert s["warm_over_cold"] == pytest.approx(9 / 240)
    assert [b["verdict"] for b in s["bars"]] == ["PASS", "PASS"]


def test_the_isolated_build_is_pips_default_and_is_summarised_beside_the_warm_one(tmp_path):
    plain = build.pip_wheel_command(tmp_path / "src", tmp_path / "b", tmp_path / "d", {"VFA_PRESET": "minimal"}, False)
    isolated = build.pip_wheel_command(tmp_path / "src", tmp_path / "b", tmp_path / "d", {"VFA_PRESET": "minimal"},
                                       True)
    assert "--no-build-isolation" in plain and "--no-build-isolation" not in isolated
    assert [a for a in plain if a != "--no-build-isolation"] == isolated

    def stats(hits, misses):
        return build.parse_sccache_stats({"stats": {"cache_hits": {"counts": {"PTX": hits}},
                                                    "cache_misses": {"counts": {"PTX": misses}}}})
    builds = {"cold": {"wall_s": 100.0, "analysis": {"ninja": {"span_s": 90.0}}},
              "warm": {"wall_s": 20.0, "analysis": {"ninja": {"span_s": 10.0}, "sccache": stats(70, 0)}},
              "warm-isolated": {"wall_s": 50.0, "isolated": True,
                                "analysis": {"ninja": {"span_s": 11.0}, "sccache": stats(69, 1)}}}
    s = build.summarise(builds)
    assert s["isolated_over_warm"] == pytest.approx(2.5)
    assert (s["warm_isolated_hits"], s["warm_isolated_misses"]) == (69, 1)
    assert build.build_row("x", builds["warm-isolated"])[2:] == ["isolated", "50", "11", "69 / 1"]
    assert build.build_row("x", builds["warm"])[2] == "--no-build-isolation"


def test_plain_table_renders():
    text = common.render_plain("T", ["a", "b", "c"], [["x", "y", "1.0"], ["long name", "z", "22.5"]], ["note"])
    lines = text.splitlines()
    assert lines[0] == "T" and lines[-1] == "note"
    assert lines[3].endswith(" 1.0") and lines[4].endswith("22.5")


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_works_without_a_gpu(script):
    result = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


def test_isolated_overhead_replays_the_interfaces_own_op_call(describe, fake_ops):
    """The isolated mode times the interface against a stub replaying the op call the
    interface made; that call must be the raw variant's argument list, and the real ops
    must be back afterwards."""
    overhead = load("overhead")
    from vendored_flash_attn import flash_attn_varlen_func, interface

    describe(build="minimal")
    inp = overhead.DecodeInputs(4, [40, 16, 33, 64], device="cpu")
    result = overhead.isolated(inp.q, inp.k, inp.v, overhead.call_kwargs(inp), [3, None, 2],
                               rounds=2, calls=3, raw_args=overhead.raw_op_args(inp))
    assert result["args_match"] == {2: True, 3: True}
    assert result["full_path_calls"] == 0  # the timed calls took the quick path
    assert "all took the quick path" in overhead.quick_path_note(0)
    assert "3 of this package's timed calls took the FULL path" in overhead.quick_path_note(3)
    assert set(result["rows"]) == {"a_interface_fa3", "b_interface_selector", "a2_interface_fa2",
                                   "c_raw_fa3", "c2_raw_fa2"}
    assert all(r["samples"] == 2 and r["median_us"] > 0 for r in result["rows"].values())
    assert [o["comparison"] for o in result["overhead"]] == [
        "fa_version=3 vs raw FA3 op", "fa_version=None vs raw FA3 op", "fa_version=2 vs raw FA2 op"]
    # The stub only ran inside the measurement: the fake ops saw the warm-up calls, and
    # see the next call again.
    fake_ops.calls.clear()
    flash_attn_varlen_func(inp.q, inp.k, inp.v, fa_version=3, **overhead.call_kwargs(inp))
    assert [name for name, _ in fake_ops.calls] == ["fwd"]
    assert not any(entry.op.__name__ == "stub" for entry in interface._resolved.values())


def test_isolated_overhead_notices_a_different_op_call():
    overhead = load("overhead")
    import torch

    t = torch.zeros(1)
    assert overhead._same_args((t, 1, None), (t, 1, None))
    assert not overhead._same_args((t, 1, None), (t.clone(), 1, None))  # another tensor
    assert not overhead._same_args((t, 1, None), (t, 1.0, None))        # another type
    assert not overhead._same_args((t, 1), (t, 1, None))


def test_build_estimate_reads_the_estimates_a_monitor_printed(tmp_path):
    """benchmarks/build_estimate.py log:FILE: the `about N min left` of each progress line
    against the build's length from its last line (the before-column of the estimate table)."""
    spec = importlib.util.spec_from_file_location("vfa_bench_build_estimate", BENCH / "build_estimate.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    log = tmp_path / "vfa-progress.log"
    log.write_text("[vfa 0:00] compiling 22 units, 2 at a time: about 25 min (from reference times). ...\n"
                   "[vfa 2:30] 3/22 compiled; running a.cu 1:00; about 20 min left\n"
                   "[vfa 5:00] compiled b.cu (FA3 CUDA) in 4:00 [5/22]; about 90 s left (from 5 finished units)\n"
                   "[vfa 10:00] 22/22 compiled in 10:00; 5 warnings\n")
    build = bench.from_log(log)
    assert build["seconds"] == 600
    points = {p["at"]: p for p in build["points"]}
    assert points[0.25] == {"at": 0.25, "t": 150, "estimated_left": 1200, "actual_left": 450,
                            "error": round(1200 / 450 - 1, 3)}
    assert points[0.5]["estimated_left"] == 90 and points[0.5]["actual_left"] == 300


def test_the_fp8_benchmark_measures_the_family_declaring_fp8():
    """fp8_accuracy.py's FA3 calls and its FA4 FP8 KV cases come from the declaration: the
    family with FP8 q/k/v (``fp8``) is measured by default; one with FP8 KV only gets a 16-bit q."""
    from vendored_flash_attn.declaration.families import registry

    fp8 = load("fp8_accuracy")
    assert fp8.fp8_version() == registry().having("fp8")[0].version
    assert [f.version for f in registry() if fp8.takes_fp8_qkv(f.version)] == [fp8.fp8_version()]
    assert not fp8.takes_fp8_qkv(registry().having("fp8_kv")[0].version)
