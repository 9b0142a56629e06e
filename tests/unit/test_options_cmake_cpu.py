"""How cmake/Options.cmake reads a knob's value (-D, the environment, the declared
default), run in script mode (`cmake -P`, a fraction of a second) instead of a configure.
Configures that rely on it: tests/build/test_knobs.py and test_configure.py."""

from __future__ import annotations

from pathlib import Path

from support.cmake_runner import clean_env, run, tool

OPTIONS = Path(__file__).resolve().parents[2] / "cmake" / "Options.cmake"


def read_knobs(tmp_path: Path, names: list[str], env: dict[str, str], defines: dict[str, str]) -> dict:
    """{name: (value, origin)} as vfa_option resolves them."""
    script = tmp_path / "read_knobs.cmake"
    script.write_text(f'include("{OPTIONS}")\n'
                      f'foreach(name IN ITEMS {" ".join(names)})\n'
                      '  vfa_option(${name})\n'
                      '  vfa_option_origin(origin ${name})\n'
                      '  message(NOTICE "KNOB ${name}=${${name}}=${origin}")\n'
                      'endforeach()\n')
    result = run([tool("cmake"), *[f"-D{k}={v}" for k, v in defines.items()], "-P", str(script)],
                 env=clean_env(**env))
    assert result.returncode == 0, result.output
    lines = [line.split(" ", 1)[1].split("=") for line in result.output.splitlines() if line.startswith("KNOB ")]
    return {name: (value, origin) for name, value, origin in lines}


def test_a_blank_value_means_the_default(tmp_path):
    # A blank bool used to come through as '' and read as OFF: here, FP8 two-level
    # accumulation off, the less accurate kernels, while its default is ON.
    knobs = read_knobs(tmp_path, ["VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION", "VFA_PRESET", "NVCC_THREADS", "VFA_FA2_PTX"],
                       env={"VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION": " ", "VFA_PRESET": "\t", "VFA_FA2_PTX": " no "},
                       defines={"NVCC_THREADS": " "})
    assert knobs["VFA_FA3_FP8_TWO_LEVEL_ACCUMULATION"] == ("ON", "default")
    assert knobs["VFA_PRESET"] == ("full", "default")
    assert knobs["NVCC_THREADS"] == ("1", "default")
    assert knobs["VFA_FA2_PTX"] == ("OFF", "env:VFA_FA2_PTX")  # a value with blanks around it is that value
