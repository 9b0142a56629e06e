"""Nothing of the build machine's Python environment in what the wheel ships: the same
selection built from two virtual environments at different paths (each seeing the same
installed packages) gives wheels whose every member is byte-identical, FA4's record
included. tests/build/test_wheel.py varies the checkout path and build dir; this varies
the interpreter's path, which the build passes to CMake (Python_EXECUTABLE), to torch's
CMake and to FA4's staging."""

from __future__ import annotations

import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.cmake_runner import checkout_copy, clean_env, free_port, run, tool

FA4_RECORD = "vendored_flash_attn/_fa4/build_info.json"


def make_venv(where: Path) -> Path:
    """A venv of this interpreter's base Python at <where>, seeing this environment's
    packages through a .pth file (no copy of torch): another sys.executable, sys.prefix and
    site-packages path, the same packages."""
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "vfa-test-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


@pytest.fixture(scope="module")
def wheels(synthetic, tmp_path_factory):
    root = tmp_path_factory.mktemp("venvs")
    pin = synthetic.write_pin(root / "pin.json")
    # FA3 only (half the compiles), FA4 staged and recorded, not precompiled (minutes).
    knobs = {"VFA_PIN_FILE": str(pin), "VFA_SOURCE_CACHE": str(root / "source-cache"), "VFA_PRESET": "minimal",
             "VFA_BUILD_FA2": "off", "VFA_BUILD_FA4": "on", "VFA_FA4_PRECOMPILE": "off"}
    env = clean_env(SCCACHE_DIR=str(root / "sccache"), SCCACHE_SERVER_PORT=str(free_port()),
                    SCCACHE_IDLE_TIMEOUT="0", SCCACHE_LOG="", SOURCE_DATE_EPOCH="1700000000")
    built = {}
    try:
        for name, where in (("a", root / "venv-a"), ("b", root / "elsewhere" / "deeper" / "venv-b")):
            python = make_venv(where)
            checkout = checkout_copy(root / f"checkout-{name}")
            config = [f"-Ccmake.define.{k}={v}" for k, v in knobs.items()]
            result = run([str(python), "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v",
                          "-w", str(root / f"dist-{name}"), *config, str(checkout)], env=env, timeout=3000)
            assert result.returncode == 0, result.output[-8000:]
            (wheel,) = (root / f"dist-{name}").glob("vendored_flash_attn-*.whl")
            built[name] = {"wheel": wheel, "venv": where}
    finally:
        run([tool("sccache"), "--stop-server"], env=env)
    return built


def members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as z:
        return {info.filename: z.read(info) for info in z.infolist()}


def differing(a: dict[str, bytes], b: dict[str, bytes]) -> list[str]:
    return sorted(name for name in a.keys() | b.keys() if a.get(name) != b.get(name))


def test_no_shipped_byte_depends_on_the_build_venvs_path(wheels):
    a, b = members(wheels["a"]["wheel"]), members(wheels["b"]["wheel"])
    assert FA4_RECORD in a, sorted(a)  # FA4 was staged and recorded
    assert differing(a, b) == [], {name: (a.get(name, b"")[:300], b.get(name, b"")[:300])
                                   for name in differing(a, b)}
    for name, data in a.items():
        assert str(wheels["a"]["venv"]).encode() not in data, f"{name} holds the build venv's path"
    assert wheels["a"]["wheel"].read_bytes() == wheels["b"]["wheel"].read_bytes()
