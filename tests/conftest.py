"""Shared by every test folder: tests/support on the import path, and the synthetic
upstream the build and packaging tests compile."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support.leftovers import GRACE_S, Leftovers  # noqa: E402
from support.load_check import LoadCheck, hogs_wanted  # noqa: E402
from support.synthetic_upstream import SyntheticUpstream, make_synthetic_upstream  # noqa: E402


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory) -> SyntheticUpstream:
    if shutil.which("git") is None:
        pytest.fail("git is required for the build tests (the build fetches with git)")
    return make_synthetic_upstream(tmp_path_factory.mktemp("upstream"))


# --- tiers that must run --------------------------------------------------------------------
# pytest passes a run in which every test was deselected, skipped or never collected (a
# broken conftest, a wrong path, a -k that matches nothing): .ci/run, CI's CPU step, asks
# (--require-cpu-tiers) that each tier below ran at least one test, and fails the run
# otherwise, with the tiers in the closing line. The GPU tier skips on a CPU machine; on a
# GPU machine .buildkite/scripts/check_gpu_junit.py checks that it ran.

HERE = Path(__file__).resolve().parent
CPU_TIERS = {
    "unit": "unit",
    "build": "build",
    "dist": "dist",
    # upstream's test file runs on a GPU (tests/upstream/run_upstream_tests.py); its runner,
    # summary and adapter are tested on CPU here.
    "upstream-adapter": "unit/test_upstream_adapter.py",
}
REPORTED_TIERS = {**CPU_TIERS, "gpu": "gpu"}
EMPTY_TIERS_STAT = "required tier(s) ran nothing"


def pytest_addoption(parser):
    parser.addoption("--require-cpu-tiers", action="store_true",
                     help="fail the run when a CPU test tier (" + ", ".join(CPU_TIERS)
                          + ") ran no test (what .ci/run passes)")
    parser.addoption("--load-check", nargs="?", const="auto", default=None, metavar="N",
                     help="run the tests with N busy processes beside them (2 x the CPUs when N is not "
                          "given), started and stopped by the session (tests/support/load_check.py)")
    parser.addoption("--leftover-grace", type=float, default=GRACE_S, metavar="SECONDS",
                     help="how long processes the tests started may take to end after the session before "
                          "they are named, stopped and fail the run (tests/support/leftovers.py)")


class TierCount:
    """Per tier: tests that ran (their call phase, or a setup that failed) and skipped."""

    def __init__(self, rootpath: Path):
        self.rootpath = rootpath
        self.ran = {tier: 0 for tier in REPORTED_TIERS}
        self.skipped = {tier: 0 for tier in REPORTED_TIERS}

    def tiers_of(self, nodeid: str) -> list[str]:
        path = (self.rootpath / nodeid.split("::", 1)[0]).resolve()
        return [tier for tier, where in REPORTED_TIERS.items() if path.is_relative_to(HERE / where)]

    def pytest_runtest_logreport(self, report):
        ran = report.when == "call" or (report.when == "setup" and report.failed)
        skipped = report.skipped and report.when in ("setup", "call")
        if ran or skipped:
            for tier in self.tiers_of(report.nodeid):
                (self.ran if ran and not skipped else self.skipped)[tier] += 1

    def empty(self) -> list[str]:
        return [tier for tier in CPU_TIERS if self.ran[tier] == 0]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        # Runs inside the terminal reporter's sessionfinish wrapper: before its summary.
        if session.exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            return
        empty = self.empty()
        if empty:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:  # the closing line counts them: "..., 2 required tier(s) ran nothing"
                reporter.stats.setdefault(EMPTY_TIERS_STAT, []).extend(empty)

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.write_sep("=", "test tiers (--require-cpu-tiers)")
        for tier, where in REPORTED_TIERS.items():
            line = (f"{tier} (tests/{where}): {self.ran[tier]} ran, {self.skipped[tier]} skipped"
                    + ("" if tier in CPU_TIERS else " (not required on CPU)"))
            if tier in self.empty():
                terminalreporter.write_line(f"FAILED {line}: this tier must run in CI; see why "
                                            "its tests were deselected, skipped or not collected",
                                            red=True)
            else:
                terminalreporter.write_line(line)


# --- skips, one line per reason --------------------------------------------------------------
# pytest's -ra (pyproject.toml's addopts) ends a CPU run with a SKIPPED line per test location
# (37 of them in .ci/run, the GPU tier's), some reading like a bug: a parametrisation whose
# list of cases is empty for this build (the GPU tests take their cases from the installed
# build info) is skipped as "got empty parameter set for (...)". So skips are summed up by
# reason instead, one line each, with the tests' count; `-v` keeps pytest's own lines.
EMPTY_PARAMETERS = re.compile(r"^got empty parameter set\b")
EMPTY_PARAMETERS_REASON = ("no case for this build: their cases come from the installed build info, which lists "
                           "none for them")


def skip_reason(report) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    reason = reason.removeprefix("Skipped: ")
    return EMPTY_PARAMETERS_REASON if EMPTY_PARAMETERS.match(reason) else reason


class SkipSummary:
    """Takes the skips out of pytest's short summary and says them grouped by reason."""

    def pytest_terminal_summary(self, terminalreporter):
        # Runs inside the terminal reporter's own, before its short summary.
        terminalreporter.reportchars = terminalreporter.reportchars.replace("s", "")
        reasons: dict[str, list[str]] = {}
        for report in terminalreporter.stats.get("skipped", []):
            reasons.setdefault(skip_reason(report), []).append(report.nodeid.split("[", 1)[0].split("::")[-1])
        if not reasons:
            return
        terminalreporter.write_sep("=", "skipped, by reason")
        for reason, tests in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
            names = sorted(set(tests))
            which = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            terminalreporter.write_line(f"{len(tests)} skipped ({which}): {reason}")


def is_xdist_worker(config) -> bool:
    """A pytest-xdist worker (.ci/run runs the suite on two): the session-wide checks below run
    in the controller alone, which sees every worker's reports; its session marker (Leftovers)
    reaches the workers and what they start through their environment."""
    return hasattr(config, "workerinput")


def pytest_configure(config):
    if is_xdist_worker(config):
        return
    if not config.getoption("collectonly"):
        # every process the tests start, named and stopped if it outlives the session
        config.pluginmanager.register(Leftovers(config.getoption("--leftover-grace")), "vfa-leftovers")
        if config.getoption("--load-check"):
            try:
                count = hogs_wanted(config.getoption("--load-check"))
            except ValueError as exc:
                raise pytest.UsageError(str(exc)) from None
            config.pluginmanager.register(LoadCheck(count), "vfa-load-check")
    if config.getoption("--require-cpu-tiers") and not config.getoption("collectonly"):
        config.pluginmanager.register(TierCount(config.rootpath), "vfa-tier-count")
    if "s" in config.getoption("reportchars", "") or "a" in config.getoption("reportchars", ""):
        if config.getoption("verbose") <= 0:
            config.pluginmanager.register(SkipSummary(), "vfa-skip-summary")
