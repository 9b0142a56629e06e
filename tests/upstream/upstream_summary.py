"""Summary of a run of upstream's test file: per test function pass/fail/skip counts from
the JUnit XML, failure reasons grouped, and each failure classified as

* ``upstream-file``: a case upstream's file itself gets wrong (KNOWN_UPSTREAM_DEFECTS),
* ``not-built``: this wheel refused a kernel it was built without (a build choice): the
  refusal names the kernel (a dtype, head dim, feature or a whole FA version) and the
  wheel's build info confirms it was not built,
* ``unexpected``: anything else - a defect of this package until shown otherwise; also a
  refusal of a kernel the build info says was built (a wrong refusal), and any refusal when
  no build info was given to check it against.

The JUnit XML carries, per test case, the properties upstream_plugin.py records
(``param:<name>`` and ``api_calls``). Used by run_upstream_tests.py; tested on CPU with a
synthetic XML in tests/unit/test_upstream_adapter.py.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional


@dataclass(frozen=True)
class KnownDefect:
    """A case of upstream's file that is wrong in itself: which cases, the failure it gives
    (a regex on the failure message, so another failure of the same case is not excused),
    and why."""

    function: str
    applies: Callable[[Dict[str, str]], bool]
    message: str
    why: str


KNOWN_UPSTREAM_DEFECTS = [
    KnownDefect(
        function="test_varlen_with_paged_kv",
        applies=lambda p: p.get("aot_schedule") == "True" and p.get("fa_version") == "3",
        message=r"scheduler.?metadata",
        why=("upstream's test computes the FA3 scheduler metadata with max_seqlen_q=1 (and no "
             "page_size) but calls flash_attn_varlen_func with queries up to 129 tokens long "
             "(seq_lens (1, 1328), (5, 18), (129, 463)) on a paged cache: metadata for another "
             "call shape, which FA3 cannot use (upstream's C++: 'scheduler_metadata must have "
             "shape (metadata_size)')"),
    ),
    KnownDefect(
        function="test_flash_attn_with_paged_kv",
        applies=lambda p: p.get("aot_schedule") == "True" and p.get("fa_version") == "3",
        message=r"scheduler.?metadata",
        why=("upstream's test computes the FA3 scheduler metadata without page_size for a call "
             "on a paged cache (block_size 16/32): metadata for another call shape"),
    ),
]

def _built_dtype(torch_name: str) -> Optional[str]:
    """The build-info name ("fp16") of a dtype as a refusal shows it ("float16")."""
    import torch
    from vendored_flash_attn.declaration.kernels import dtype_name

    dtype = getattr(torch, torch_name, None)
    return dtype_name(dtype) if isinstance(dtype, torch.dtype) else None


@dataclass(frozen=True)
class Refusal:
    """One of this package's refusals of a kernel the wheel lacks (kernels.py, selector.py):
    the message's pattern (its ``version`` group names the component) and what the build
    info must say for the refusal to be right, given the component's build info."""

    pattern: re.Pattern
    not_built: Callable[[dict, re.Match], bool]


NOT_BUILT_REFUSALS = [
    Refusal(re.compile(r"this wheel was built without FA(?P<version>[23])\b"),
            lambda comp, m: not comp.get("built")),
    Refusal(re.compile(r"this wheel has no FA(?P<version>[23]) kernels for (?P<dtype>\w+)"),
            lambda comp, m: _built_dtype(m["dtype"]) not in comp.get("dtypes", ())),
    Refusal(re.compile(r"needs the FA(?P<version>2) hdim(?P<dim>\d+) kernels"),
            lambda comp, m: int(m["dim"]) not in comp.get("head_dims", ())),
    Refusal(re.compile(r"head size (?P<size>\d+) is larger than the largest FA(?P<version>3) head dim"),
            lambda comp, m: int(m["size"]) > max(comp.get("head_dims") or [0])),
    # FA3's features (softcap, paged, split, local, hdimdiff) and FA2's sparse kernels.
    Refusal(re.compile(r"needs the FA(?P<version>[23]) '(?P<feature>\w+)' kernels"),
            lambda comp, m: m["feature"] not in comp.get("features", ())),
    Refusal(re.compile(r"the FA(?P<version>2) sparse kernels are built for head dim (?P<dim>\d+) "
                       r"only, which this wheel's FA2 selection left out"),
            lambda comp, m: int(m["dim"]) not in comp.get("head_dims", ())),
]


@dataclass
class Case:
    function: str
    name: str
    outcome: str  # passed | failed | error | skipped
    message: str
    params: Dict[str, str]
    api_calls: Optional[int]


def _function_of(name: str) -> str:
    return name.split("[", 1)[0]


def read_junit(path) -> List[Case]:
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        name = tc.get("name", "")
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        params = {k[len("param:"):]: v for k, v in props.items() if k.startswith("param:")}
        calls = props.get("api_calls")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = tc.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = node.get("message") or (node.text or "")
                break
        cases.append(Case(_function_of(name), name, outcome, message.strip(), params,
                          int(calls) if calls is not None else None))
    return cases


def reason_of(message: str) -> str:
    """The failure's gist: the first line naming an exception or assertion, shortened, with
    numbers and tensor reprs collapsed so equal reasons group."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    line = next((ln for ln in lines if re.match(r"^(E\s+)?\w*(Error|Exception|assert)", ln)),
                lines[0] if lines else "(no message)")
    line = re.sub(r"^E\s+", "", line)
    line = re.sub(r"tensor\(.*", "tensor(...)", line)
    line = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", line)
    return line[:240]


def classify(case: Case, build: Optional[dict]) -> tuple[str, str]:
    """(category, explanation) of a failed or erroring case; ``build`` is the tested wheel's
    build_info.json (None: not known, so no refusal can be excused). A refusal of a kernel is
    judged first, against the build info, even in a case upstream's file gets wrong: the
    known defect's message (its scheduler metadata) also appears in get_scheduler_metadata's
    own refusals, and a wrong one of those must not pass as the file's fault."""
    refused = _judge_refusal(case, build)
    if refused is not None:
        return refused
    for defect in KNOWN_UPSTREAM_DEFECTS:
        if (case.function == defect.function and defect.applies(case.params)
                and re.search(defect.message, case.message, re.IGNORECASE)):
            return "upstream-file", defect.why
    return "unexpected", ""


def _judge_refusal(case: Case, build: Optional[dict]) -> Optional[tuple[str, str]]:
    """(category, explanation) when the case failed on one of this package's refusals of a
    kernel, else None."""
    for refusal in NOT_BUILT_REFUSALS:
        match = refusal.pattern.search(case.message)
        if match is None:
            continue
        if build is None:
            return "unexpected", "a refusal of a kernel, but no build info to check it against"
        name = f"fa{match['version']}"
        comp = build.get(name) or {}
        if refusal.not_built(comp, match):
            return "not-built", "this wheel was built without the kernels the case needs"
        built = {key: comp.get(key) for key in ("built", "dtypes", "head_dims", "features")}
        return "unexpected", (f"the wheel refused a kernel its build info says was built "
                              f"({name}: {built}): a wrong refusal")
    return None


def summarize(cases: List[Case], build: Optional[dict] = None) -> dict:
    """Counts and classified failures of ``cases``; ``build`` is the tested wheel's
    build_info.json, which a refusal of a kernel must agree with to be excused."""
    functions: Dict[str, Counter] = defaultdict(Counter)
    groups: Dict[tuple, dict] = {}
    skips: Counter = Counter()
    for case in cases:
        counts = functions[case.function]
        counts[case.outcome] += 1
        if case.outcome == "passed" and case.api_calls == 0:
            counts["passed_without_api_call"] += 1
        if case.outcome == "skipped":
            skips[(case.function, reason_of(case.message))] += 1
        if case.outcome not in ("failed", "error"):
            continue
        category, why = classify(case, build)
        key = (category, case.function, reason_of(case.message))
        group = groups.setdefault(key, dict(category=category, function=case.function,
                                            reason=key[2], explanation=why, count=0, examples=[]))
        group["count"] += 1
        if len(group["examples"]) < 3:
            group["examples"].append(case.name)
    totals = Counter()
    for counts in functions.values():
        totals.update(counts)
    failures = sorted(groups.values(), key=lambda g: (g["category"] != "unexpected", -g["count"]))
    unexpected = sum(g["count"] for g in failures if g["category"] == "unexpected")
    return dict(
        functions={name: {k: counts.get(k, 0) for k in ("passed", "failed", "error", "skipped",
                                                         "passed_without_api_call")}
                   for name, counts in sorted(functions.items())},
        totals={k: totals.get(k, 0) for k in ("passed", "failed", "error", "skipped",
                                               "passed_without_api_call")},
        failures=failures,
        skips=[dict(function=f, reason=r, count=n) for (f, r), n in sorted(skips.items())],
        unexpected=unexpected,
        ok=unexpected == 0 and bool(cases),
    )


def render(summary: dict) -> str:
    out = []
    width = max([len(n) for n in summary["functions"]] + [8])
    out.append(f"{'function':<{width}}  passed  failed   error  skipped  (passed without an API call)")
    for name, c in list(summary["functions"].items()) + [("total", summary["totals"])]:
        out.append(f"{name:<{width}}  {c['passed']:6}  {c['failed']:6}  {c['error']:6}  "
                   f"{c['skipped']:7}  ({c['passed_without_api_call']})")
    for skip in summary["skips"]:
        out.append(f"skipped {skip['count']} x {skip['function']}: {skip['reason']}")
    for group in summary["failures"]:
        out.append(f"\n[{group['category']}] {group['count']} x {group['function']}: {group['reason']}")
        if group["explanation"]:
            out.append(f"    why: {group['explanation']}")
        out.append(f"    e.g. {group['examples'][0]}")
    out.append(f"\nunexpected failures: {summary['unexpected']}")
    return "\n".join(out)
