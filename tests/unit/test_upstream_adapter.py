"""The adapter that runs upstream's test file (tests/upstream): the runner's input handling,
its JUnit summary, the pytest plugin end to end on a synthetic file, and the
``vllm_flash_attn`` shim (imports on CPU; flash_attn_with_kvcache over fake ops)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = ROOT / "tests" / "upstream"
sys.path[:0] = [str(UPSTREAM), str(UPSTREAM / "shim")]

import run_upstream_tests as runner  # noqa: E402
import upstream_summary  # noqa: E402
from runtime_fakes import AMPERE, HOPPER, make_build  # noqa: E402
from vendored_flash_attn.declaration import kernels
from vendored_flash_attn.selection import selector  # noqa: E402
from vendored_flash_attn.declaration.families import registry  # noqa: E402

# The wheel the NOT_BUILT refusal below came from: FA2 without float16.
MINIMAL_BUILD = make_build("minimal").raw

# --- the runner's input ---------------------------------------------------------------------


def test_runner_fails_clearly_without_a_file(capsys):
    assert runner.main([]) == 2
    err = capsys.readouterr().err
    assert "no upstream test file: pass --git-repo" in err and "not part of this repository" in err


def test_runner_refuses_a_file_that_is_not_the_pinned_one(tmp_path, capsys):
    other = tmp_path / "test_vllm_flash_attn.py"
    other.write_text("def test_x():\n    pass\n")
    assert runner.main(["--file", str(other), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert runner.git_blob_hash(other.read_bytes()) in err and "--allow-other-file" in err


def test_the_pin_has_its_expected_blob():
    # Bumping the pin without recording the test file's blob at the new commit fails here.
    assert runner.pinned_commit(ROOT / "vendor/flash-attention/pin.json") in runner.PINNED_FILES


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_reads_the_file_from_git_and_hashes_it_like_git(tmp_path):
    repo = tmp_path / "upstream"
    (repo / "tests").mkdir(parents=True)
    (repo / runner.UPSTREAM_PATH).write_text("import pytest\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    commit = _git(repo, "rev-parse", "HEAD")
    args = SimpleNamespace(file=None, git_repo=str(repo), commit=commit, pin=None,
                           allow_other_file=True)
    data, info = runner.load_upstream_file(args)
    assert data == b"import pytest\n"
    assert info["blob"] == _git(repo, "rev-parse", f"{commit}:{runner.UPSTREAM_PATH}")
    assert info["matches_pin"] is False and info["expected_blob"] is None
    args.allow_other_file = False
    with pytest.raises(runner.RunnerError, match="--allow-other-file"):
        runner.load_upstream_file(args)
    args.commit = "0" * 40
    with pytest.raises(runner.RunnerError, match=f"has no {runner.UPSTREAM_PATH} at 0000"):
        runner.load_upstream_file(args)


# --- the summary --------------------------------------------------------------------------------

def _case(name, outcome="passed", message="", calls=1, **params):
    props = "".join(f'<property name="param:{k}" value="{v}"/>' for k, v in params.items())
    if calls is not None:
        props += f'<property name="api_calls" value="{calls}"/>'
    body = {"passed": "", "failed": f'<failure message="{message}">trace</failure>',
            "error": f'<error message="{message}">trace</error>',
            "skipped": f'<skipped message="{message}"/>'}[outcome]
    return f'<testcase classname="t" name="{name}"><properties>{props}</properties>{body}</testcase>'


NOT_BUILT = ("vendored_flash_attn.errors.FlashAttnTypeError: q: this wheel has no FA2 kernels for "
             "float16 (FA2 dtypes built: bfloat16); rebuild the wheel with VFA_PRESET=full")
METADATA = ("vendored_flash_attn.errors.FlashAttnInputError: scheduler_metadata was computed for "
            "max_seqlen_q=1; this call has max_seqlen_q=129")


def _junit(tmp_path, *cases):
    path = tmp_path / "junit.xml"
    path.write_text(f'<testsuites><testsuite name="pytest">{"".join(cases)}</testsuite></testsuites>')
    return path


def test_summary_counts_per_function_and_classifies_failures(tmp_path):
    path = _junit(
        tmp_path,
        _case("test_sparse_attention[a]"),
        _case("test_sparse_attention[b]", calls=0),  # upstream's early return
        _case("test_sparse_attention[c]", "failed", NOT_BUILT + " (case 3)", dtype="torch.float16"),
        _case("test_sparse_attention[d]", "failed", NOT_BUILT + " (case 17)", dtype="torch.float16"),
        _case("test_varlen_with_paged_kv[x]", "failed", METADATA, aot_schedule="True", fa_version="3"),
        # Same case, another failure: not excused by the known defect.
        _case("test_varlen_with_paged_kv[y]", "failed", "AssertionError: Tensor-likes are not close!",
              aot_schedule="True", fa_version="3"),
        # The known defect's message, but on a case it does not cover.
        _case("test_varlen_with_paged_kv[w]", "failed", METADATA, aot_schedule="False", fa_version="3"),
        _case("test_varlen_with_paged_kv[z]", "skipped", "AOT schedule is not supported in version 2",
              calls=None, aot_schedule="True", fa_version="2"),
        _case("test_flash_attn_with_paged_kv[e]", "error", "RuntimeError: CUDA error 700", calls=None),
    )
    summary = upstream_summary.summarize(upstream_summary.read_junit(path), build=MINIMAL_BUILD)
    assert summary["functions"]["test_sparse_attention"] == dict(
        passed=2, failed=2, error=0, skipped=0, passed_without_api_call=1)
    assert summary["functions"]["test_varlen_with_paged_kv"] == dict(
        passed=0, failed=3, error=0, skipped=1, passed_without_api_call=0)
    assert summary["totals"]["error"] == 1 and summary["totals"]["failed"] == 5
    by_category = {}
    for group in summary["failures"]:
        by_category.setdefault(group["category"], []).append(group)
    (not_built,) = by_category["not-built"]
    assert not_built["count"] == 2  # numbers collapsed: one reason
    (upstream,) = by_category["upstream-file"]
    assert upstream["examples"] == ["test_varlen_with_paged_kv[x]"]
    assert "max_seqlen_q=1" in upstream["explanation"]
    assert sorted(g["examples"][0] for g in by_category["unexpected"]) == [
        "test_flash_attn_with_paged_kv[e]", "test_varlen_with_paged_kv[w]",
        "test_varlen_with_paged_kv[y]"]
    assert summary["failures"][0]["category"] == "unexpected"  # listed first
    assert summary["unexpected"] == 3 and summary["ok"] is False
    assert summary["skips"] == [dict(function="test_varlen_with_paged_kv",
                                     reason="AOT schedule is not supported in version N", count=1)]
    text = upstream_summary.render(summary)
    assert "[upstream-file] 1 x test_varlen_with_paged_kv" in text and "unexpected failures: 3" in text


def test_summary_is_ok_with_only_expected_failures(tmp_path):
    path = _junit(tmp_path, _case("test_a[1]"),
                  _case("test_varlen_with_paged_kv[x]", "failed", METADATA, aot_schedule="True",
                        fa_version="3"),
                  _case("test_b[2]", "failed", NOT_BUILT))
    summary = upstream_summary.summarize(upstream_summary.read_junit(path), build=MINIMAL_BUILD)
    assert summary["unexpected"] == 0 and summary["ok"] is True
    assert upstream_summary.summarize([])["ok"] is False  # nothing ran: not a pass


def _refusals():
    """(message, build that lacks the kernel, build that has it): each refusal of a kernel
    the package makes, produced by the package's own code, so the summary's patterns follow
    its wording."""
    full = make_build("full")
    FA2, FA3 = registry().by_name("fa2"), registry().by_name("fa3")
    no_fa3 = make_build("full", fa3={"built": False, "reason": "nvcc 12.2 is older than 12.3"})
    lacking = make_build("minimal", fa2={"features": ["sparse"], "head_dims": [64]})
    minimal = make_build("minimal")
    no_hdimdiff = make_build("full", fa3={"features": ["paged", "split"]})
    return [pytest.param(*row, id=row[0]) for row in [
        ("dtype", kernels.dtype_problem(FA2, minimal.fa2, "fp16"), minimal, full),
        ("fa2-head-dim", kernels.head_size_problem(FA2, minimal.fa2, 256), minimal, full),
        ("fa3-head-dim", kernels.head_size_problem(FA3, minimal.fa3, 256), minimal, full),
        ("fa3-feature", kernels.feature_problem(FA3, minimal.fa3, "softcap"), minimal, full),
        ("fa3-hdimdiff", kernels.head_size_problem(FA3, no_hdimdiff.fa3, 192, 128), no_hdimdiff, full),
        ("sparse", kernels.sparse_problem(FA2, minimal.fa2), minimal, full),
        ("sparse-head-dim", kernels.sparse_problem(FA2, lacking.fa2), lacking, full),
        ("no-fa3", "fa3-version", no_fa3, full),
    ]]


@pytest.mark.parametrize("kind, message, lacking, having", _refusals())
def test_a_refusal_is_excused_only_when_the_build_info_agrees(describe, kind, message, lacking, having):
    if message == "fa3-version":
        describe(caps=(HOPPER,), build=lacking)
        message = selector.version_problem(3, 0)
    assert message, kind
    case = upstream_summary.Case("test_x", "test_x[1]", "failed",
                                 f"vendored_flash_attn.errors.FlashAttnTypeError: q: {message}", {}, 1)
    assert upstream_summary.classify(case, lacking.raw)[0] == "not-built", message
    # The same refusal from a wheel whose build info says the kernel is there: a wrong refusal.
    category, why = upstream_summary.classify(case, having.raw)
    assert (category, "a wrong refusal" in why) == ("unexpected", True), message
    # No build info to check against: not excused.
    assert upstream_summary.classify(case, None)[0] == "unexpected"


def test_a_refusal_in_a_known_defect_case_is_still_checked_against_the_build_info():
    """upstream's aot_schedule cases fail on their scheduler metadata (a known defect), but on a
    wheel without the head dim, get_scheduler_metadata refuses first with a message naming the
    scheduler metadata too: that refusal is excused only when the build info agrees."""
    minimal, full = make_build("minimal"), make_build("full")
    message = kernels.head_size_problem(registry().by_name("fa3"), minimal.fa3, 256)
    case = upstream_summary.Case(
        "test_varlen_with_paged_kv", "test_varlen_with_paged_kv[3-True-256]", "failed",
        f"vendored_flash_attn.errors.FlashAttnInputError: get_scheduler_metadata: {message}",
        {"aot_schedule": "True", "fa_version": "3"}, 1)
    assert upstream_summary.classify(case, minimal.raw)[0] == "not-built"
    category, why = upstream_summary.classify(case, full.raw)
    assert (category, "a wrong refusal" in why) == ("unexpected", True)


def test_a_rebuild_hint_alone_excuses_nothing():
    case = upstream_summary.Case("test_x", "test_x[1]", "failed",
                                 "RuntimeError: the kernel crashed; rebuild the wheel with VFA_PRESET=full", {}, 1)
    assert upstream_summary.classify(case, make_build("minimal").raw) == ("unexpected", "")


SYNTHETIC = '''
import pytest
from vllm_flash_attn import sparse_attn_func


@pytest.mark.parametrize("n", [0, 1])
def test_calls(n):
    if n == 0:
        return
    with pytest.raises(TypeError):
        sparse_attn_func(None, None, None, None, None, None, None)


def test_fails():
    assert False, "boom"
'''


def test_plugin_and_command_end_to_end(tmp_path):
    """The runner's pytest command with the plugin, on a synthetic file: parameters and API
    call counts reach the JUnit XML, and the summary reads them."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    runner.stage(scratch, SYNTHETIC.encode())
    junit = tmp_path / "junit.xml"
    env = runner.adapter_env(dict(os.environ, PYTHONPATH=str(ROOT / "python")))
    result = subprocess.run(runner.pytest_command(sys.executable, scratch, junit, []), env=env,
                            cwd=scratch, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    cases = {c.name: c for c in upstream_summary.read_junit(junit)}
    assert cases["test_calls[0]"].params == {"n": "0"} and cases["test_calls[0]"].api_calls == 0
    assert cases["test_calls[1]"].outcome == "passed" and cases["test_calls[1]"].api_calls == 1
    assert cases["test_fails"].outcome == "failed" and "boom" in cases["test_fails"].message
    summary = upstream_summary.summarize(list(cases.values()))
    assert summary["functions"]["test_calls"]["passed_without_api_call"] == 1


# --- the shim -----------------------------------------------------------------------------------

def test_shim_imports_on_cpu_and_maps_to_this_package():
    import vendored_flash_attn
    import vllm_flash_attn
    from vllm_flash_attn import flash_attn_interface as adapter

    # Upstream's package exports at the pin, plus flash_attn_with_kvcache.
    for name in ("flash_attn_varlen_func", "get_scheduler_metadata", "sparse_attn_func",
                 "sparse_attn_varlen_func", "is_fa_version_supported",
                 "fa_version_unsupported_reason", "flash_attn_with_kvcache"):
        assert getattr(vllm_flash_attn, name) is getattr(adapter, name)
    for name in ("flash_attn_varlen_func", "get_scheduler_metadata", "sparse_attn_func",
                 "sparse_attn_varlen_func"):
        ours = getattr(vendored_flash_attn, name)
        assert getattr(adapter, name).__wrapped__ is ours
        assert inspect.signature(getattr(adapter, name)) == inspect.signature(ours)
    assert adapter.is_fa_version_supported is vendored_flash_attn.is_fa_version_supported


def test_kvcache_paged_over_varlen(describe, fake_ops):
    from vllm_flash_attn import flash_attn_with_kvcache

    describe(caps=(AMPERE,))
    q = torch.randn(3, 1, 8, 128).to(torch.bfloat16)
    k_cache = torch.randn(10, 16, 2, 128).to(torch.bfloat16)
    block_table = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 0]], dtype=torch.int32)
    seqlens = torch.tensor([5, 20, 1], dtype=torch.int32)
    out, lse = flash_attn_with_kvcache(q, k_cache, k_cache.clone(), cache_seqlens=seqlens,
                                       block_table=block_table, softmax_scale=0.2, causal=True,
                                       softcap=3.0, return_softmax_lse=True, fa_version=2)
    args = fake_ops.last("varlen_fwd")
    assert args["q"].shape == (3, 8, 128) and args["q"].data_ptr() == q.data_ptr()
    assert args["cu_seqlens_q"].tolist() == [0, 1, 2, 3]
    assert args["seqused_k"] is seqlens and args["block_table"] is block_table
    assert (args["max_seqlen_q"], args["max_seqlen_k"]) == (1, 20)
    assert args["softmax_scale"] == 0.2 and args["softcap"] == 3.0 and args["is_causal"] is True
    assert out.shape == (3, 1, 8, 128) and lse.shape == (3, 8, 1)


def test_kvcache_lse_layout():
    from vllm_flash_attn.flash_attn_interface import batched_lse

    # Varlen LSE of 2 heads x (3 sequences x 2 queries): entry = 100 * head + token.
    lse = torch.arange(2).view(2, 1) * 100 + torch.arange(6).view(1, 6)
    got = batched_lse(lse, batch=3, seqlen_q=2)
    assert got.shape == (3, 2, 2)
    assert got[2, 1].tolist() == [104, 105] and got[0, 0].tolist() == [0, 1]


def test_kvcache_batched_cache_is_one_page_per_sequence(describe, fake_ops):
    from vllm_flash_attn import flash_attn_with_kvcache

    describe(caps=(AMPERE,))
    q = torch.randn(2, 3, 4, 128).to(torch.bfloat16)
    cache = torch.randn(5, 32, 4, 128).to(torch.bfloat16)
    out = flash_attn_with_kvcache(q, cache, cache, cache_seqlens=7,
                                  cache_batch_idx=torch.tensor([4, 1], dtype=torch.int32),
                                  fa_version=2)
    args = fake_ops.last("varlen_fwd")
    assert args["block_table"].tolist() == [[4], [1]] and args["seqused_k"].tolist() == [7, 7]
    assert args["cu_seqlens_q"].tolist() == [0, 3, 6] and args["max_seqlen_k"] == 7
    assert out.shape == (2, 3, 4, 128)


def test_kvcache_refuses_what_the_wheel_cannot_do(describe, fake_ops):
    from vllm_flash_attn import flash_attn_with_kvcache

    describe(caps=(AMPERE,))
    q = torch.randn(1, 1, 2, 128).to(torch.bfloat16)
    cache = torch.randn(1, 16, 2, 128).to(torch.bfloat16)
    with pytest.raises(NotImplementedError, match="k is not supported; .*no append-KV"):
        flash_attn_with_kvcache(q, cache, cache, k=q, v=q, cache_seqlens=1)
    assert fake_ops.calls == []


def test_kvcache_passes_the_rest_of_the_declared_parameters_through(describe, fake_ops):
    """Its keyword-only arguments are those of flash_attn_varlen_func's declaration
    (vendored_flash_attn.call.arguments) it does not set itself: passed as given, on FA3 here; anything
    else is a TypeError, as for a Python function."""
    from vllm_flash_attn import flash_attn_with_kvcache

    describe(caps=(HOPPER,))
    q = torch.randn(2, 1, 8, 128).to(torch.float8_e4m3fn)
    cache = torch.randn(4, 16, 2, 128).to(torch.float8_e4m3fn)
    descale = torch.ones(2, 2)
    descales = dict(q_descale=descale, k_descale=descale, v_descale=descale)
    flash_attn_with_kvcache(q, cache, cache, cache_seqlens=7, block_table=torch.tensor([[0], [1]], dtype=torch.int32),
                            fa_version=3, num_splits=2, **descales)
    args = fake_ops.last("fwd")
    assert args["q_descale"] is descale and args["v_descale"] is descale and args["num_splits"] == 2
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['not_a_parameter'\]"):
        flash_attn_with_kvcache(q, cache, cache, cache_seqlens=7, not_a_parameter=1)


def test_summary_json_is_serialisable(tmp_path):
    path = _junit(tmp_path, _case("test_a[1]"))
    json.dumps(upstream_summary.summarize(upstream_summary.read_junit(path)))
