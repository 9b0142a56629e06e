#!/usr/bin/env python3
"""Fail a GPU step whose GPU tests did not actually run.

pytest exits 0 when every test is skipped, and the GPU tests skip themselves (with the
reason) on a machine without a usable GPU or compiled modules: an agent with a broken
driver would pass the step. This reads the step's JUnit XML and fails unless GPU tests
really ran:

* no test case at all: fail;
* any case skipped with the GPU conftest's suite-wide reason ("GPU tests: ...", set when
  no GPU, no build info or neither module is usable): fail, naming the reason;
* any case skipped with a reason containing a --forbid-skip text (the step for FA3 forbids
  "FA3 not usable": on a Hopper agent the FA3 tests must run, not skip): fail;
* fewer than --min-passed cases passed: fail;
* failures or errors: fail (pytest's exit status says so too; repeated for the summary).

Example (what .buildkite/scripts/gpu-test.sh runs after pytest):

    python .buildkite/scripts/check_gpu_junit.py junit-gpu-fa3.xml --forbid-skip "FA3 not usable"

prints "GPU tests: 212 passed, 31 skipped, 0 failed" and the skip reasons, and exits 1
with the reason when the step must fail.
"""

from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

SUITE_SKIP_PREFIX = "GPU tests: "  # tests/gpu/conftest.py, when nothing can run


@dataclass
class Outcome:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    skip_reasons: collections.Counter = field(default_factory=collections.Counter)


def read_junit(path: Path) -> Outcome:
    """Count the test cases of a pytest JUnit XML file by outcome."""
    outcome = Outcome()
    root = ElementTree.parse(path).getroot()
    for case in root.iter("testcase"):
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            outcome.failed += 1
        elif "skipped" in tags:
            outcome.skipped += 1
            skip = case.find("skipped")
            outcome.skip_reasons[skip.get("message", "") if skip is not None else ""] += 1
        else:
            outcome.passed += 1
    return outcome


def verdict(outcome: Outcome, min_passed: int = 1, forbid_skip: tuple = ()) -> str | None:
    """Why the step must fail; None when the GPU tests ran."""
    total = outcome.passed + outcome.failed + outcome.skipped
    if total == 0:
        return "no GPU test case in the report: the step tested nothing"
    suite_skips = [r for r in outcome.skip_reasons if r.startswith(SUITE_SKIP_PREFIX)]
    if suite_skips:
        return f"the GPU tests were skipped as a whole on this agent: {suite_skips[0]}"
    for text in forbid_skip:
        hits = [r for r in outcome.skip_reasons if text in r]
        if hits:
            count = sum(outcome.skip_reasons[r] for r in hits)
            return f"{count} GPU test(s) skipped with {text!r}, which this step must run: {hits[0]}"
    if outcome.failed:
        return f"{outcome.failed} GPU test(s) failed"
    if outcome.passed < min_passed:
        return (f"only {outcome.passed} GPU test(s) passed ({outcome.skipped} skipped); this step "
                f"needs at least {min_passed}")
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("junit", type=Path, help="pytest --junitxml output of the GPU tests")
    parser.add_argument("--min-passed", type=int, default=1,
                        help="fail unless at least this many test cases passed (default 1)")
    parser.add_argument("--forbid-skip", action="append", default=[], metavar="TEXT",
                        help="fail when a case was skipped with a reason containing TEXT (repeatable)")
    args = parser.parse_args(argv)
    if not args.junit.is_file():
        print(f"check_gpu_junit: {args.junit} does not exist: pytest did not write a report",
              file=sys.stderr)
        return 1
    try:
        outcome = read_junit(args.junit)
    except ElementTree.ParseError as exc:
        print(f"check_gpu_junit: {args.junit} is not valid JUnit XML: {exc}", file=sys.stderr)
        return 1
    print(f"GPU tests: {outcome.passed} passed, {outcome.skipped} skipped, {outcome.failed} failed")
    for reason, count in outcome.skip_reasons.most_common():
        print(f"  skipped {count:4d}x: {reason}")
    why = verdict(outcome, args.min_passed, tuple(args.forbid_skip))
    if why:
        print(f"check_gpu_junit: FAIL: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
