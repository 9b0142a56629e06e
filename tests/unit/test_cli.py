"""``python -m vendored_flash_attn info``: text and JSON reports, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from runtime_fakes import AMPERE, HOPPER, make_build
from vendored_flash_attn import cli

ROOT = Path(__file__).resolve().parents[2]


def test_report_with_two_gpus(describe, capsys):
    describe(caps=(AMPERE, HOPPER), module_errors={3: "ImportError: libcuda.so.1: cannot open"})
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    assert "upstream flash-attention: 617264c1c7955c9e84817654ebeedff069f3c5f1 (matches pin: yes)" in text
    assert "FA2: _vendored_fa2_C  archs sm_80, compute_80  head dims 32, 64, 96, 128, 192, 256" in text
    assert "FA3: _vendored_fa3_C  archs sm_90a" in text
    assert "compiler cache: sccache (enabled)" in text
    assert "FA2 module: loads" in text
    assert "FA3 module: does not load: ImportError: libcuda.so.1" in text
    assert "cuda:0 GPU 0 (compute capability 8.0): FA2" in text
    assert "cuda:1 GPU 1 (compute capability 9.0): FA2" in text
    assert "fallback: FA3 is built but unusable on GPU 1" in text


def test_json_report(describe, capsys):
    describe(caps=(HOPPER,), build=make_build("minimal"), env={"VLLM_FLASH_ATTN_VERSION": "2"})
    assert cli.main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["build"]["preset"] == "minimal"
    assert report["build"]["fa3"]["features"] == ["paged", "split", "local"]
    assert report["modules"]["fa3"] == {"built": True, "loads": True, "error": None}
    assert report["environment"]["VLLM_FLASH_ATTN_VERSION"] == "2"
    [device] = report["devices"]
    assert device["selected"] == 2 and device["reason"] == "VLLM_FLASH_ATTN_VERSION=2"
    assert device["unsupported"]["fa2"] is None and device["unsupported"]["fa3"] is None
    assert "built without FA4" in device["unsupported"]["fa4"]  # every declared family is listed


def test_no_gpu_and_bad_env_is_reported_not_raised(describe, capsys):
    describe(caps=(), env={"VLLM_FLASH_ATTN_VERSION": "auto"})
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    assert "CONFIG ERROR: VLLM_FLASH_ATTN_VERSION='auto'" in text
    assert "none visible" in text


def test_missing_build_info_exits_1(describe, capsys):
    describe(caps=(), build=None)
    assert cli.main(["info", "--json"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["build"] is None and "missing" in report["build_error"]
    assert report["selection"] == {"version": None, "reason": "no CUDA GPU is visible to this process"}
    assert "no build info" in captured.err


def test_module_entry_point_runs_on_this_machine():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    env.pop("VLLM_FLASH_ATTN_VERSION", None)
    result = subprocess.run([sys.executable, "-m", "vendored_flash_attn", "info"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 1), result.stderr
    assert "Build info" in result.stdout and "GPUs" in result.stdout
    if result.returncode == 1:  # a source tree without an installed build_info.json
        assert "MISSING" in result.stdout and "no build info" in result.stderr


KNOBS = {
    "options": {"VFA_PRESET": {"value": "minimal", "origin": "env:VFA_PRESET"},
                "MAX_JOBS": {"value": "3", "origin": "cmake"},
                "NVCC_THREADS": {"value": "1", "origin": "default"},
                "VFA_BUILD_MEMORY_MB": {"value": "23000", "origin": "default"}},
    "unknown_settings": [{"name": "VFA_PRESTE", "source": "env", "did_you_mean": "VFA_PRESET"}],
    "cuda_driver_call": {"mode": "entry_point", "reason": "auto: this machine has no libcuda"},
}


def test_json_report_has_the_knobs_and_their_origins(describe, capsys):
    describe(caps=(), build=make_build("minimal", **KNOBS))
    assert cli.main(["info", "--json"]) == 0
    build = json.loads(capsys.readouterr().out)["build"]
    for key, value in KNOBS.items():
        assert build[key] == value


def test_text_report_names_the_knobs_not_at_their_default(describe, capsys):
    describe(caps=(), build=make_build("minimal", **KNOBS))
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    assert "knobs not at their default: MAX_JOBS=3 (cmake), VFA_PRESET=minimal (env:VFA_PRESET)\n" in text
    assert "IGNORED at build time, not a knob: VFA_PRESTE (environment; did you mean VFA_PRESET?)" in text
    assert "CUTLASS driver calls: entry_point (auto: this machine has no libcuda)" in text
    describe(caps=(), build=make_build("minimal", options={"NVCC_THREADS": {"value": "1", "origin": "default"}}))
    assert cli.main(["info"]) == 0
    assert "knobs not at their default: none" in capsys.readouterr().out



def mirrored(build_dir: Path, installed: dict) -> dict:
    """A build dir as cmake/BuildInfo.cmake leaves it after a fetch from two mirrors: the
    wheel's record (the pin's URLs) and the whole record (the mirrors', scrubbed)."""
    build_dir.mkdir(parents=True)
    (build_dir / "build_info.wheel.json").write_text(json.dumps(installed))
    whole = json.loads(json.dumps(installed))
    whole["upstream"].update(origin="fetched", url="https://mirror.example/flash-attention.git")
    whole["cutlass"].update(origin="cache", url="file:///srv/mirrors/cutlass.git")
    (build_dir / "build_info.json").write_text(json.dumps(whole))
    return whole


def mirror_build():
    from vendored_flash_attn.declaration.build_info import BuildInfo
    build = make_build("minimal", options={
        "FLASH_ATTN_MIRROR": {"value": "(not recorded)", "origin": "env:FLASH_ATTN_MIRROR"},
        "CUTLASS_MIRROR": {"value": "(not recorded)", "origin": "cmake"}})
    raw = json.loads(json.dumps(build.raw))
    raw["upstream"].update(origin="cache", url="https://github.com/vllm-project/flash-attention.git")
    raw["cutlass"].update(origin="cache", url="https://github.com/NVIDIA/cutlass.git")
    return BuildInfo.from_dict(raw)


def test_info_names_the_mirror_a_build_fetched_from_and_the_pins_url(describe, capsys, tmp_path, monkeypatch):
    """Issue 29: after a build from mirrors, `info` showed the canonical URLs (the wheel's
    record holds the pin's URL: which mirror was used is a reading of the build machine) as
    the mirror knobs' values. The build dir's record has the mirror; `info` finds the build
    dir where `pip install .` put it, or as --build-dir, and labels each URL."""
    build = mirror_build()
    describe(caps=(), build=build)
    mirrored(tmp_path / "checkout" / "build" / "cp310-abi3-linux_x86_64", build.raw)
    monkeypatch.chdir(tmp_path / "checkout")
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    record = str(Path("build/cp310-abi3-linux_x86_64/build_info.json"))
    assert "    the pin's URL:  https://github.com/vllm-project/flash-attention.git\n" in text
    assert (f"    fetched from:   https://mirror.example/flash-attention.git (the mirror, FLASH_ATTN_MIRROR) "
            f"({record})") in text
    assert "    the pin's URL:  https://github.com/NVIDIA/cutlass.git\n" in text
    assert f"    from the source cache, filled from file:///srv/mirrors/cutlass.git (a mirror) ({record})" in text
    assert (f"CUTLASS_MIRROR=file:///srv/mirrors/cutlass.git (from {record}, credentials left out) (cmake)"
            in text)
    assert cli.main(["info", "--json"]) == 0
    sources = json.loads(capsys.readouterr().out)["build"]["sources"]
    assert sources["upstream"] == {"pin_url": "https://github.com/vllm-project/flash-attention.git",
                                   "origin": "fetched", "url": "https://mirror.example/flash-attention.git"}
    # Named explicitly, from anywhere.
    monkeypatch.chdir(tmp_path)
    assert cli.main(["info", "--build-dir", str(tmp_path / "checkout" / "build" / "cp310-abi3-linux_x86_64")]) == 0
    assert "(the mirror, FLASH_ATTN_MIRROR)" in capsys.readouterr().out


def test_info_without_the_build_dir_says_where_the_mirror_is_recorded(describe, capsys, tmp_path, monkeypatch):
    build = mirror_build()
    describe(caps=(), build=build)
    other = json.loads(json.dumps(build.raw))
    other["preset"] = "full"  # another build's record in the usual place: not this package's
    mirrored(tmp_path / "build" / "cp310-abi3-linux_x86_64", other)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    assert "mirror.example" not in text and "(not recorded)" not in text
    assert "    fetched from:   not in the wheel, which names the pin's URL; `info --build-dir <build dir>`" in text
    assert "FLASH_ATTN_MIRROR=(set; the mirror's URL is in the build dir's build_info.json)" in text
    assert cli.main(["info", "--build-dir", str(tmp_path / "build" / "cp310-abi3-linux_x86_64")]) == 0
    assert "differs from the installed record" in capsys.readouterr().out


def test_the_report_names_the_packages_own_version(describe, capsys, monkeypatch):
    import vendored_flash_attn
    monkeypatch.setattr(vendored_flash_attn, "__version__", "1.2.3+fa617264c.cu13", raising=False)
    describe(caps=(), build=make_build("minimal"))
    assert cli.main(["info"]) == 0
    assert capsys.readouterr().out.startswith("vendored-flash-attn 1.2.3+fa617264c.cu13\n")
    assert cli.main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["package"] == {"name": "vendored-flash-attn",
                                                              "version": "1.2.3+fa617264c.cu13"}


def test_each_gpus_default_is_one_short_line_with_its_reasons_under_it(describe, capsys):
    """A GPU's line says its family and why in a few words; the notes on the families passed
    over (FA4's measured reasons for not being Hopper's default, a family that cannot run)
    follow it, indented, each said once."""
    from runtime_fakes import FA4_RECORD

    describe(caps=(HOPPER, AMPERE), build=make_build("full", fa4=FA4_RECORD), device_type="cuda")
    assert cli.main(["info"]) == 0
    text = capsys.readouterr().out
    gpus = text[text.index("\nGPUs\n") + 6:text.index("\n\n", text.index("\nGPUs\n") + 6)].splitlines()
    heads = [i for i, line in enumerate(gpus) if line.startswith("  cuda:")]
    assert len(heads) == 2 and heads[0] == 0
    assert gpus[0].startswith("  cuda:0 GPU 0 (compute capability 9.0): FA3 - ") and len(gpus[0]) <= 120, gpus[0]
    assert gpus[heads[1]].startswith("  cuda:1 GPU 1 (compute capability 8.0): FA2 - ") and len(gpus[heads[1]]) <= 120
    hopper = "\n".join(gpus[1:heads[1]])
    assert hopper.startswith("    FA4 is not the default here: ") and "measured" in hopper
    assert all(line.startswith("    ") and len(line) <= 110 for line in gpus if not line.startswith("  cuda:"))
    ampere = gpus[heads[1] + 1:]
    assert sum("FA3 unusable" in line for line in ampere) == 1, ampere
