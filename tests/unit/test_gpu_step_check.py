"""The GPU step's verdict (.buildkite/scripts/check_gpu_junit.py): a step whose GPU tests
were all skipped fails; one where they ran passes. Against JUnit files pytest writes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".buildkite/scripts/check_gpu_junit.py"


def _load():
    spec = importlib.util.spec_from_file_location("check_gpu_junit", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check = _load()


def _pytest_junit(args: list, out: Path, cwd: Path) -> Path:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    subprocess.run([sys.executable, "-m", "pytest", *args, "-q", "-p", "no:cacheprovider",
                    f"--junitxml={out}"], cwd=cwd, env=env, capture_output=True, text=True,
                   timeout=300)
    assert out.is_file(), f"pytest wrote no report for {args}"
    return out


@pytest.fixture(scope="module")
def all_skipped(tmp_path_factory) -> Path:
    """The real GPU suite on this GPU-less machine: every test skips."""
    out = tmp_path_factory.mktemp("junit") / "gpu.xml"
    return _pytest_junit([str(ROOT / "tests/gpu/test_selector_gpu.py"), "-m", "gpu"], out, ROOT)


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> Path:
    """A run where GPU tests passed and some were skipped for a version."""
    folder = tmp_path_factory.mktemp("suite")
    (folder / "test_ran.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("n", range(3))
        def test_kernel(n):
            assert n >= 0

        def test_fa3_only():
            pytest.skip("FA3 not usable: FA3 needs a Hopper GPU (sm_90), this GPU is 8.0")
    """))
    return _pytest_junit([str(folder)], folder / "gpu.xml", folder)


def test_all_skipped_fails_the_step(all_skipped, capsys):
    outcome = check.read_junit(all_skipped)
    assert outcome.passed == 0 and outcome.skipped >= 5
    assert check.main([str(all_skipped)]) == 1
    err = capsys.readouterr().err
    assert "skipped as a whole on this agent: GPU tests: " in err


def test_tests_that_ran_pass_the_step(ran, capsys):
    outcome = check.read_junit(ran)
    assert (outcome.passed, outcome.skipped, outcome.failed) == (3, 1, 0)
    assert check.main([str(ran)]) == 0
    assert "GPU tests: 3 passed, 1 skipped, 0 failed" in capsys.readouterr().out
    # The FA2 step may skip FA3 tests; the FA3 step must not.
    assert check.main([str(ran), "--forbid-skip", "FA2 not usable"]) == 0
    assert check.main([str(ran), "--forbid-skip", "FA3 not usable"]) == 1
    assert check.main([str(ran), "--min-passed", "4"]) == 1


def test_verdicts():
    Outcome = check.Outcome
    assert "tested nothing" in check.verdict(Outcome())
    assert "2 GPU test(s) failed" in check.verdict(Outcome(passed=5, failed=2))
    assert check.verdict(Outcome(passed=5)) is None
    only_skips = Outcome(skipped=4)
    only_skips.skip_reasons["FA2 not usable: module failed to import"] = 4
    assert "only 0 GPU test(s) passed" in check.verdict(only_skips)


def test_missing_or_broken_report_fails(tmp_path):
    assert check.main([str(tmp_path / "none.xml")]) == 1
    (tmp_path / "bad.xml").write_text("<testsuites><testcase")
    assert check.main([str(tmp_path / "bad.xml")]) == 1


def test_gpu_step_uses_the_check():
    script = (ROOT / ".buildkite/scripts/gpu-test.sh").read_text()
    assert "torch.cuda.is_available()" in script
    assert 'check_gpu_junit.py" "$junit"' in script
    assert 'exit "$check"' in script
    assert "|| true\n" not in script.split('check_gpu_junit.py" "$junit"', 1)[1]


@pytest.mark.parametrize("built, capability, forbidden", [
    # the Hopper step of a release wheel: every family runs there, none may skip
    ({"fa2": True, "fa3": True, "fa4": True}, (9, 0), ["FA2 not usable", "FA3 not usable", "FA4 not usable"]),
    # the A100 step: FA3 and FA4 do not run on sm80; their skips say why and are allowed
    ({"fa2": True, "fa3": True, "fa4": True}, (8, 0), ["FA2 not usable"]),
    # a wheel without FA4: its tests skip with the reason, and may
    ({"fa2": True, "fa3": True, "fa4": False}, (9, 0), ["FA2 not usable", "FA3 not usable"]),
    # Blackwell: FA4 (FA3 is Hopper only); sm120 is excluded for FA4 at the pin
    ({"fa2": True, "fa3": True, "fa4": True}, (10, 0), ["FA2 not usable", "FA4 not usable"]),
    ({"fa2": True, "fa3": True, "fa4": True}, (12, 0), ["FA2 not usable"]),
])
def test_the_forbidden_skips_come_from_the_families_the_wheel_holds(built, capability, forbidden):
    assert check.held_family_skips(built, capability) == forbidden


def test_an_fa4_skip_fails_the_hopper_step_of_a_wheel_that_holds_fa4(tmp_path, capsys):
    junit = tmp_path / "junit.xml"
    junit.write_text(textwrap.dedent("""\
        <testsuites><testsuite>
          <testcase classname="t" name="fa3"/>
          <testcase classname="t" name="fa4"><skipped message="FA4 not usable: nvidia-cutlass-dsl is not installed"/></testcase>
        </testsuite></testsuites>"""))
    forbidden = check.held_family_skips({"fa2": True, "fa3": True, "fa4": True}, (9, 0))
    assert check.main([str(junit), *[f"--forbid-skip={text}" for text in forbidden]]) == 1
    assert "1 GPU test(s) skipped with 'FA4 not usable'" in capsys.readouterr().err
    # the step's own part alone (what gpu-test.sh forbade before) let it pass
    assert check.main([str(junit), "--forbid-skip", "FA3 not usable"]) == 0
