"""The version scheme: <base>[+fa<upstream commit>.cu<CUDA major>], PEP 440 via packaging."""

from __future__ import annotations

import json
import os
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from support.cmake_runner import PROJECT, clean_env, run
from vendored_flash_attn.declaration import versioning
from vendored_flash_attn.declaration.versioning import VersionSchemeError, compute, parse_local

PIN_COMMIT = json.loads((PROJECT / "vendor/flash-attention/pin.json").read_text())["flash_attention"]["commit"]


def project_with_pin(tmp_path: Path, commit: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    (tmp_path / "vendor/flash-attention").mkdir(parents=True)
    (tmp_path / "vendor/flash-attention/pin.json").write_text(json.dumps({"flash_attention": {"commit": commit}}))
    return tmp_path


@pytest.mark.parametrize("env, version", [
    ({"VFA_CUDA_MAJOR": "13"}, "0.1.0+fa0123456.cu13"),
    ({"VFA_CUDA_MAJOR": "12"}, "0.1.0+fa0123456.cu12"),
    ({"VFA_CUDA_MAJOR": "12", "VFA_VERSION_LOCAL": "1"}, "0.1.0+fa0123456.cu12"),
    ({"VFA_CUDA_MAJOR": "12", "VFA_VERSION_LOCAL": "0"}, "0.1.0"),
    ({"VFA_VERSION_LOCAL": "off"}, "0.1.0"),
])
def test_local_label_holds_upstream_commit_and_cuda_major(tmp_path, env, version):
    parts = compute("0.1.0", project_with_pin(tmp_path), env)
    assert parts.version == version
    assert str(Version(parts.version)) == version  # already PEP 440 normal form


def test_label_from_the_real_pin_and_torch(monkeypatch):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VFA_")}
    parts = compute("0.1.0", PROJECT, env)
    import torch

    assert parts.version == f"0.1.0+fa{PIN_COMMIT[:7]}.cu{torch.version.cuda.split('.')[0]}"
    assert parts.cuda_source.startswith("torch.version.cuda=")
    assert parse_local(parts.version) == {"upstream": PIN_COMMIT[:7], "cuda_major": int(torch.version.cuda.split(".")[0])}


def test_pre_and_post_releases_keep_their_public_part(tmp_path):
    project = project_with_pin(tmp_path)
    assert compute("1.2.0rc1", project, {"VFA_CUDA_MAJOR": "13"}).version == "1.2.0rc1+fa0123456.cu13"
    assert compute("1.2.0.post2", project, {"VFA_CUDA_MAJOR": "12"}).version == "1.2.0.post2+fa0123456.cu12"
    # Local labels sort after the public version, and cu13 after cu12.
    assert Version("1.2.0+fa0123456.cu13") > Version("1.2.0+fa0123456.cu12") > Version("1.2.0")


def test_nvcc_is_asked_when_torch_has_no_cuda(tmp_path, monkeypatch):
    fake = tmp_path / "cuda/bin/nvcc"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.9, V12.9.86'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(versioning, "_torch_cuda_version", lambda: None)
    parts = compute("0.1.0", project_with_pin(tmp_path / "p"), {"CUDA_HOME": str(tmp_path / "cuda"), "PATH": ""})
    assert parts.version == "0.1.0+fa0123456.cu12" and parts.cuda_source == "nvcc 12.9"


def test_no_cuda_anywhere_is_a_clear_error_unless_the_label_is_off(tmp_path, monkeypatch):
    monkeypatch.setattr(versioning, "_torch_cuda_version", lambda: None)
    project = project_with_pin(tmp_path)
    with pytest.raises(VersionSchemeError, match="VFA_VERSION_LOCAL=0"):
        compute("0.1.0", project, {"PATH": ""})
    assert compute("0.1.0", project, {"PATH": "", "VFA_VERSION_LOCAL": "0"}).version == "0.1.0"


def test_sdist_builds_default_to_the_plain_version(tmp_path):
    project = project_with_pin(tmp_path)
    (project / "PKG-INFO").write_text("Metadata-Version: 2.2\nName: vendored-flash-attn\nVersion: 0.1.0\n")
    assert compute("0.1.0", project, {"VFA_CUDA_MAJOR": "13"}).version == "0.1.0"
    assert compute("0.1.0", project, {"VFA_CUDA_MAJOR": "13", "VFA_VERSION_LOCAL": "1"}).version == "0.1.0+fa0123456.cu13"


def test_pin_file_override_is_the_one_cmake_reads(tmp_path):
    other = tmp_path / "other-pin.json"
    other.write_text(json.dumps({"flash_attention": {"commit": "f" * 40}}))
    parts = compute("0.1.0", project_with_pin(tmp_path / "p"), {"VFA_CUDA_MAJOR": "13", "VFA_PIN_FILE": str(other)})
    assert parts.version == "0.1.0+fafffffff.cu13"


@pytest.mark.parametrize("base, env, message", [
    ("banana", {}, "not a PEP 440 version"),
    ("0.1.0+local", {}, "must not carry a local label"),
    ("0.1.0", {"VFA_VERSION_LOCAL": "maybe"}, "use 1, 0 or auto"),
    ("0.1.0", {"VFA_CUDA_MAJOR": "thirteen"}, "is not a number"),
])
def test_bad_inputs_fail_clearly(tmp_path, base, env, message):
    with pytest.raises(VersionSchemeError, match=message):
        compute(base, project_with_pin(tmp_path), env)


def test_bad_pin_fails_clearly(tmp_path):
    with pytest.raises(VersionSchemeError, match="40-hex"):
        compute("0.1.0", project_with_pin(tmp_path, commit="main"), {"VFA_CUDA_MAJOR": "13"})


def test_parse_local_rejects_foreign_labels():
    assert parse_local("0.1.0") == {}
    with pytest.raises(VersionSchemeError):
        parse_local("0.1.0+cu130")


def test_cli_prints_the_version():
    env = clean_env(PYTHONPATH=str(PROJECT / "python"), VFA_CUDA_MAJOR="12")
    result = run([sys.executable, "-m", "vendored_flash_attn.declaration.versioning", "--project", str(PROJECT), "--json"], env=env)
    assert result.returncode == 0, result.output
    assert json.loads(result.stdout)["version"] == f"0.1.0+fa{PIN_COMMIT[:7]}.cu12"


def _backend(hook: str, out: Path, env: dict) -> str:
    code = (f"import sys; from scikit_build_core import build as b; "
            f"print(b.{hook}(sys.argv[1]))")
    result = run([sys.executable, "-c", code, str(out)], env=env, cwd=PROJECT)
    assert result.returncode == 0, result.output[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("local, expected", [("", f"0.1.0+fa{PIN_COMMIT[:7]}.cu12"), ("0", "0.1.0")])
def test_the_build_backend_uses_the_provider(tmp_path, local, expected):
    """scikit-build-core (as pip calls it) gets the same version, switch included."""
    env = clean_env(VFA_CUDA_MAJOR="12", VFA_VERSION_LOCAL=local)
    name = _backend("prepare_metadata_for_build_wheel", tmp_path, env)
    assert name == f"vendored_flash_attn-{expected}.dist-info"


def test_the_sdist_carries_the_plain_version(tmp_path):
    env = clean_env(VFA_CUDA_MAJOR="12")
    name = _backend("build_sdist", tmp_path, env)
    assert name == "vendored_flash_attn-0.1.0.tar.gz"
