"""FA4's import rewrite (cmake/vfa_build/fa4/stage.py): every form in which a staged file can
import upstream's ``flash_attn`` is either pointed at our copy or refused, naming the file and
line; relative imports are left alone. Each test stages the synthetic upstream with one more
module holding the form, then imports the staged copy with no ``flash_attn`` on the path (a
real install would hide a missed rewrite)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.synthetic_upstream import fa4_cute_files


@pytest.fixture(scope="module")
def fa4_stage():
    from vfa_build.fa4 import stage as module

    return module


def _upstream(tmp_path: Path, extra: dict[str, str]) -> Path:
    src = tmp_path / "upstream"
    for rel, text in {**fa4_cute_files(), **extra}.items():
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return src / "flash_attn/cute"


def _stage(fa4_stage, tmp_path: Path, module: str) -> Path:
    dest = tmp_path / "stage"
    fa4_stage.stage(_upstream(tmp_path, {"flash_attn/cute/form.py": module}), dest)
    return dest


def _refused(fa4_stage, tmp_path: Path, module: str) -> str:
    with pytest.raises(SystemExit) as err:
        _stage(fa4_stage, tmp_path, module)
    return str(err.value)


def _run_staged(dest: Path, code: str) -> str:
    """``code`` run in a fresh Python whose path holds the stage only (no flash_attn)."""
    done = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(dest)!r}); {code}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_from_flash_attn_import_cute_is_pointed_at_our_copy(fa4_stage, tmp_path):
    dest = _stage(fa4_stage, tmp_path, "from flash_attn import cute\nfrom flash_attn import cute as fa4\n"
                                       "from flash_attn \\\n    import (cute)\nORIGIN = fa4.utils.ORIGIN\n")
    staged = (dest / "vendored_flash_attn/_fa4/cute/form.py").read_text()
    assert "from vendored_flash_attn._fa4 import cute\n" in staged
    assert "from vendored_flash_attn._fa4 import cute as fa4\n" in staged
    assert "flash_attn \\" not in staged.replace("vendored_flash_attn \\", "")
    assert _run_staged(dest, "from vendored_flash_attn._fa4.cute import form; print(form.ORIGIN)") \
        == "vendored_flash_attn._fa4.cute.utils"


def test_from_flash_attn_import_another_name_is_refused_with_file_and_line(fa4_stage, tmp_path):
    message = _refused(fa4_stage, tmp_path, "X = 1\nfrom flash_attn import cute, flash_attn_func\n")
    assert "flash_attn/cute/form.py:2: from flash_attn import cute, flash_attn_func" in message
    assert "cannot stage FA4" in message and "relative" in message


def test_import_flash_attn_is_refused_with_file_and_line(fa4_stage, tmp_path):
    message = _refused(fa4_stage, tmp_path, '"""doc"""\n\n\nimport flash_attn\n')
    assert "flash_attn/cute/form.py:4: import flash_attn" in message


def test_import_of_another_upstream_module_is_refused(fa4_stage, tmp_path):
    message = _refused(fa4_stage, tmp_path, "import os, flash_attn.ops.triton as ops\n")
    assert "form.py:1: import os, flash_attn.ops.triton as ops" in message


def test_import_flash_attn_cute_as_name_is_pointed_at_our_copy(fa4_stage, tmp_path):
    dest = _stage(fa4_stage, tmp_path, "import flash_attn.cute as fa4\nimport flash_attn.cute.utils as u\n"
                                       "ORIGIN = (fa4.__name__, u.ORIGIN)\n")
    assert _run_staged(dest, "from vendored_flash_attn._fa4.cute import form; print(*form.ORIGIN)") \
        == "vendored_flash_attn._fa4.cute vendored_flash_attn._fa4.cute.utils"


def test_from_flash_attn_cute_submodule_import_is_pointed_at_our_copy(fa4_stage, tmp_path):
    dest = _stage(fa4_stage, tmp_path, "from flash_attn.cute.utils import ORIGIN\n"
                                       "from flash_attn.cute.sub import (\n    ORIGIN as SUB,\n)\n")
    assert _run_staged(dest, "from vendored_flash_attn._fa4.cute import form; print(form.ORIGIN, form.SUB)") \
        == "vendored_flash_attn._fa4.cute.utils vendored_flash_attn._fa4.cute.utils"


@pytest.mark.parametrize("call", [
    'importlib.import_module("flash_attn" + ".cute.utils")',
    'importlib.import_module("flash_attn." + name)',
    'import_module(f"flash_attn.{name}")',
    'importlib.import_module("flash_attn.{}".format(name))',
    '__import__("flash_attn")',
    '__import__("flash_attn" + ".cute")',
    'importlib.util.find_spec("flash_attn")',
    'importlib.import_module(".ops", "flash_attn")',
    'importlib.import_module(".ops", package="flash_attn")',
])
def test_a_dynamic_import_of_flash_attn_is_refused_with_file_and_line(fa4_stage, tmp_path, call):
    message = _refused(fa4_stage, tmp_path, f"import importlib\nfrom importlib import import_module\nname = 'x'\n"
                                            f"def load():\n    return {call}\n")
    assert f"form.py:5: return {call}" in message


def test_a_rewritten_dunder_import_of_a_submodule_is_refused(fa4_stage, tmp_path):
    # __import__("flash_attn.cute") returns flash_attn; rewritten it would return our top package.
    message = _refused(fa4_stage, tmp_path, 'utils = __import__("flash_attn.cute.utils").cute.utils\n')
    assert 'form.py:1: utils = __import__("vendored_flash_attn._fa4.cute.utils")' in message


def test_a_literal_dynamic_import_of_flash_attn_cute_is_pointed_at_our_copy(fa4_stage, tmp_path):
    dest = _stage(fa4_stage, tmp_path, 'import importlib\n'
                                       'ORIGIN = importlib.import_module("flash_attn.cute.utils").ORIGIN\n'
                                       'import logging\nlog = logging.getLogger("flash_attn")\n')
    assert _run_staged(dest, "from vendored_flash_attn._fa4.cute import form; print(form.ORIGIN)") \
        == "vendored_flash_attn._fa4.cute.utils"


def test_relative_imports_are_left_alone(fa4_stage, tmp_path):
    module = "from . import utils\nfrom .utils import ORIGIN\nfrom .sub import ORIGIN as SUB\n"
    dest = _stage(fa4_stage, tmp_path, module)
    assert (dest / "vendored_flash_attn/_fa4/cute/form.py").read_text() == module
    assert _run_staged(dest, "from vendored_flash_attn._fa4.cute import form; print(form.ORIGIN)") \
        == "vendored_flash_attn._fa4.cute.utils"


def test_a_file_that_cannot_be_parsed_is_refused_naming_it(fa4_stage, tmp_path):
    message = _refused(fa4_stage, tmp_path, "def broken(:\n    pass\n")
    assert "form.py:1: cannot be parsed to check its imports" in message


def test_names_in_comments_and_other_packages_are_not_imports(fa4_stage, tmp_path):
    module = "# import flash_attn\n'''from flash_attn import x'''\nimport json as flash_attn\n"
    dest = _stage(fa4_stage, tmp_path, module)
    assert (dest / "vendored_flash_attn/_fa4/cute/form.py").read_text() == module
