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
* --forbid-held-skips (run by the interpreter the wheel is installed in, on the agent's GPU):
  the same for every family the installed wheel holds (its build info: FA2's and FA3's
  modules, FA4's subpackage) that runs on this GPU (the families' declared generations):
  "FA4 not usable" fails the Hopper step of a wheel that ships FA4, whatever the step's name;
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


def held_family_skips(built: dict[str, bool], capability: tuple[int, int]) -> list[str]:
    """The skip reasons a GPU of ``capability`` must not show for a wheel holding the
    families ``built`` says it holds: "<FAMILY> not usable" for each one built that runs on
    that GPU (cmake/knobs.json's families, through the installed package's registry)."""
    from vendored_flash_attn.declaration.families import registry

    return [f"{family.title} not usable" for family in registry()
            if built.get(family.name) and family.capability_problem(*capability, 0) is None]


def installed_held_family_skips() -> list[str]:
    """held_family_skips for the installed wheel on GPU 0 (needs torch and the wheel)."""
    import torch

    from vendored_flash_attn.declaration.build_info import load_build_info

    built = {name: component.built for name, component in load_build_info().components.items()}
    return held_family_skips(built, torch.cuda.get_device_capability(0))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("junit", type=Path, help="pytest --junitxml output of the GPU tests")
    parser.add_argument("--min-passed", type=int, default=1,
                        help="fail unless at least this many test cases passed (default 1)")
    parser.add_argument("--forbid-skip", action="append", default=[], metavar="TEXT",
                        help="fail when a case was skipped with a reason containing TEXT (repeatable)")
    parser.add_argument("--forbid-held-skips", action="store_true",
                        help="also forbid \"<FAMILY> not usable\" for every family the installed wheel holds "
                             "that runs on this GPU (run with the wheel's interpreter)")
    args = parser.parse_args(argv)
    if args.forbid_held_skips:
        held = installed_held_family_skips()
        print(f"forbidden skips (families this wheel holds that run on this GPU): {', '.join(held) or 'none'}")
        args.forbid_skip += held
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
