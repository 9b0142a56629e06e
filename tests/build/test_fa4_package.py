"""FA4 packaging (cmake/FA4Package.cmake) on the synthetic upstream: its tiny fake
flash_attn/cute is fetched with the pin, content-checked, staged as
vendored_flash_attn._fa4.cute with its imports rewritten, recorded, and shipped in the
wheel; `import vendored_flash_attn` does not import it. The CUDA units compile through
tests/support/fake_compiler.py (empty objects): only the packaging is under test here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.cmake_runner import PROJECT, checkout_copy, clean_env, configure, fetch_sources, run, tool

FAKE = Path(__file__).resolve().parents[1] / "support" / "fake_compiler.py"
CUTE = "vendored_flash_attn/_fa4/cute"
SHIPPED = {f"{CUTE}/{name}" for name in ("__init__.py", "interface.py", "utils.py", "cache_utils.py",
                                         "sub/__init__.py", "LICENSE", "AUTHORS", "README.md")}


@pytest.fixture(scope="module")
def wheel(sources, tmp_path_factory):
    root = tmp_path_factory.mktemp("fa4-wheel")
    empty = root / "empty.o"
    subprocess.run(["c++", "-x", "c++", "-c", "/dev/null", "-o", str(empty)], check=True)
    launcher = f"{sys.executable};{FAKE}"
    knobs = {**sources, "VFA_PRESET": "minimal", "CMAKE_CUDA_COMPILER_LAUNCHER": launcher,
             "CMAKE_CXX_COMPILER_LAUNCHER": launcher}
    project = checkout_copy(root / "checkout")
    result = run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v",
                  "-w", str(root / "dist"), *[f"-Ccmake.define.{k}={v}" for k, v in knobs.items()],
                  str(project)], env=clean_env(FAKE_EMPTY_OBJECT=str(empty)), timeout=1800)
    assert result.returncode == 0, result.output[-8000:]
    path = next((root / "dist").glob("vendored_flash_attn-*.whl"))
    site = root / "site"
    zipfile.ZipFile(path).extractall(site)
    return {"path": path, "names": set(zipfile.ZipFile(path).namelist()), "site": site, "log": result.output}


def test_the_wheel_ships_the_staged_subpackage_and_nothing_else_of_upstream(wheel):
    fa4 = {n for n in wheel["names"] if n.startswith("vendored_flash_attn/_fa4/")}
    assert fa4 == SHIPPED | {"vendored_flash_attn/_fa4/__init__.py", "vendored_flash_attn/_fa4/build_info.json"}
    assert not any(n.startswith("flash_attn/") for n in wheel["names"])
    # The stage's own (empty) parent __init__.py never replaces the package's.
    ours = (PROJECT / "python/vendored_flash_attn/__init__.py").read_text()
    assert (wheel["site"] / "vendored_flash_attn/__init__.py").read_text() == ours


def test_imports_are_rewritten_to_our_subpackage(wheel):
    interface = (wheel["site"] / CUTE / "interface.py").read_text()
    assert "import vendored_flash_attn._fa4.cute.utils as utils" in interface
    assert "from vendored_flash_attn._fa4.cute import (" in interface
    for name in SHIPPED:
        if name.endswith(".py"):
            assert "flash_attn.cute" not in (wheel["site"] / name).read_text().replace(
                "vendored_flash_attn._fa4.cute", ""), name


def test_the_build_records_fa4(wheel, synthetic):
    record = json.loads((wheel["site"] / "vendored_flash_attn/_fa4/build_info.json").read_text())
    assert record["package"] == "vendored_flash_attn._fa4.cute"
    sources = record["sources"]
    assert sources["commit"] == synthetic.fa_commit
    assert sources["verified"] is True and sources["matches_pin"] is True and sources["dirty"] is False
    assert record["staged"]["files"] == len(SHIPPED)
    assert record["staged"]["rewritten"] == 3  # __init__, interface, sub/__init__
    # No DSL in this venv: auto skips the precompile and says why, naming the fix.
    precompile = record["precompile"]
    assert (precompile["mode"], precompile["state"], precompile["runs"]) == ("auto", "skipped", [])
    assert "lacks FA4's packages (nvidia-cutlass-dsl" in precompile["reason"]
    assert 'pip install "vendored-flash-attn[fa4]"' in precompile["reason"]
    info = json.loads((wheel["site"] / "vendored_flash_attn/build_info.json").read_text())
    assert info["options"]["VFA_BUILD_FA4"]["value"] == "auto"
    # Nothing of this machine: the wheel's bytes must not depend on where the build's Python
    # (its venv, pip's isolated environment) or the build dir live.
    text = (wheel["site"] / "vendored_flash_attn/_fa4/build_info.json").read_text()
    for path in {sys.prefix, sys.base_prefix, sys.executable, str(wheel["path"].parents[1])}:
        assert path not in text, path
    assert precompile["reason"].startswith("Python 3.")  # named by version, not path


def test_import_leaves_fa4_alone_and_the_copy_never_touches_a_real_flash_attn(wheel, tmp_path):
    # A real flash_attn (with a cute subpackage) installed beside us: neither shadows the other.
    other = tmp_path / "other"
    (other / "flash_attn/cute").mkdir(parents=True)
    (other / "flash_attn/__init__.py").write_text("")
    (other / "flash_attn/cute/__init__.py").write_text("")
    (other / "flash_attn/cute/utils.py").write_text("ORIGIN = 'the real flash_attn'\n")
    code = (
        "import sys\n"
        "import vendored_flash_attn\n"
        "assert not [m for m in sys.modules if m.startswith('vendored_flash_attn._fa4')], 'imported FA4'\n"
        "from vendored_flash_attn._fa4.cute import sub\n"
        "print(sub.ORIGIN)\n"
        "assert 'flash_attn' not in sys.modules\n"
        "import flash_attn.cute.utils\n"
        "print(flash_attn.cute.utils.ORIGIN)\n"
    )
    result = run([sys.executable, "-c", code],
                 env=clean_env(PYTHONPATH=f"{wheel['site']}:{other}"))
    assert result.returncode == 0, result.output
    assert result.stdout.split("\n")[:2] == ["vendored_flash_attn._fa4.cute.utils", "the real flash_attn"]


def test_fa4_off_packages_nothing(sources, tmp_path):
    result = configure(tmp_path / "build", {**sources, "VFA_BUILD_FA4": "off"})
    assert result.returncode == 0, result.output[-5000:]
    assert "FA4 not packaged: VFA_BUILD_FA4=off" in result.output
    assert "vendored_flash_attn/_fa4" not in (tmp_path / "build/cmake_install.cmake").read_text()


def test_precompile_on_without_the_dsl_stops_the_configure_naming_the_fix(sources, tmp_path):
    result = configure(tmp_path / "build", {**sources, "VFA_FA4_PRECOMPILE": "on"})
    assert result.returncode != 0
    assert "VFA_FA4_PRECOMPILE=on, but Python 3." in result.text
    assert "vendored-flash-attn[fa4]" in result.text


def test_an_edited_fa4_source_in_the_cache_is_refused(synthetic, sources, tmp_path):
    cache = tmp_path / "cache"
    shutil.copytree(sources["VFA_SOURCE_CACHE"], cache, symlinks=True)
    interface = next((cache / "src").glob("flash-attention-*")) / "flash_attn/cute/interface.py"
    interface.write_text(interface.read_text() + "# edited\n")
    # A store of its own: an entry is read only to stage it (a staged copy already verified is reused).
    result = fetch_sources({"VFA_PIN_FILE": sources["VFA_PIN_FILE"], "VFA_SOURCE_CACHE": str(cache),
                            "VFA_STAGED_SOURCES": str(tmp_path / "staged")})
    assert result.returncode != 0
    assert "1 file changed (flash_attn/cute/interface.py)" in result.text


@pytest.mark.parametrize("interpreter, expected", [
    ("/nonexistent/python3", "'/nonexistent/python3' cannot run cmake/vfa_build/fa4/precompile.py"),
    # a Python that runs but lacks the DSL (this venv's): named, with the install command
    (sys.executable, "lacks FA4's packages (nvidia-cutlass-dsl"),
])
def test_a_precompile_python_that_cannot_compile_stops_the_configure(sources, tmp_path, interpreter, expected):
    # Each interpreter of VFA_FA4_PRECOMPILE_PYTHONS is asked for by name: one that cannot
    # compile FA4's kernels is a mistake, even where VFA_FA4_PRECOMPILE=auto would skip.
    result = configure(tmp_path / "build", {**sources, "VFA_FA4_PRECOMPILE_PYTHONS": interpreter})
    assert result.returncode != 0
    assert "VFA_FA4_PRECOMPILE_PYTHONS: " in result.text
    assert expected in result.text


NO_PACKAGING_PYTHON = '''#!{python}
"""A stand-in for a Python without packaging: it runs the build package's command with
packaging hidden from its imports."""
import runpy, sys
sys.modules["packaging"] = None  # find_spec says None, an import fails: as where it is not installed
args = [a for a in sys.argv[1:] if a not in ("-E", "-s")]
sys.argv = args
runpy.run_path(args[0], run_name="__main__")
'''


def test_a_precompile_python_without_packaging_is_named_with_what_it_lacks(sources, tmp_path):
    # Issue 43: it read "the build's Python ... lacks packaging: FA4 is not staged".
    fake = tmp_path / "python-without-packaging"
    fake.write_text(NO_PACKAGING_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    result = configure(tmp_path / "build", {**sources, "VFA_FA4_PRECOMPILE_PYTHONS": str(fake)})
    assert result.returncode != 0
    assert f"VFA_FA4_PRECOMPILE_PYTHONS: '{fake}': Python " in result.text
    assert "lacks packaging, which it needs to compile FA4's kernels" in result.text
    assert "-m pip install packaging" in result.text
    assert "FA4 is not staged" not in result.text and "the build's Python" not in result.text


def test_gqa_ratios_are_checked_like_every_list_knob(sources, tmp_path):
    result = configure(tmp_path / "build", {**sources, "VFA_FA4_PRECOMPILE_GQA_RATIOS": "4;9"})
    assert result.returncode != 0
    assert "VFA_FA4_PRECOMPILE_GQA_RATIOS" in result.text and "9" in result.text


FAKE_PRECOMPILE_PYTHON = '''#!{python}
"""A stand-in for a Python with the [fa4] extra: `probe` says it can precompile; `compile`
parses the build's arguments with the real script's own parser (as `plan`), logs the plan."""
import json, subprocess, sys
args = sys.argv[1:]
while args[0] in ("-E", "-s"):
    args.pop(0)
script = args[:2]  # the build package's entry point and the module it runs (fa4.precompile)
command, rest = args[2], args[3:]
if command == "probe":
    print(json.dumps({{"stage": "", "precompile": "", "python": "%d.%d" % sys.version_info[:2]}}))
    sys.exit(0)
kept, skip = [], False
for arg in rest:
    if skip:
        skip = False
    elif arg in ("--stage", "--out", "--record", "--report", "--jobs", "--share", "--kernel-timeout"):
        skip = True
    elif arg != "--best-effort":
        kept.append(arg)
plan = subprocess.run([sys.executable, *script, "plan", *kept], capture_output=True, text=True)
with open({log!r}, "a") as log:
    log.write(json.dumps({{"argv": rest, "rc": plan.returncode, "plan": plan.stdout.split(), "err": plan.stderr}}) + "\\n")
sys.exit(plan.returncode)
'''


def test_the_build_precompiles_the_wheels_selection_with_each_named_python(sources, tmp_path):
    # The build's command line reaches fa4/precompile.py's parser intact (the selection's
    # lists as one argument each) and asks for the minimal preset's kernels: head dim 128,
    # bf16 (e4m3: FP8 KV where FA4 takes it), paged (TMA and cp.async pages), split, local, GQA 1/4/8, LSE.
    log = tmp_path / "precompile.jsonl"
    fake = tmp_path / "fa4-python"
    fake.write_text(FAKE_PRECOMPILE_PYTHON.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    build = tmp_path / "build"
    result = configure(build, {**sources, "VFA_PRESET": "minimal", "VFA_FA4_PRECOMPILE": "on",
                               "VFA_FA4_PRECOMPILE_PYTHONS": str(fake)})
    assert result.returncode == 0, result.text[-5000:]
    assert "precompiled by VFA_FA4_PRECOMPILE_PYTHONS only" in result.text  # this venv has no DSL
    built = run([tool("cmake"), "--build", str(build), "--target", "vfa_fa4"])
    assert built.returncode == 0, built.text[-5000:]
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 1 and runs[0]["rc"] == 0, runs
    assert "--dtypes=bf16,e4m3" in runs[0]["argv"] and "--gqa-ratios=1,4,8" in runs[0]["argv"]
    jobs = runs[0]["argv"][runs[0]["argv"].index("--jobs") + 1]
    assert int(jobs) >= 1  # the build's job count: the precompile's workers
    # each held to the per-kernel bound (VFA_FA4_PRECOMPILE_KERNEL_TIMEOUT's default)
    assert runs[0]["argv"][runs[0]["argv"].index("--kernel-timeout") + 1] == "600"
    plan = runs[0]["plan"]
    # bf16: 3 layouts x 3 masks x 2 split x 2 LSE x 3 ratios; no e4m3 at head dim 128: FA4's
    # FP8 KV path is declared for head dim 512 only (the adapter refuses it at 128)
    assert len(plan) == 108
    assert "paged_cpasync-hd128-bf16-local-gqa8-split-lse" in plan
    assert not [name for name in plan if "e4m3" in name]


def test_fa3_knobs_choose_nothing_of_fa4_and_fa4_knobs_do(sources, tmp_path):
    # FA4's selection is its own (issue 36). FA3's knobs all changed; FA4's head dims, features
    # and ratios set to a small selection with its FP8 KV head dim 512, its dtypes left to the
    # preset: the build asks for FA4's values only (bf16 + e4m3 where FA3's say bf16).
    log = tmp_path / "precompile.jsonl"
    fake = tmp_path / "fa4-python"
    fake.write_text(FAKE_PRECOMPILE_PYTHON.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    build = tmp_path / "build"
    result = configure(build, {**sources, "VFA_PRESET": "minimal", "VFA_FA4_PRECOMPILE": "on",
                               "VFA_FA4_PRECOMPILE_PYTHONS": str(fake), "VFA_FA3_HEAD_DIMS": "64",
                               "VFA_FA3_DTYPES": "bf16", "VFA_FA3_FEATURES": "none",
                               "VFA_FA4_PRECOMPILE_HEAD_DIMS": "512", "VFA_FA4_PRECOMPILE_FEATURES": "paged",
                               "VFA_FA4_PRECOMPILE_GQA_RATIOS": "1"})
    assert result.returncode == 0, result.text[-5000:]
    built = run([tool("cmake"), "--build", str(build), "--target", "vfa_fa4"])
    assert built.returncode == 0, built.text[-5000:]
    (line,) = log.read_text().splitlines()
    record = json.loads(line)
    assert record["rc"] == 0, record
    for flag in ("--head-dims=512", "--dtypes=bf16,e4m3", "--features=paged", "--gqa-ratios=1"):
        assert flag in record["argv"], record["argv"]
    assert "paged-hd512-e4m3-full-gqa1" in record["plan"] and "varlen-hd512-bf16-causal-gqa1-lse" in record["plan"]


def test_every_python_of_the_build_shares_one_kernel_set_per_arch(sources, tmp_path):
    # Two named Pythons: both compile steps get the same --share file for the arch (the
    # first compiles and records its keys there, the second ships an index of those files),
    # and the file starts absent on every build (a stale one would alias to old kernels).
    log = tmp_path / "precompile.jsonl"
    fakes = []
    for name in ("fa4-python-a", "fa4-python-b"):
        fake = tmp_path / name
        fake.write_text(FAKE_PRECOMPILE_PYTHON.format(python=sys.executable, log=str(log)))
        fake.chmod(0o755)
        fakes.append(str(fake))
    build = tmp_path / "build"
    result = configure(build, {**sources, "VFA_PRESET": "minimal", "VFA_FA4_PRECOMPILE": "on",
                               "VFA_FA4_PRECOMPILE_PYTHONS": ";".join(fakes)})
    assert result.returncode == 0, result.text[-5000:]
    stale = build / "fa4/share/sm_90a.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    built = run([tool("cmake"), "--build", str(build), "--target", "vfa_fa4"])
    assert built.returncode == 0, built.text[-5000:]
    runs = [json.loads(line)["argv"] for line in log.read_text().splitlines()]
    assert len(runs) == 2
    shares = {argv[argv.index("--share") + 1] for argv in runs}
    assert shares == {str(stale)}
    assert not stale.exists()  # removed before the first Python compiled; the stand-ins write none


def test_a_precompile_beside_one_compiled_family_configures(sources, tmp_path):
    # FA3 off, FA4 precompiled: the precompile waits for the modules this build makes only
    # (it named FA3's absent target: "The dependency target _vendored_fa3_C ... does not exist").
    fake = tmp_path / "fa4-python"
    fake.write_text(FAKE_PRECOMPILE_PYTHON.format(python=sys.executable, log=str(tmp_path / "log.jsonl")))
    fake.chmod(0o755)
    result = configure(tmp_path / "build", {**sources, "VFA_PRESET": "minimal", "VFA_BUILD_FA3": "off",
                                            "VFA_FA4_PRECOMPILE": "on", "VFA_FA4_PRECOMPILE_PYTHONS": str(fake)})
    assert result.returncode == 0, result.text[-5000:]
    assert "FA3 not built: VFA_BUILD_FA3=off" in result.text and "precompile: on sm_90a" in result.text


@pytest.fixture(scope="module", params=["auto", "off"])
def fa4_only_wheel(request, synthetic, tmp_path_factory):
    """A Blackwell-only deployment's wheel, built through the real build (pip, no isolation):
    TORCH_CUDA_ARCH_LIST=10.0, FA2 and FA3 off, FA4's precompile as the param says (auto: the
    build's Python here has no DSL, so it is skipped and says why). No compiler launcher: an FA4
    wheel compiles no CUDA or C++ unit at all. The checkout's pin is the synthetic one, so the
    release gate's script checks it against the pin it was built from."""
    root = tmp_path_factory.mktemp(f"fa4-only-{request.param}")
    project = checkout_copy(root / "checkout")
    synthetic.write_pin(project / "vendor/flash-attention/pin.json")
    knobs = {"VFA_SOURCE_CACHE": str(root / "cache"), "VFA_COMPILER_CACHE": "off", "TORCH_CUDA_ARCH_LIST": "10.0",
             "VFA_BUILD_FA2": "off", "VFA_BUILD_FA3": "off", "VFA_FA4_PRECOMPILE": request.param}
    dist = root / "dist/cu13.0-x86_64"
    result = run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w", str(dist),
                  str(project)], env=clean_env(**knobs), timeout=1800)
    assert result.returncode == 0, result.output[-8000:]
    (path,) = dist.glob("vendored_flash_attn-*.whl")
    return {"path": path, "project": project, "log": result.output, "mode": request.param}


def test_a_wheel_of_fa4_alone_builds_and_says_what_runs_where(fa4_only_wheel):
    log = " ".join(fa4_only_wheel["log"].split())
    assert "what runs where: 10.0: FA4 (sm_100a)" in log
    assert "hold nothing that runs" not in log and "nothing this build compiles" not in log
    assert "FA2 not built: VFA_BUILD_FA2=off" in log and "FA3 not built: VFA_BUILD_FA3=off" in log
    names = zipfile.ZipFile(fa4_only_wheel["path"]).namelist()
    assert not [n for n in names if n.endswith(".so")]  # no compiled module
    assert "vendored_flash_attn/_fa4/cute/interface.py" in names
    record = json.loads(zipfile.ZipFile(fa4_only_wheel["path"]).read("vendored_flash_attn/_fa4/build_info.json"))
    assert record["precompile"]["mode"] == fa4_only_wheel["mode"]
    assert record["precompile"]["state"] == {"auto": "skipped", "off": "off"}[fa4_only_wheel["mode"]]


def test_a_wheel_of_fa4_alone_passes_the_release_gate(fa4_only_wheel):
    # .buildkite/scripts/check-wheels.sh as the pipeline runs it (this interpreter, the wheel
    # from a folder), and wheel_check --require declared: FA4 asked for, FA2 and FA3 off.
    project = fa4_only_wheel["project"]
    env = clean_env(VFA_CHECK_PYTHON=sys.executable, TORCH_CUDA_ARCH_LIST="10.0",
                    VFA_WHEELHOUSE=str(fa4_only_wheel["path"].parents[1]))
    gate = run(["bash", str(project / ".buildkite/scripts/check-wheels.sh"), "13.0"], env=env, timeout=600)
    assert gate.returncode == 0, gate.output
    assert "PASS build-info" in gate.stdout and "required fa4" in gate.stdout, gate.stdout
    checked = run([sys.executable, "-m", "vendored_flash_attn.release.wheel_check", "all", str(fa4_only_wheel["path"]),
                   "--pin", str(project / "vendor/flash-attention/pin.json"), "--cuda-major", "13",
                   "--arch-list", "10.0", "--require", "declared"], env=clean_env(PYTHONPATH=str(project / "python")))
    assert checked.returncode == 0, checked.output


def test_a_wheel_of_fa4_alone_precompiles_for_its_arch(sources, tmp_path):
    # The same build with the precompile on (a stand-in Python with the [fa4] extra): the whole
    # build runs, and the one compile step is for sm_100a, the arch of the list FA4 runs on.
    log = tmp_path / "precompile.jsonl"
    fake = tmp_path / "fa4-python"
    fake.write_text(FAKE_PRECOMPILE_PYTHON.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    build = tmp_path / "build"
    result = configure(build, {**sources, "VFA_PRESET": "minimal", "VFA_BUILD_FA2": "off", "VFA_BUILD_FA3": "off",
                               "TORCH_CUDA_ARCH_LIST": "10.0", "VFA_FA4_PRECOMPILE": "on",
                               "VFA_FA4_PRECOMPILE_PYTHONS": str(fake)})
    assert result.returncode == 0, result.text[-5000:]
    assert "what runs where: 10.0: FA4 (sm_100a)" in result.text and "precompile: on sm_100a" in result.text
    built = run([tool("cmake"), "--build", str(build)])
    assert built.returncode == 0, built.text[-5000:]
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 1 and runs[0]["rc"] == 0, runs
    argv = runs[0]["argv"]
    assert argv[argv.index("--arch") + 1] == "sm_100a" and runs[0]["plan"], runs


def test_a_wheel_of_fa4_alone_where_it_runs_on_no_arch_is_refused_naming_the_knobs(sources, tmp_path):
    result = configure(tmp_path / "build", {**sources, "VFA_PRESET": "minimal", "VFA_BUILD_FA2": "off",
                                            "TORCH_CUDA_ARCH_LIST": "8.0"})
    assert result.returncode != 0
    assert "Nothing to build: FA2 (VFA_BUILD_FA2=off), FA3 (TORCH_CUDA_ARCH_LIST='8.0' does not contain 9.0) " \
           "and FA4 (TORCH_CUDA_ARCH_LIST='8.0' has no arch FA4 runs on)" in result.text
    assert "(FA2 8.0, FA3 9.0, FA4 9.0), with that family's build knob (VFA_BUILD_FA2, VFA_BUILD_FA3, " \
           "VFA_BUILD_FA4) auto or on." in result.text
