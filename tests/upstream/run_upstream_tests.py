#!/usr/bin/env python3
"""Run upstream's tests/test_vllm_flash_attn.py (at the pinned commit) against the installed
vendored-flash-attn wheel, through the ``vllm_flash_attn`` adapter in shim/, and report
per test function.

    python tests/upstream/run_upstream_tests.py --git-repo <clone or mirror of upstream> \
        [--out DIR] [-- <extra pytest arguments>]
    python tests/upstream/run_upstream_tests.py --file <path to test_vllm_flash_attn.py> ...

The file is never part of this repository: it is read from a git repository that holds the
pinned commit (``git show <pin>:tests/test_vllm_flash_attn.py``; the pin is read from
vendor/flash-attention/pin.json), or given as a path, and its git blob hash is checked
against the pinned file's (``--allow-other-file`` runs another version anyway, and says so).
It is copied into a scratch folder and run there with the adapter first on sys.path, so
neither this repository's pytest configuration nor its source tree is involved: the
installed wheel is what runs. Writes <out>/upstream-junit.xml and <out>/upstream-summary.json
(per-function counts, failure reasons grouped and classified, see upstream_summary.py) and
prints the summary. Exit status: 0 when every failure is one upstream's file gets wrong or
a kernel this wheel was built without; 1 otherwise; 2 when it could not run at all.

What the adapter does (shim/vllm_flash_attn): maps upstream's module names onto
vendored_flash_attn, and provides ``flash_attn_with_kvcache``, which upstream's test file
imports but upstream's interface no longer defines at the pin (upstream's own file fails at
import there), implemented over this package's ``flash_attn_varlen_func`` with the contract
upstream's wrapper had before it was removed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
UPSTREAM_PATH = "tests/test_vllm_flash_attn.py"
# git blob hash of UPSTREAM_PATH at the pinned commit (git rev-parse <pin>:<path>).
PINNED_FILES = {"617264c1c7955c9e84817654ebeedff069f3c5f1": "ddc2ea038321103107b8c9689500083a7446b917"}
ADAPTER_NOTE = (
    "adapter: vllm_flash_attn -> vendored_flash_attn (tests/upstream/shim); "
    "flash_attn_with_kvcache is NOT upstream's at the pin (upstream removed it, its test file "
    "still imports it): the adapter provides it over vendored_flash_attn.flash_attn_varlen_func "
    "with upstream's former contract (batched q, paged or batched cache, cache_seqlens)")
GIT_TIMEOUT_S = 120

sys.path.insert(0, str(HERE))
from upstream_summary import read_junit, render, summarize  # noqa: E402


class RunnerError(RuntimeError):
    """The run cannot start; the message says what to do."""


def git_blob_hash(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def pinned_commit(pin_file: Path) -> str:
    try:
        return json.loads(pin_file.read_text())["flash_attention"]["commit"]
    except (OSError, KeyError, ValueError) as exc:
        raise RunnerError(f"cannot read the pinned commit from {pin_file}: {exc}") from exc


def read_from_git(repo: str, commit: str) -> bytes:
    try:
        result = subprocess.run(["git", "-C", repo, "show", f"{commit}:{UPSTREAM_PATH}"],
                                capture_output=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RunnerError(f"git show in {repo} failed: {exc}") from exc
    if result.returncode != 0:
        raise RunnerError(f"{repo} has no {UPSTREAM_PATH} at {commit}: "
                          f"{result.stderr.decode(errors='replace').strip()}; give a clone or mirror "
                          "of vllm-project/flash-attention that holds the pinned commit, or --file")
    return result.stdout


def load_upstream_file(args) -> tuple[bytes, dict]:
    commit = args.commit or pinned_commit(args.pin)
    if args.file:
        try:
            data = Path(args.file).read_bytes()
        except OSError as exc:
            raise RunnerError(f"cannot read --file {args.file}: {exc}") from exc
        source = f"file {args.file}"
    elif args.git_repo:
        data = read_from_git(args.git_repo, commit)
        source = f"git {args.git_repo} {commit}:{UPSTREAM_PATH}"
    else:
        raise RunnerError("no upstream test file: pass --git-repo <clone or mirror of upstream "
                          f"holding {commit}> or --file <path to {Path(UPSTREAM_PATH).name}>; "
                          "the file is not part of this repository")
    blob = git_blob_hash(data)
    expected = PINNED_FILES.get(commit)
    info = dict(source=source, commit=commit, blob=blob, expected_blob=expected,
                matches_pin=blob == expected)
    if blob != expected and not args.allow_other_file:
        raise RunnerError(f"the upstream test file ({source}) has git blob {blob}, but the pinned "
                          f"file at {commit} is {expected}; pass --allow-other-file to run it anyway")
    return data, info


def preflight(python: str, env: dict, cwd: Path) -> dict:
    """What the run needs, checked first so a missing piece reads as such, not as 1000
    collection errors: einops (upstream's file imports it) and the installed wheel."""
    code = ("import json, einops, torch, vendored_flash_attn as v\n"
            "from vendored_flash_attn.declaration.build_info import load_build_info\n"
            "b = load_build_info()\n"
            "print(json.dumps({'package': v.__file__, 'torch': torch.__version__, "
            "'cuda_available': torch.cuda.is_available(), "
            "'fa2': {'dtypes': b.fa2.dtypes, 'head_dims': b.fa2.head_dims, 'features': b.fa2.features}, "
            "'fa3': {'built': b.fa3.built, 'dtypes': b.fa3.dtypes, 'head_dims': b.fa3.head_dims, "
            "'features': b.fa3.features}, 'build': b.raw}))\n")
    result = subprocess.run([python, "-c", code], env=env, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        err = result.stderr.strip().splitlines()[-1:] or ["?"]
        hint = ("pip install einops (upstream's test file imports it)" if "einops" in err[0]
                else "install the built vendored-flash-attn wheel into this Python")
        raise RunnerError(f"cannot run upstream's tests here: {err[0]}; {hint}")
    return json.loads(result.stdout)


def adapter_env(environ) -> dict:
    """The environment of the pytest run: the adapter (and the plugin) first on sys.path."""
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE / "shim"), str(HERE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def pytest_command(python: str, scratch: Path, junit: Path, extra) -> list:
    """pytest on the copy in ``scratch`` (see stage()), with its own ini and rootdir so this
    repository's pytest configuration does not apply."""
    return [python, "-m", "pytest", str(scratch / Path(UPSTREAM_PATH).name),
            "-c", str(scratch / "pytest.ini"), "--rootdir", str(scratch), "-p", "upstream_plugin",
            "-p", "no:cacheprovider", f"--junitxml={junit}", "-q", "-rfE", *extra]


def stage(scratch: Path, data: bytes) -> None:
    (scratch / Path(UPSTREAM_PATH).name).write_bytes(data)
    (scratch / "pytest.ini").write_text("[pytest]\n")


def run(args) -> int:
    data, file_info = load_upstream_file(args)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(ADAPTER_NOTE)
    print(f"upstream file: {file_info['source']} (blob {file_info['blob']}, "
          f"{'the pinned file' if file_info['matches_pin'] else 'NOT the pinned file'})")
    junit = out / "upstream-junit.xml"
    junit.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="vfa-upstream-") as scratch:
        scratch = Path(scratch)
        stage(scratch, data)
        env = adapter_env(os.environ)
        machine = preflight(args.python, env, scratch)
        print(f"package: {machine['package']} (torch {machine['torch']})")
        if not machine["cuda_available"]:
            raise RunnerError("no CUDA GPU is visible to this Python; upstream's tests need one")
        command = pytest_command(args.python, scratch, junit, args.pytest_args)
        print("running:", " ".join(command), flush=True)
        code = subprocess.run(command, env=env, cwd=scratch).returncode
    if not junit.exists():
        raise RunnerError(f"pytest exited with {code} and wrote no JUnit XML")
    # The build info checks every refusal of a kernel (upstream_summary.classify).
    summary = summarize(read_junit(junit), build=machine["build"])
    summary.update(upstream_file=file_info, adapter=ADAPTER_NOTE, machine=machine, pytest_exit=code)
    (out / "upstream-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print()
    print(render(summary))
    print(f"\nwrote {junit} and {out / 'upstream-summary.json'}")
    return 0 if summary["ok"] else 1


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--git-repo", help="a local clone or bare mirror of upstream holding the pin")
    source.add_argument("--file", help=f"upstream's {Path(UPSTREAM_PATH).name}, fetched elsewhere")
    parser.add_argument("--commit", help="upstream commit (default: the pin)")
    parser.add_argument("--pin", type=Path, default=ROOT / "vendor/flash-attention/pin.json")
    parser.add_argument("--allow-other-file", action="store_true",
                        help="run a file whose blob is not the pinned one (reported)")
    parser.add_argument("--out", default=".results-upstream", help="where the XML and JSON go")
    parser.add_argument("--python", default=sys.executable, help="the Python with the wheel")
    parser.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except RunnerError as exc:
        print(f"run_upstream_tests: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
