"""CPU checks of the build-progress scripts (cmake/vfa_build/progress/: compiler_output.py,
compile_unit.py, build_monitor.py, progress_estimate.py, ninja_processes.py): which compiler output
is upstream noise, the launcher's events and exit status, and the estimate of what is left of a build.
The same scripts run end to end in tests/build/test_build_monitor.py."""

from __future__ import annotations

# One file over 500 lines, on purpose: one concern, the build-progress scripts, whose cases share
# the loaders and fake events defined here.

import sys
from pathlib import Path

import pytest

from vfa_build.progress import build_monitor, progress_estimate
from vfa_build.units import compile_unit, compiler_output, ninja_processes

CMAKE_DIR = Path(__file__).resolve().parents[2] / "cmake"
BUILD_PY = str(CMAKE_DIR / "vfa_build")  # the build's entry point: BUILD_PY <module> [args]

CUTLASS = "/cache/src/cutlass-62750a2b75c8"
FA = "/cache/src/flash-attention-617264c1c795"
ROOTS = [CUTLASS, FA]

# What gcc printed for flash_api.cpp of the pinned upstream with CUDA 13 (first two of
# its five warnings; paths shortened), then an error of ours appended.
GCC_LONG4 = f"""\
In file included from {CUTLASS}/include/cutlass/integer_subbyte.h:47,
                 from {CUTLASS}/include/cutlass/numeric_types.h:40,
                 from {FA}/csrc/flash_attn/flash_api.cpp:32:
{CUTLASS}/include/cutlass/platform/platform.h:599:21: warning: \u2018long4\u2019 is deprecated: use long4_16a or long4_32a [-Wdeprecated-declarations]
  599 | struct alignment_of<long4> {{
      |                     ^~~~~
In file included from /usr/local/cuda-13.0/include/driver_types.h:61,
                 from /usr/local/cuda-13.0/include/builtin_types.h:59,
                 from {FA}/csrc/flash_attn/flash_api.cpp:15:
/usr/local/cuda-13.0/include/vector_types.h:532:98: note: declared here
  532 | typedef __device_builtin__ struct long4 __VECTOR_TYPE_DEPRECATED__("use long4_16a or long4_32a") long4;
      |                                                                                                  ^~~~~
{CUTLASS}/include/cutlass/platform/platform.h:603:21: warning: \u2018ulong4\u2019 is deprecated: use ulong4_16a or ulong4_32a [-Wdeprecated-declarations]
  603 | struct alignment_of<ulong4> {{
      |                     ^~~~~~
/usr/local/cuda-13.0/include/vector_types.h:533:101: note: declared here
  533 | typedef __device_builtin__ struct ulong4 __VECTOR_TYPE_DEPRECATED__("use ulong4_16a or ulong4_32a") ulong4;
      |                                                                                                     ^~~~~~
"""

# nvcc 13's cudafe++ (format as printed for a small file; paths made absolute).
CUDAFE = f"""\
{CUTLASS}/include/h.h(2): warning #177-D: variable "unused_in_upstream" was declared but never referenced
  __attribute__((device)) int f() {{ int unused_in_upstream; return 1; }}
                                        ^

Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

/build/generated/ours.cu(2): warning #177-D: variable "mine" was declared but never referenced
  __attribute__((global)) void k(int* p) {{ int mine; }}
                                               ^

"""


def test_upstream_warnings_and_their_notes_are_noise():
    assert compiler_output.sort_output(GCC_LONG4, ROOTS) == ("", 2, 0)


def test_an_error_after_upstream_noise_is_shown_whole():
    error = (f"In file included from {FA}/hopper/flash_api.cpp:3:\n"
             f"{FA}/hopper/flash.h:10:3: error: \u2018x\u2019 was not declared in this scope\n"
             f"   10 |   x = 1;\n      |   ^\n")
    # located in upstream, but an error: never noise
    assert compiler_output.sort_output(GCC_LONG4 + error, ROOTS) == (error, 2, 0)


def test_warnings_elsewhere_and_tool_messages_are_shown():
    ours = "/build/generated/fa2_missing_kernels.cpp:7:5: warning: unused variable \u2018y\u2019 [-Wunused-variable]\n"
    tool = "cc1plus: warning: command-line option \u2018-Wno-x\u2019 is valid for C but not for C++\n"
    ptxas = "ptxas warning : Registers are spilled to local memory in function 'k', 8 bytes spill stores\n"
    assert compiler_output.sort_output(GCC_LONG4 + tool + ptxas + ours, ROOTS) == (tool + ptxas + ours, 2, 0)


def test_cudafe_warnings_are_grouped_and_filtered_by_location():
    shown, hidden, _ = compiler_output.sort_output(CUDAFE, ROOTS)
    assert hidden == 1
    assert "unused_in_upstream" not in shown
    assert shown.startswith("/build/generated/ours.cu(2): warning #177-D")
    assert "int mine" in shown


def test_warnings_from_template_instantiations_keep_their_context():
    text = (f"{CUTLASS}/include/cute/tensor.hpp: In instantiation of \u2018void f() [with T = int]\u2019:\n"
            f"{FA}/hopper/flash_fwd.cu:10:5:   required from here\n"
            f"{CUTLASS}/include/cute/tensor.hpp:3:7: warning: unused variable \u2018x\u2019 [-Wunused-variable]\n"
            f"    3 |   int x;\n")
    assert compiler_output.sort_output(text, ROOTS) == ("", 1, 0)
    # The same warning in a header that is not upstream's is shown with its context.
    assert compiler_output.sort_output(text, ["/elsewhere"]) == (text, 0, 0)


# What ptxas printed for the FP8 kernels of the pinned upstream (issue 19; function name shortened).
PTXAS_C7514 = ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized "
               "due to non wgmma instructions defining accumulator registers of a wgmma between start and end of "
               "the pipeline stage in the function '_ZN7cutlass13device_kernelIN5flash11FlashAttnFwdE'\n")


def test_ptxas_performance_notes_on_upstream_kernels_are_noise():
    other = "ptxas warning : Registers are spilled to local memory in function 'k', 8 bytes spill stores\n"
    upstream_unit = f"{FA}/hopper/instantiations/flash_fwd_hdim128_e4m3_paged_sm90.cu"
    # counted apart from the compiler warnings (issue 29: "128 warnings" were 90 warnings and 38 notes)
    assert compiler_output.sort_output(PTXAS_C7514 * 3 + other + GCC_LONG4, ROOTS, upstream_unit) == (other, 2, 3)
    # A unit of ours, or no source known: shown.
    ours = "/build/generated/ours.cu"
    assert compiler_output.sort_output(PTXAS_C7514 + other, ROOTS, ours) == (PTXAS_C7514 + other, 0, 0)
    assert compiler_output.sort_output(PTXAS_C7514, ROOTS) == (PTXAS_C7514, 0, 0)


def test_the_launcher_counts_ptxas_notes_on_upstream_units_with_the_hidden_warnings(tmp_path):
    import subprocess
    note = PTXAS_C7514.replace("'", "'\\''")
    source = f"{FA}/hopper/instantiations/flash_fwd_hdim128_e4m3_paged_sm90.cu"
    run = subprocess.run([sys.executable, "-E", "-s", "-S", BUILD_PY, "units.compile_unit", str(tmp_path),
                          "--quiet-under", FA, "--", "sh", "-c", f"printf '%s' '{note}'", "-c", source,
                          "-o", "CMakeFiles/m.dir/x.cu.o"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == ""
    assert "(C7514)" in (tmp_path / "vfa-compile.log").read_text()
    end = (tmp_path / "vfa-progress.tsv").read_text().splitlines()[-1].split("\t")
    assert end[0] == "end" and end[5:7] == ["0", "1"]  # no compiler warning, one ptxas note


def test_a_root_is_a_folder_not_a_prefix():
    text = f"{CUTLASS}-patched/include/x.h:1:1: warning: something\n"
    assert compiler_output.sort_output(text, ROOTS) == (text, 0, 0)


def test_nothing_is_lost_between_groups():
    text = GCC_LONG4 + CUDAFE + "1 error detected in the compilation of \"x.cu\".\n"
    groups = compiler_output.split_diagnostics(text)
    assert "".join(line for g in groups for line in g.lines) == text


# --- the estimate ------------------------------------------------------------------------------

FA3 = "CMakeFiles/_vendored_fa3_C.dir/src/hopper/instantiations/flash_fwd_hdim128_bf16_{}_sm90.cu.o"
FA2 = "CMakeFiles/_vendored_fa2_C.dir/src/csrc/flash_attn/src/flash_fwd_hdim128_bf16_{}_sm80.cu.o"
CPP = "CMakeFiles/_vendored_fa3_C.dir/src/hopper/flash_api{}.cpp.o"
FA3_OTHER = "CMakeFiles/_vendored_fa3_C.dir/src/hopper/flash_{}.cu.o"
FA2_SPLIT = "CMakeFiles/_vendored_fa2_C.dir/src/csrc/flash_attn/src/flash_fwd_split_hdim128_bf16_{}_sm80.cu.o"

# The kinds the fa2 and fa3 families declare (build.unit_kinds in cmake/knobs.json), as the
# build_progress target passes them (tests/build/test_build_progress.py checks that end to end).
UNIT_KINDS = ["_vendored_fa2_C|FA2 CUDA, split-KV|311|flash_fwd_split_|5.9", "_vendored_fa2_C|FA2 CUDA|189||5.0",
              "_vendored_fa3_C|FA3 CUDA, FP8 paged|330|_e4m3_paged|5.1",
              "_vendored_fa3_C|FA3 CUDA|153|/instantiations/|6.2", "_vendored_fa3_C|FA3 CUDA, other|54||5.5"]


@pytest.fixture(autouse=True)
def unit_kinds(monkeypatch):
    monkeypatch.setattr(progress_estimate, "UNIT_KINDS", [])
    monkeypatch.setattr(progress_estimate, "REFERENCE_SECONDS", dict(progress_estimate.REFERENCE_SECONDS))
    monkeypatch.setattr(progress_estimate, "CACHED_SECONDS", dict(progress_estimate.CACHED_SECONDS))
    for spec in UNIT_KINDS:
        progress_estimate.add_unit_kind(spec)


def test_units_are_classified_by_module_and_language():
    assert progress_estimate.unit_kind(FA2_SPLIT.format("causal")) == "FA2 CUDA, split-KV"
    assert progress_estimate.unit_kind(FA3.format("paged")) == "FA3 CUDA"
    assert progress_estimate.unit_kind(FA2.format("causal")) == "FA2 CUDA"
    assert progress_estimate.unit_kind(CPP.format("")) == "C++"
    assert progress_estimate.unit_kind(FA3_OTHER.format("prepare_scheduler")) == "FA3 CUDA, other"
    assert progress_estimate.unit_name(FA3.format("paged")) == "flash_fwd_hdim128_bf16_paged_sm90.cu"


def test_the_monitor_knows_no_family_but_the_kinds_it_is_given(monkeypatch):
    """The kinds of CUDA units come from each family's target file (--unit-kind); without
    them a module's CUDA units are plain "CUDA", whatever the module is called."""
    monkeypatch.setattr(progress_estimate, "UNIT_KINDS", [])
    assert progress_estimate.unit_kind(FA3.format("paged")) == "CUDA"
    assert progress_estimate.unit_kind(FA2.format("causal")) == "CUDA"
    progress_estimate.add_unit_kind("_vendored_fa9_C|FA9 CUDA|42|")
    assert progress_estimate.unit_kind("CMakeFiles/_vendored_fa9_C.dir/src/k.cu.o") == "FA9 CUDA"
    assert progress_estimate.REFERENCE_SECONDS["FA9 CUDA"] == 42.0
    # A module whose name holds another's is not taken for it.
    assert progress_estimate.unit_kind("CMakeFiles/x_vendored_fa9_C.dir/src/k.cu.o") == "CUDA"


def state(jobs=2, **kw):
    s = progress_estimate.BuildState(t0=1000.0, jobs=jobs)
    for k, v in kw.items():
        setattr(s, k, v)
    return s


def finish(s, unit, start, seconds, rc=0):
    s.apply(["start", str(start), unit])
    s.apply(["end", str(start + seconds), unit, str(rc), str(seconds), "0"])


def test_before_any_unit_finishes_the_estimate_uses_reference_times():
    units = {FA3.format(v) for v in ("a", "b", "c", "d")}
    s = state(jobs=2, planned=units)
    ref = progress_estimate.REFERENCE_SECONDS
    assert s.seconds_left(1000.0) == pytest.approx(2 * ref["FA3 CUDA"])
    assert s.basis(1000.0) == "at reference times"


def test_finished_units_replace_the_reference_for_their_kind():
    units = {FA3.format(v) for v in ("a", "b", "c", "d", "e")} | {CPP.format(""), CPP.format("_2")}
    s = state(jobs=2, planned=units)
    for cpp in (CPP.format(""), CPP.format("_2")):
        finish(s, cpp, 1000, progress_estimate.REFERENCE_SECONDS["C++"])
    finish(s, FA3.format("a"), 1000, 300)
    # 4 FA3 units left at 300 s each (this build's own time for FA3, not 153) on 2 jobs
    assert s.seconds_left(1300.0) == pytest.approx(600)
    assert s.basis(1300.0) == "at this machine's pace from 1 unit compiled here"


def test_a_quick_fa3_helper_unit_does_not_set_the_instantiations_cost():
    """Measured on the 2-core machine: the 22 s scheduler unit finished first and the
    estimate took it for all eight FA3 instantiations ("about 2 min left" with 9 min to go)."""
    units = {FA3.format(v) for v in ("a", "b", "c", "d")} | {FA3_OTHER.format("prepare_scheduler")}
    s = state(jobs=2, planned=units)
    finish(s, FA3_OTHER.format("prepare_scheduler"), 1000, progress_estimate.REFERENCE_SECONDS["FA3 CUDA, other"])
    # speed 1 from the finished unit: 4 instantiations at the reference time on 2 jobs
    assert s.seconds_left(1100.0) == pytest.approx(2 * progress_estimate.REFERENCE_SECONDS["FA3 CUDA"])


def test_kinds_not_seen_yet_scale_with_the_pace_of_the_cuda_units_compiled_here():
    """Issue 29: "85-101 min" after three small C++ units that took longer than their
    reference: C++ units say nothing of how long a CUDA unit takes here."""
    ref = progress_estimate.REFERENCE_SECONDS
    s = state(jobs=1, planned={CPP.format(""), FA2.format("a"), FA3.format("a")})
    finish(s, CPP.format(""), 1000, 3 * ref["C++"])  # three times as slow
    assert s.seconds_left(1020.0) == pytest.approx(ref["FA2 CUDA"] + ref["FA3 CUDA"])
    finish(s, FA3.format("a"), 1020, 2 * ref["FA3 CUDA"])  # twice as slow
    assert s.seconds_left(1400.0) == pytest.approx(2 * ref["FA2 CUDA"])


def test_running_units_count_with_what_is_left_of_them():
    s = state(jobs=2, planned={FA3.format("a"), FA3.format("b"), FA3.format("c")})
    finish(s, FA3.format("a"), 1000, 100)
    s.apply(["start", "1100.0", FA3.format("b")])
    s.apply(["start", "1100.0", FA3.format("c")])
    assert s.seconds_left(1160.0) == pytest.approx(40)
    # A unit past its expected time is expected to need a fifth of its time so far again
    # (issue 29: "about 15 s left" 3.7 minutes before the end).
    assert s.seconds_left(1400.0) == pytest.approx(0.2 * 300)


FA2_SPLIT = "CMakeFiles/_vendored_fa2_C.dir/src/csrc/flash_attn/src/flash_fwd_split_hdim128_bf16_{}sm80.cu.o"


def test_a_running_unit_is_expected_to_take_its_own_kinds_time():
    """Issue 16: on the H200 "about 10 s left" stood for the last 2.5 minutes while an FA2
    split-KV unit ran 6:17: the other FA2 units' mean had set its expected time."""
    assert progress_estimate.unit_kind(FA2_SPLIT.format("")) == "FA2 CUDA, split-KV"
    s = state(jobs=2, planned={FA2.format("a"), FA2.format("b"), FA2_SPLIT.format("")})
    ref = progress_estimate.REFERENCE_SECONDS
    finish(s, FA2.format("a"), 1000, ref["FA2 CUDA"])
    finish(s, FA2.format("b"), 1000, ref["FA2 CUDA"])
    s.apply(["start", "1000.0", FA2_SPLIT.format("")])
    left = s.seconds_left(1180.0)
    assert left == pytest.approx(ref["FA2 CUDA, split-KV"] - 180)


def test_the_pace_of_this_machine_counts_once_units_run_past_the_reference():
    """Issue 19, 2-core machine: "15 min left" at 3:08 with 30.8 min to go. Only .cpp units
    had finished (at their reference time); the FA3 units running had taken twice theirs."""
    ref = progress_estimate.REFERENCE_SECONDS
    fa3 = [FA3.format(v) for v in "abcdefgh"]
    s = state(jobs=2, planned=set(fa3) | {CPP.format("")})
    finish(s, CPP.format(""), 1000, ref["C++"])
    s.apply(["start", "1005.0", fa3[0]])
    s.apply(["start", "1005.0", fa3[1]])
    now = 1005.0 + 2 * ref["FA3 CUDA"]
    assert s.pace("FA3 CUDA", now) == pytest.approx(2)
    # 6 FA3 units wait, 3 a job, each at this machine's pace (twice the reference)
    assert s.seconds_left(now) > 3 * 2 * ref["FA3 CUDA"]


def test_the_pace_weighs_units_by_their_reference_time():
    """Quick .cpp units finishing fast must not make the CUDA units look fast."""
    ref = progress_estimate.REFERENCE_SECONDS
    s = state(jobs=1, planned={CPP.format(""), CPP.format("_2"), FA3.format("a"), FA2.format("a"),
                               FA2_SPLIT.format("")})
    finish(s, CPP.format(""), 1000, 1)
    finish(s, CPP.format("_2"), 1001, 1)
    finish(s, FA3.format("a"), 1002, 2 * ref["FA3 CUDA"])
    finish(s, FA2.format("a"), 1400, ref["FA2 CUDA"])
    # FA2 split-KV, no unit of it yet: the CUDA units' seconds over their reference seconds
    assert s.cost("FA2 CUDA, split-KV", 2000.0) == pytest.approx(
        ref["FA2 CUDA, split-KV"] * (2 * ref["FA3 CUDA"] + ref["FA2 CUDA"]) / (ref["FA3 CUDA"] + ref["FA2 CUDA"]))


# --- the compiler cache's share (issue 29: "about 25 min" for a rebuild that took 3:41) -----------


def test_a_warm_build_says_so_within_its_first_minute():
    ref = progress_estimate.REFERENCE_SECONDS
    fa3 = [FA3.format(v) for v in "abcdefghij"]
    s = state(jobs=2, planned=set(fa3))
    cold = s.seconds_left(1000.0)
    assert cold == pytest.approx(5 * ref["FA3 CUDA"])
    finish(s, fa3[0], 1000, 12)
    finish(s, fa3[1], 1000, 14)
    # 8 left at the 13 s the cached ones took, 4 a job: under a minute, not 10 min
    assert s.seconds_left(1014.0) == pytest.approx(4 * 13)
    assert s.basis(1014.0) == "as the 2 CUDA units so far: seconds each, the compiler cache's"


def test_cached_units_of_a_kind_not_seen_yet_take_their_kinds_time_at_this_builds_pace():
    """Each kind's time when the cache answers is its own reference (the host-side steps sccache
    still runs differ by kind), at the pace of this build's cached units: a busy machine takes
    longer for them all."""
    cached = progress_estimate.CACHED_SECONDS
    s = state(jobs=1, planned={FA2.format("a"), FA2.format("b"), FA3.format("a")})
    finish(s, FA2.format("a"), 1000, 2 * cached["FA2 CUDA"])  # twice the reference: a busy machine
    assert s.cost("FA3 CUDA", 1010.0) == pytest.approx(2 * cached["FA3 CUDA"])
    assert s.cost("FA2 CUDA", 1010.0) == pytest.approx(2 * cached["FA2 CUDA"])


def test_fp8_paged_units_are_expected_to_take_longer_than_the_other_fa3_units():
    """Issue 29, 2-core machine: the FP8 paged units took 5.5-6.5 min against 2-3.5 for the
    other FA3 units, and the estimate did not expect it."""
    ref = progress_estimate.REFERENCE_SECONDS
    fp8_paged = FA3.format("paged").replace("bf16", "e4m3")
    assert progress_estimate.unit_kind(fp8_paged) == "FA3 CUDA, FP8 paged"
    assert progress_estimate.unit_kind(FA3.format("paged_split").replace("bf16", "e4m3")) == "FA3 CUDA, FP8 paged"
    s = state(jobs=1, planned={FA3.format("a"), fp8_paged, FA3.format("b")})
    finish(s, FA3.format("a"), 1000, 150)
    # not one FP8 paged unit yet: its reference at the pace of the FA3 unit compiled here
    assert s.cost("FA3 CUDA, FP8 paged", 1150.0) == pytest.approx(ref["FA3 CUDA, FP8 paged"] * 150 / ref["FA3 CUDA"])
    assert s.cost("FA3 CUDA, FP8 paged", 1150.0) > 2 * s.cost("FA3 CUDA", 1150.0)


def test_a_unit_running_past_a_cached_units_time_compiles():
    """A cold build is known as one in its first minute too: the units running are past
    the time a cached unit takes."""
    ref = progress_estimate.REFERENCE_SECONDS
    fa3 = [FA3.format(v) for v in "abcd"]
    s = state(jobs=2, planned=set(fa3))
    finish(s, fa3[0], 1000, 12)  # one from the cache
    s.apply(["start", "1012.0", fa3[1]])
    s.apply(["start", "1012.0", fa3[2]])
    now = 1012.0 + progress_estimate.cached_limit("FA3 CUDA") + 1
    assert s.cache_share(now) == (1, 3)
    # the running ones compile (reference time, less what they ran); the last one waits at a
    # third cached, two thirds compiled
    elapsed = now - 1012.0
    expected = (ref["FA3 CUDA"] - elapsed) + (12 + 2 * ref["FA3 CUDA"]) / 3
    assert s.seconds_left(now) == pytest.approx(expected)


def test_the_estimate_is_never_less_than_a_running_unit_still_needs():
    import random
    rng = random.Random(29)
    ref = progress_estimate.REFERENCE_SECONDS
    kinds = [FA3, FA2, FA2_SPLIT, FA3_OTHER, CPP]
    for trial in range(200):
        units = [k.format(f"u{trial}_{i}") for i, k in enumerate(rng.choices(kinds, k=12))]
        s = state(jobs=rng.choice([1, 2, 4]), planned=set(units))
        now = 1000.0
        for unit in units[:rng.randrange(0, 8)]:
            seconds = rng.uniform(1, 3 * ref[progress_estimate.unit_kind(unit)])
            finish(s, unit, now, seconds)
            now += seconds
        for unit in units[8:8 + rng.randrange(0, 4)]:
            s.apply(["start", str(now - rng.uniform(0, 600)), unit])
        needs = [s.left_of(u, t, now) for u, t in s.running.items()]
        assert s.seconds_left(now) >= max(needs, default=0)


def test_the_record_compares_the_estimates_with_the_time_left():
    record = progress_estimate.EstimateRecord()
    for t, left in ((0, 900), (50, 800), (120, 700), (260, 400), (500, 260), (700, 100), (950, 40)):
        record.add(t, left)
    points = {p["at"]: p for p in record.table(1000.0)}
    assert sorted(points) == [0.1, 0.25, 0.5, 0.75, 0.9]
    assert points[0.25] == {"at": 0.25, "t": 120, "estimated_left": 700, "actual_left": 880,
                            "error": round(700 / 880 - 1, 3)}
    assert points[0.9]["t"] == 700 and points[0.9]["error"] == pytest.approx(100 / 300 - 1, abs=1e-3)


def test_a_replay_of_a_builds_events_gives_its_record():
    """The estimate over recorded events (`build_monitor.py --replay`): two jobs, FA3 units of
    the reference time, so the estimate is exact once one has compiled."""
    ref = progress_estimate.REFERENCE_SECONDS["FA3 CUDA"]
    events = []
    for i, (start, job) in enumerate([(0, 0), (0, 1), (ref, 0), (ref, 1)]):
        unit = FA3.format(f"r{i}")
        events += [["start", str(1000 + start), unit], ["end", str(1000 + start + ref), unit, "0", str(ref), "0"]]
    state_, record, seconds = progress_estimate.replay(events, jobs=2, step=10)
    assert seconds == pytest.approx(2 * ref) and len(state_.done) == 4
    for point in record.table(seconds):
        assert point["error"] == pytest.approx(0, abs=0.01), point


def test_events_of_an_earlier_build_are_ignored():
    s = state(jobs=2, planned={FA3.format("a")})
    s.apply(["end", "900.0", FA3.format("z"), "1", "1.0", "0"])
    s.apply(["a line that is no event"])
    assert s.done == {} and s.total == 1


def test_the_job_limit_is_read_from_ninjas_command_line():
    assert ninja_processes.job_limit(["ninja", "-j", "7", "all"], cores=2) == 7
    assert ninja_processes.job_limit(["ninja", "-j12"], cores=2) == 12
    assert ninja_processes.job_limit(["ninja", "-j0"], cores=2) == 1 << 30
    # ninja's own default: 3 on 2 cores, cores + 2 above
    assert ninja_processes.job_limit(["ninja"], cores=2) == 3
    assert ninja_processes.job_limit(["ninja", "-C", "build"], cores=16) == 18


def test_the_dry_run_plans_every_unit_of_the_targets(tmp_path):
    """A console-pool edge in the dry run (as the monitor's own target is in `all`) would
    make ninja drop the lines of the edges it runs meanwhile: the dry run names the
    module targets."""
    from support.cmake_runner import tool
    objects = [f"CMakeFiles/m.dir/u{i}.cu.o" for i in range(6)]
    (tmp_path / "build.ninja").write_text(
        "rule cc\n  command = touch $out\n  description = Building CUDA object $out\n"
        "rule monitor\n  command = sleep 1\n  pool = console\n  description = progress\n"
        + "".join(f"build {o}: cc\n" for o in objects)
        + f"build m: phony {' '.join(objects)}\nbuild progress: monitor\nbuild all: phony progress m\ndefault all\n")
    assert ninja_processes.planned_units(tool("ninja"), str(tmp_path), ["m"]) == set(objects)
    assert ninja_processes.planned_units(tool("ninja"), str(tmp_path / "missing"), ["m"]) is None


# --- the launcher --------------------------------------------------------------------------------


def launch(tmp_path, script: str, roots=(CUTLASS,)):
    """compile_unit.py in front of a `compiler` that is a shell script."""
    import subprocess
    args = [f for r in roots for f in ("--quiet-under", r)]
    return subprocess.run([sys.executable, "-E", "-s", "-S", BUILD_PY, "units.compile_unit", str(tmp_path),
                           *args, "--", "sh", "-c", script, "-o", "CMakeFiles/m.dir/x.cu.o"],
                          capture_output=True, text=True)


def test_the_launcher_passes_on_the_exit_status_and_records_the_unit(tmp_path):
    noisy = GCC_LONG4.replace("'", "'\\''")
    run = launch(tmp_path, f"printf '%s' '{noisy}'; echo 'x.cu:1:1: error: ours' >&2; exit 3")
    assert run.returncode == 3
    assert run.stdout == "x.cu:1:1: error: ours\n(2 warnings located in upstream code are not shown here; " \
                         f"the whole output of this compile is in {tmp_path}/vfa-compile.log)\n"
    log = (tmp_path / "vfa-compile.log").read_text()
    assert log.startswith("==> CMakeFiles/m.dir/x.cu.o: exit 3, ") and "\u2018long4\u2019" in log
    events = [line.split("\t") for line in (tmp_path / "vfa-progress.tsv").read_text().splitlines()]
    assert [e[0] for e in events] == ["start", "end"]
    assert events[1][2:4] == ["CMakeFiles/m.dir/x.cu.o", "3"] and events[1][5] == "2"


def test_the_launcher_shows_everything_when_it_cannot_keep_a_log(tmp_path):
    noisy = GCC_LONG4.replace("'", "'\\''")
    run = launch(tmp_path / "missing", f"printf '%s' '{noisy}'")
    assert run.returncode == 0
    assert run.stdout == GCC_LONG4


def test_the_build_logs_are_0600_and_hold_no_url_password(tmp_path):
    """Issue 34: sccache's error may quote a cache's URL with its password; the build's logs are
    0600 from their creation (one an older build left 0644 made so) and they and the console get
    the text through the one URL scrubber (cmake/vfa_build/url_secrets.py)."""
    (tmp_path / "vfa-progress.tsv").write_text("")
    (tmp_path / "vfa-progress.tsv").chmod(0o644)
    run = launch(tmp_path, "echo 'sccache: error: Server startup failed: cache storage failed to read: "
                           "redis://ci:hunter2hunter2@cache.example:6379/ refused' >&2; exit 2")
    assert run.returncode == 2
    log = (tmp_path / "vfa-compile.log").read_text()
    assert "redis://cache.example:6379/ refused" in log and "redis://cache.example:6379/" in run.stdout + run.stderr
    assert "hunter2" not in log + run.stdout + run.stderr
    for name in ("vfa-compile.log", "vfa-progress.tsv"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name


def test_a_compiler_killed_by_a_signal_fails_the_unit(tmp_path):
    run = launch(tmp_path, "kill -9 $$")
    assert run.returncode == 137


# --- an interrupt stops every compile, through the compiler cache's server too ---------------

# A gcc that compiles `slow_unit.c` slowly: sccache detects and preprocesses with it as with
# gcc (it runs the real one), and runs the compile itself from its server, where it sleeps.
# Each step leaves <step>.<pid> in $SLOW_MARKERS ("preprocess", "compile", "compiled").
SLOW_GCC = """#!/bin/sh
case " $* " in
  *slow_unit.c*)
    case " $* " in
      *" -E "*) touch "$SLOW_MARKERS/preprocess.$$"; sleep "${SLOW_PREPROCESS:-0}" ;;
      *) touch "$SLOW_MARKERS/compile.$$"; sleep 60; touch "$SLOW_MARKERS/compiled.$$" ;;
    esac ;;
esac
exec gcc "$@"
"""


@pytest.fixture
def slow_cache(tmp_path):
    """A private sccache (its own port and cache dir) and the slow gcc. The server is
    started by the first compile's client, as when a build finds none running."""
    import socket
    import subprocess
    from support.cmake_runner import clean_env, tool
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    markers = tmp_path / "markers"
    markers.mkdir()
    gcc = tmp_path / "slow-gcc"
    gcc.write_text(SLOW_GCC)
    gcc.chmod(0o755)
    (tmp_path / "slow_unit.c").write_text(f"int slow_unit_{port}(void) {{ return {port}; }}\n")
    env = clean_env(SCCACHE_SERVER_PORT=str(port), SCCACHE_DIR=str(tmp_path / "cache"),
                    SCCACHE_IDLE_TIMEOUT="120", SCCACHE_ERROR_LOG=str(tmp_path / "sccache.log"),
                    SLOW_MARKERS=str(markers))
    sccache = tool("sccache")
    yield {"env": env, "sccache": sccache, "gcc": gcc, "markers": markers, "dir": tmp_path}
    subprocess.run([sccache, "--stop-server"], env=env, capture_output=True, timeout=60)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(predicate, seconds: float) -> bool:
    import time
    deadline = time.time() + seconds
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def build_launcher(slow_cache) -> list[str]:
    """The launcher the build puts in front of sccache (cmake/CompilerCache.cmake):
    sccache_launcher.py with the settings compiler_cache_probe.py writes (no cluster)."""
    import json
    c = slow_cache
    settings = c["dir"] / "vfa-sccache.json"
    settings.write_text(json.dumps({"sccache": c["sccache"], "dist": "none", "build_dir": str(c["dir"]),
                                    "server": {"SCCACHE_SERVER_PORT": c["env"]["SCCACHE_SERVER_PORT"]}}))
    return [sys.executable, "-E", "-s", "-S", BUILD_PY, "compiler_cache.sccache_launcher", str(settings), "--"]


def interrupted_compile(slow_cache, step: str, prefix=None, **env):
    """compile_unit.py in front of `sccache slow-gcc` (or of ``prefix`` + `slow-gcc`), run as
    ninja runs a job (a process group of its own), and interrupted as ninja interrupts one
    (SIGINT to that group) once the slow gcc is at `step`."""
    import os
    import signal
    import subprocess
    import time
    c = slow_cache
    prefix = prefix or [c["sccache"]]
    launcher = subprocess.Popen(
        [sys.executable, "-E", "-s", "-S", BUILD_PY, "units.compile_unit", str(c["dir"]), "--",
         *prefix, str(c["gcc"]), "-c", "slow_unit.c", "-o", "slow_unit.o"],
        cwd=c["dir"], env={**c["env"], **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        assert wait_for(lambda: any(c["markers"].glob(f"{step}.*")), 60), "the slow gcc never started"
        time.sleep(0.3)
        os.killpg(launcher.pid, signal.SIGINT)
        interrupted = time.time()
        out, _ = launcher.communicate(timeout=40)
        return launcher.returncode, out, time.time() - interrupted
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_an_interrupt_stops_the_compile_the_cache_server_runs(slow_cache):
    """Issue 19: after a Ctrl-C the sccache server kept the running compiles going for
    minutes (the compiler is the server's child, not the launcher's)."""
    import subprocess
    rc, out, _ = interrupted_compile(slow_cache, "compile")
    [compile_marker] = slow_cache["markers"].glob("compile.*")
    compiler = int(compile_marker.suffix[1:])
    assert wait_for(lambda: not alive(compiler), 120), "the server still runs the compile"
    # stopped, not run to its end (60 s): the event, whatever the machine's load
    assert rc == 130 and not any(slow_cache["markers"].glob("compiled.*"))
    assert out.count("interrupted") == 1 and "stopped the compile of slow_unit.o" in out, out
    events = [line.split("\t") for line in (slow_cache["dir"] / "vfa-progress.tsv").read_text().splitlines()]
    assert [e[0] for e in events] == ["start", "stopped"]
    # The server the client started is still there for the next build: only the compile went.
    stats = subprocess.run([slow_cache["sccache"], "--show-stats"], env=slow_cache["env"], capture_output=True,
                           text=True, timeout=30)
    assert stats.returncode == 0, stats.stderr


@pytest.mark.parametrize("through", ["sccache", "the build's launcher"])
def test_an_interrupt_while_the_server_preprocesses_stops_the_compile_to_come(slow_cache, through):
    """Issue 19: one compiler process started 6 s after the interrupt (the server was still
    preparing the compile it had been handed). Also with sccache behind the launcher the
    build wires in (sccache_launcher.py), which hid the client from the interrupt."""
    prefix = build_launcher(slow_cache) if through != "sccache" else None
    rc, out, _ = interrupted_compile(slow_cache, "preprocess", prefix, SLOW_PREPROCESS="3")
    assert rc == 130
    assert not wait_for(lambda: any(slow_cache["markers"].glob("compile.*")), 6), \
        "the server started the compile after the interrupt"


def test_an_interrupt_while_the_compile_starts_is_not_lost(tmp_path):
    """Issue 16: a signal between the launcher's handlers and the compile's start was
    swallowed (the handler had no process to pass it to) and the compile ran to its end.
    Here the launcher's process gets a real SIGINT just as it starts the compile."""
    import subprocess
    done = tmp_path / "compiled"
    hook = ("import os, runpy, signal, subprocess, sys\n"
            "start = subprocess.Popen\n"
            "def interrupted_start(*args, **kwargs):\n"
            "    os.kill(os.getpid(), signal.SIGINT)\n"
            "    return start(*args, **kwargs)\n"
            "subprocess.Popen = interrupted_start\n"
            "sys.argv = sys.argv[1:]\n"
            "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    run = subprocess.run([sys.executable, "-E", "-s", "-S", "-c", hook, BUILD_PY, "units.compile_unit",
                          str(tmp_path), "--", "sh", "-c", f"sleep 3; touch {done}", "-o", "x.o"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 130, run.stderr
    assert "interrupted (SIGINT)" in run.stderr
    assert not wait_for(done.exists, 4), "the compile ran to its end"


def test_the_lines_count_what_the_cache_server_says_it_answered(tmp_path):
    """What a line says came from the compiler cache is its server's count (a build of tiny
    kernels compiles in seconds too), asked as the compiles reach it."""
    import json
    import os
    sccache = tmp_path / "sccache"
    sccache.write_text("#!/bin/sh\necho \"$SCCACHE_SERVER_UDS\" > \"$(dirname \"$0\")/asked\"\n"
                       "echo '{\"stats\": {\"cache_hits\": {\"counts\": {\"CUDA\": 5, \"C/C++\": 2, \"PTX\": 9}}, "
                       "\"cache_misses\": {\"counts\": {\"CUDA\": 3, \"CUBIN\": 4}}}}'\n")
    sccache.chmod(0o755)
    settings = tmp_path / "vfa-sccache.json"
    settings.write_text(json.dumps({"sccache": str(sccache), "build_dir": str(tmp_path), "dist": "none",
                                    "server": {"SCCACHE_SERVER_UDS": "\\x00vfa-test"}, "own_server": True,
                                    "local": None}))
    # units: CUDA and C/C++, not their steps
    assert build_monitor.cache_counts(str(settings)) == {"CUDA": (5, 3), "C/C++": (2, 0)}
    assert (tmp_path / "asked").read_text().strip() == "\\x00vfa-test"
    monitor = build_monitor.Monitor(str(tmp_path), ["m"], 2, 30, sccache_settings=str(settings))
    s = state()
    assert monitor.from_cache(s) == ", 7 from the compiler cache"
    assert s.cache_counts == (5, 3)  # the estimate's share of cached CUDA units
    assert build_monitor.Monitor(str(tmp_path), ["m"], 2, 30).from_cache(state()) == ""
    os.unlink(sccache)
    assert monitor.from_cache(state()) == ""  # no answer: nothing said


def test_the_servers_count_decides_which_units_were_cached_not_a_fixed_time():
    """Issue 29's estimate table, before: on a loaded machine the cached combine and scheduler
    units took 20-22 s, past the time taken for a compile, and the estimate took the FA3 units
    for compiled at a quarter of their reference time (+90 to +280 %)."""
    s = state(jobs=2, planned={FA3_OTHER.format("combine"), FA3_OTHER.format("sched"), FA3.format("a"),
                               FA3.format("b"), FA3.format("c")})
    finish(s, FA3_OTHER.format("combine"), 1000, 22)
    finish(s, FA3_OTHER.format("sched"), 1000, 20)
    finish(s, FA3.format("a"), 1022, 150)
    assert [d.cached for d in s.done.values()] == [False, False, False]  # by time alone
    s.cache_counts = (2, 1)  # the server: two hits, one miss
    s.classify()
    cached = {progress_estimate.unit_name(u) for u, d in s.done.items() if d.cached}
    assert cached == {"flash_combine.cu", "flash_sched.cu"}
    assert s.cache_share(1200.0) == (2, 3)


def test_the_machines_load_scales_what_is_left_and_what_units_took():
    """A shared machine: a unit that took twice its reference while the machine ran at half
    speed for this build (twice as many runnable processes as cores) did its reference's work;
    the units left are expected at the slowdown of now, not of then."""
    ref = progress_estimate.REFERENCE_SECONDS["FA3 CUDA"]
    s = state(jobs=1, planned={FA3.format(v) for v in "abc"})
    for t in range(1000, 1000 + int(2 * ref), 5):
        s.apply(["load", str(t), "", "2.00"])
    finish(s, FA3.format("a"), 1000, 2 * ref)
    assert s.done[FA3.format("a")].work == pytest.approx(ref)
    later = 1000 + 2 * ref + progress_estimate.LOAD_WINDOW_S
    for t in range(int(1000 + 2 * ref), int(later), 5):
        s.apply(["load", str(t), "", "1.00"])  # the other work ended
    assert s.seconds_left(later) == pytest.approx(2 * ref)  # two units at the reference time
    s.apply(["load", str(later + 1), "", "3.00"])
    assert s.slowdown_now(later + 1) > 1 and s.seconds_left(later + 1) > 2 * ref


def test_the_monitor_writes_the_machines_slowdown_into_the_events(tmp_path, monkeypatch):
    monitor = build_monitor.Monitor(str(tmp_path), ["m"], 2, 30)
    monitor.cores = 2
    assert build_monitor.runnable_now() >= 0  # this machine's own count
    counts = iter([7, 9, 8, 1])  # runnable processes at each poll, on 2 cores
    monkeypatch.setattr(build_monitor, "runnable_now", lambda: next(counts))
    for t in (1000.0, 1001.0, 1002.0):
        monitor.sample_load(t)
    monitor.sample_load(1000.0 + progress_estimate.LOAD_EVERY_S)
    kinds = [line.split("\t") for line in (tmp_path / "vfa-progress.tsv").read_text().splitlines()]
    # the first poll writes at once (7 / 2); then the mean of the polls since: (9 + 8 + 1) / 3 / 2
    assert kinds == [["load", "1000.000", "", "3.50"], ["load", "1005.000", "", "3.00"]]


def test_a_replay_takes_the_cache_servers_counts_from_the_events():
    """The monitor writes the server's counts into the events when they change: a replay
    classifies the units as the live monitor did, not by their time."""
    events = [["start", "1000", FA3_OTHER.format("combine")], ["cache", "1001", "", "1", "0"],
              ["end", "1022", FA3_OTHER.format("combine"), "0", "22", "0"],
              ["start", "1022", FA3.format("a")], ["end", "1172", FA3.format("a"), "0", "150", "0"]]
    state_, _, _ = progress_estimate.replay(events, jobs=1)
    assert [d.cached for d in state_.done.values()] == [True, False]  # 22 s: by time alone, compiled


def test_a_unit_that_ends_while_the_monitor_starts_hands_its_warnings_to_it(tmp_path):
    """Issue 39: ninja starts the monitor, which holds the console from then on, a moment
    before the monitor opens its relay (seconds on a loaded machine); a unit that ended in
    between printed its warnings itself, and ninja kept them until the monitor ended: after
    the build's last line. Here a stand-in ninja runs a monitor that opens its relay only once
    the unit has ended or says it waits (events, not a delay), and one unit with a warning."""
    import subprocess
    build_dir, go = tmp_path / "build", tmp_path / "go"
    build_dir.mkdir()
    events = build_dir / compile_unit.EVENTS
    monitor = ("import os, sys, time\n"
               f"sys.path.insert(0, {str(CMAKE_DIR)!r})\n"
               "from vfa_build.progress import build_monitor, progress_estimate\n"
               "build_dir, go = sys.argv[2], sys.argv[3]\n"
               "events = os.path.join(build_dir, build_monitor.EVENTS)\n"
               "deadline = time.monotonic() + 120\n"
               "while not os.path.exists(go) and time.monotonic() < deadline:\n"
               "    time.sleep(0.01)\n"
               "m = build_monitor.Monitor(build_dir, ['m'], 2, 1.0)\n"
               "m.open_relay()\n"
               "while '\\nend\\t' not in '\\n' + open(events).read() and time.monotonic() < deadline:\n"
               "    time.sleep(0.01)\n"
               "m.close_relay(progress_estimate.BuildState(t0=0.0, jobs=2))\n")
    python = [sys.executable, "-E", "-s", "-S"]
    monitor_cmd = subprocess.list2cmdline([*python, "-c", monitor, "progress.build_monitor",
                                           str(build_dir), str(go)]) + f" > {tmp_path / 'monitor.out'}"
    unit_cmd = subprocess.list2cmdline([*python, BUILD_PY, "units.compile_unit", str(build_dir), "--", "sh",
                                        "-c", "echo \"x.cu:1:1: warning: unused variable 'ours'\"", "-o", "x.o"])
    ninja = tmp_path / "bin" / "ninja"  # its name is what the launcher and the monitor look for
    ninja.parent.mkdir()
    ninja.write_text(f"#!/bin/sh\nsh -c {subprocess.list2cmdline([monitor_cmd])} &\n"
                     f"sh -c {subprocess.list2cmdline([unit_cmd])}\nwait\n")
    ninja.chmod(0o755)
    proc = subprocess.Popen([str(ninja)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        said = lambda: events.read_text() if events.exists() else ""  # noqa: E731
        assert wait_for(lambda: "waiting\t" in said() or "end\t" in said(), 120), said()
        go.touch()
        printed, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "unused variable 'ours'" not in printed, "the unit printed its warning itself"
    assert "x.cu:1:1: warning: unused variable 'ours'" in (tmp_path / "monitor.out").read_text()
    kinds = [line.split("\t")[0] for line in said().splitlines()]
    assert kinds == ["start", "waiting", "output", "end"], kinds
    # closed, so a unit that ends from now on prints itself at once
    assert (build_dir / compile_unit.RELAY).read_text().startswith("closed ")
