"""How cmake/Options.cmake reads a knob's value (-D, the environment, the declared
default), run in script mode (`cmake -P`, a fraction of a second) instead of a configure.
Configures that rely on it: tests/build/test_knobs.py and test_configure.py."""

from __future__ import annotations

from pathlib import Path

from support.cmake_runner import Result, clean_env, run, tool

OPTIONS = Path(__file__).resolve().parents[2] / "cmake" / "Options.cmake"


def run_options(tmp_path: Path, names: list[str], env: dict[str, str], defines: dict[str, str]) -> Result:
    """`cmake -D... -P` of a script that resolves <names> with vfa_option and prints them."""
    script = tmp_path / "read_knobs.cmake"
    script.write_text(f'include("{OPTIONS}")\n'
                      f'foreach(name IN ITEMS {" ".join(names)})\n'
                      '  vfa_option(${name})\n'
                      '  vfa_option_origin(origin ${name})\n'
                      '  message(NOTICE "KNOB ${name}=${${name}}=${origin}")\n'
                      'endforeach()\n')
    return run([tool("cmake"), *[f"-D{k}={v}" for k, v in defines.items()], "-P", str(script)], env=clean_env(**env))


def read_knobs(tmp_path: Path, names: list[str], env: dict[str, str], defines: dict[str, str]) -> dict:
    """{name: (value, origin)} as vfa_option resolves them."""
    result = run_options(tmp_path, names, env, defines)
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


def test_a_path_with_a_leading_tilde_is_refused_with_the_path_meant(tmp_path):
    # pip's -C cmake.define.VFA_SOURCE_CACHE=~/cache reaches CMake as '~/cache' (the
    # shell expands no '~' inside that word): it used to become <project>/~/cache.
    result = run_options(tmp_path, ["VFA_SOURCE_CACHE"], env={"HOME": "/home/ci"},
                         defines={"VFA_SOURCE_CACHE": "~/vfa-cache"})
    assert result.returncode != 0
    assert ("VFA_SOURCE_CACHE: '~/vfa-cache' is not a valid value (given as -DVFA_SOURCE_CACHE (pip: "
            "-C cmake.define.VFA_SOURCE_CACHE)). Valid values: a path; a leading '~' is expanded only by a shell, "
            "not here: write '/home/ci/vfa-cache'.") in result.text
    assert read_knobs(tmp_path, ["VFA_SOURCE_CACHE"], env={}, defines={"VFA_SOURCE_CACHE": "./~/vfa-cache"}) == \
        {"VFA_SOURCE_CACHE": (str(OPTIONS.parents[1] / "~" / "vfa-cache"), "cmake")}  # said explicitly: allowed


def test_words_are_joined_as_a_sentence_lists_them(tmp_path):
    """vfa_join_words, the one "A, B and C" of the build's messages (the arch generations a family
    runs on, the families a build left out)."""
    script = tmp_path / "join.cmake"
    script.write_text(f'include("{OPTIONS}")\n'
                      'foreach(items IN ITEMS "9.x" "9.x|10.x" "9.x|10.x|11.x" "FA2 (off)|FA3 (8.0 lacks 9.0)")\n'
                      '  string(REPLACE "|" ";" items "${items}")\n'
                      '  vfa_join_words(text "${items}")\n'
                      '  message(NOTICE "JOINED <${text}>")\n'
                      'endforeach()\n')
    result = run([tool("cmake"), "-P", str(script)], env=clean_env())
    assert result.returncode == 0, result.output
    assert [line for line in result.output.splitlines() if line.startswith("JOINED ")] == [
        "JOINED <9.x>", "JOINED <9.x and 10.x>", "JOINED <9.x, 10.x and 11.x>", "JOINED <FA2 (off) and FA3 (8.0 lacks 9.0)>"]


def test_none_with_other_items_says_none_stands_alone(tmp_path):
    # It used to say "'none' is not a valid value ... Valid values: any of ..., or none".
    result = run_options(tmp_path, ["VFA_FA3_FEATURES"], env={"VFA_FA3_FEATURES": "none,paged"}, defines={})
    assert result.returncode != 0
    assert ("VFA_FA3_FEATURES: 'none,paged' mixes none with paged (from the environment variable "
            "VFA_FA3_FEATURES). none stands alone: it selects no item, so it cannot be combined with others. "
            "Give VFA_FA3_FEATURES=none alone, or only the items you want (paged).") in result.text
    assert "is not a valid value" not in result.text
    # An item that is no choice is named first: the mix's fix must not suggest it.
    bogus = run_options(tmp_path, ["VFA_FA3_FEATURES"], env={"VFA_FA3_FEATURES": "none,pagd"}, defines={})
    assert "VFA_FA3_FEATURES: 'pagd' is not a valid value" in bogus.text and "mixes none" not in bogus.text
    assert read_knobs(tmp_path, ["VFA_FA3_FEATURES"], env={"VFA_FA3_FEATURES": " none "}, defines={}) == \
        {"VFA_FA3_FEATURES": ("none", "env:VFA_FA3_FEATURES")}


def test_a_relative_staged_store_is_refused_naming_where_it_would_go(tmp_path):
    # It used to become <project>/staged: ~90 MB inside the checkout, with no word.
    result = run_options(tmp_path, ["VFA_STAGED_SOURCES"], env={}, defines={"VFA_STAGED_SOURCES": "staged"})
    assert result.returncode != 0
    project = OPTIONS.parents[1]
    assert (f"VFA_STAGED_SOURCES: 'staged' is a relative path (given as -DVFA_STAGED_SOURCES (pip: -C "
            f"cmake.define.VFA_STAGED_SOURCES)). It would put the staged copy of the sources (about 90 MB) at "
            f"'{project}/staged', inside the project folder '{project}'. Write an absolute path") \
        in result.text.replace("\n", " ").replace("  ", " ")
    absolute = tmp_path / "store"
    assert read_knobs(tmp_path, ["VFA_STAGED_SOURCES"], env={"VFA_STAGED_SOURCES": str(absolute)}, defines={}) == \
        {"VFA_STAGED_SOURCES": (str(absolute), "env:VFA_STAGED_SOURCES")}
    outside = Path("..") / "vfa-staged-elsewhere"  # relative, out of the project: means what it says
    assert read_knobs(tmp_path, ["VFA_STAGED_SOURCES"], env={}, defines={"VFA_STAGED_SOURCES": str(outside)}) == \
        {"VFA_STAGED_SOURCES": (str(OPTIONS.parents[2] / "vfa-staged-elsewhere"), "cmake")}
