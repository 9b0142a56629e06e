"""``import vendored_flash_attn`` is cheap and never fails; names resolve on first use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import vendored_flash_attn
from support import layout

ROOT = Path(__file__).resolve().parents[2]

PUBLIC = ["flash_attn_varlen_func", "get_scheduler_metadata", "get_flash_attn_version",
          "select_flash_attn_version", "flash_attn_version_reason", "is_fa_version_supported",
          "fa_version_unsupported_reason", "flash_attn_supports_fp8", "make_fp8_descales",
          "FlashAttnInputError", "FlashAttnUnavailableError"]


def test_import_loads_neither_torch_nor_modules():
    code = ("import sys, vendored_flash_attn as v; "
            "print('torch' in sys.modules, any(m.endswith(('_fa2_C', '_fa3_C')) for m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_public_names():
    for name in PUBLIC:
        assert callable(getattr(vendored_flash_attn, name)), name
    assert set(PUBLIC) <= set(vendored_flash_attn.__all__)
    assert isinstance(vendored_flash_attn.__version__, str)


def test_signature_matches_upstream_order():
    import inspect

    params = list(inspect.signature(vendored_flash_attn.flash_attn_varlen_func).parameters.values())
    names = [p.name for p in params]
    assert names == [
        "q", "k", "v", "max_seqlen_q", "cu_seqlens_q", "max_seqlen_k", "cu_seqlens_k", "seqused_k",
        "q_v", "dropout_p", "softmax_scale", "causal", "window_size", "softcap", "alibi_slopes",
        "deterministic", "return_attn_probs", "block_table", "return_softmax_lse", "out",
        "scheduler_metadata", "q_descale", "k_descale", "v_descale", "num_splits", "fa_version",
        "s_aux", "cp_world_size", "cp_rank", "cp_tot_seqused_k"]
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    assert defaults["fa_version"] is None and defaults["num_splits"] == 0
    assert defaults["dropout_p"] == 0.0 and defaults["cp_world_size"] == 1


def test_the_package_reads_its_files_as_utf8_under_any_locale():
    """Under a C locale with UTF-8 mode off (PYTHONUTF8=0 LC_ALL=C: the locale's encoding is
    ASCII), the interface still imports and answers: every project file (knobs.json, the
    measured table, build records) is read as UTF-8, not in the locale's encoding."""
    code = ("import locale, sys, vendored_flash_attn.interface as i, vendored_flash_attn.selection.measured as m; "
            "from vendored_flash_attn.declaration.families import registry; "
            "print(locale.getpreferredencoding(False), sys.flags.utf8_mode, len(registry().versions))")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("LC_", "LANG", "PYTHONUTF8"))}
    env.update(PYTHONPATH=str(ROOT / "python"), PYTHONUTF8="0", LC_ALL="C", PYTHONIOENCODING="utf-8")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    encoding, utf8_mode, families = result.stdout.split()
    assert encoding.lower() in ("ansi_x3.4-1968", "ascii", "us-ascii") and utf8_mode == "0", result.stdout
    assert int(families) >= 3


def _text_io_without_encoding(path: Path) -> list[int]:
    """Lines of ``path`` with a text-mode open()/Path.open()/read_text()/write_text() call
    that names no encoding (the locale's would be used)."""
    import ast

    found = []
    local = {n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.FunctionDef)}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call) or any(k.arg == "encoding" for k in node.keywords):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            mode_node = node.args[1] if len(node.args) > 1 else None
        elif isinstance(func, ast.Attribute) and func.attr == "open" and not (
                isinstance(func.value, ast.Name) and func.value.id in ("os", "tarfile", "zipfile", "gzip")):
            mode_node = node.args[0] if node.args else None
        elif isinstance(func, ast.Attribute) and func.attr in ("read_text", "write_text"):
            mode_node = None
        else:
            continue
        if isinstance(func, ast.Name) and func.id in local:
            continue
        mode_node = next((k.value for k in node.keywords if k.arg == "mode"), mode_node)
        mode = mode_node.value if isinstance(mode_node, ast.Constant) else "r"
        if "b" not in str(mode):
            found.append(node.lineno)
    return found


def test_every_project_file_is_read_and_written_as_utf8():
    """The package's and the build's Python name the encoding of every text file they open
    (UTF-8), so that nothing depends on the machine's locale."""
    files = sorted((ROOT / "python" / "vendored_flash_attn").rglob("*.py")) + sorted((ROOT / "cmake").glob("*.py"))
    assert len(files) > 20
    found = {str(p.relative_to(ROOT)): lines for p in files if (lines := _text_io_without_encoding(p))}
    assert found == {}, f"text I/O in the locale's encoding: {found}; pass encoding=\"utf-8\""


def test_the_packages_first_words_name_every_family():
    """The module docstring's first paragraph (what `help()` and a reader meet first) names
    each declared family."""
    from vendored_flash_attn.declaration.families import registry

    first = vendored_flash_attn.__doc__.split("\n\n")[0]
    assert [f.title for f in registry() if f.title not in first] == [], first


# --- the packages' layout: folders by concern, imports one way ------------------------------

PACKAGE_DIR = ROOT / "python" / "vendored_flash_attn"
# Top to bottom; a module imports only from its own layer or one below it. A layer is a folder
# of the package or a module of its root. The release checks sit on top: they call the public
# flash_attn_varlen_func of the installed package. errors.py is the leaf everybody may import;
# fp8.py imports only errors.py.
LAYERS = (("release",), ("__init__", "__main__", "cli", "interface", "sparse"), ("families",), ("call",),
          ("selection",), ("declaration",), ("fp8",), ("errors",))
ROOT_MODULES_AT_MOST = 10

# The build's package (the Python CMake runs), top to bottom: the progress display reads what the
# units record and asks the compiler cache's servers; the compiler cache runs inside a unit's run
# and asks the cluster; the cluster reads the unit kinds; everything may scrub URLs. sources/,
# fa4/ and knobs/ stand apart; __main__ (the one entry point) imports none of them.
BUILD_DIR = ROOT / "cmake" / "vfa_build"
BUILD_LAYERS = (("__main__",), ("progress",), ("compiler_cache",), ("cluster",), ("units",),
                ("sources", "fa4", "knobs"), ("url_secrets",), ("__init__",))


def layout_problems(sources: dict[str, str]) -> list[str]:
    return layout.layout_problems(sources, "vendored_flash_attn", LAYERS, ROOT_MODULES_AT_MOST)


def _package_sources() -> dict[str, str]:
    return layout.package_sources(PACKAGE_DIR)


def test_the_package_is_in_folders_by_concern_with_imports_one_way():
    sources = _package_sources()
    assert layout_problems(sources) == []
    assert {p.split("/")[0] for p in sources if "/" in p} == {"call", "selection", "declaration", "families", "release"}


def test_the_layout_check_sees_an_import_up_a_circle_and_a_crowded_root():
    sources = _package_sources()
    up = dict(sources)
    up["declaration/kernels.py"] += "\n\ndef _late():\n    from ..call.arguments import VARLEN\n"
    assert "declaration.kernels imports call.arguments, a layer above it" in layout_problems(up)
    circle = dict(sources)
    circle["declaration/knob_values.py"] += "\nfrom . import families\n"
    assert [p for p in layout_problems(circle) if p.startswith("a circle of files: ")]
    folders = {**sources, "selection/extra.py": "from ..declaration import extra\n",
               "declaration/extra.py": "def f():\n    from ..selection import selector\n"}
    problems = layout_problems(folders)
    assert "declaration.extra imports selection.selector, a layer above it" in problems
    assert [p for p in problems if p.startswith("a circle of folders: ")], problems
    crowded = {**sources, **{f"extra{i}.py": "" for i in range(ROOT_MODULES_AT_MOST)}}
    assert layout_problems(crowded)[0].startswith(f"the package root holds {ROOT_MODULES_AT_MOST + 7} modules")
    code = {**sources, "call/__init__.py": '"""The call path."""\nfrom .arguments import VARLEN\n'}
    assert layout_problems(code) == ["call/__init__.py: a folder's __init__.py holds only its docstring"]


def test_the_build_package_is_in_folders_by_concern_with_imports_one_way():
    """cmake/ holds CMake modules and the build package: no loose script; the package's folders
    import one way (BUILD_LAYERS), no circle of files or folders."""
    assert sorted(p.name for p in (ROOT / "cmake").glob("*.py")) == []
    sources = layout.package_sources(BUILD_DIR)
    assert layout.layout_problems(sources, "vfa_build", BUILD_LAYERS, 3) == []
    assert {p.split("/")[0] for p in sources if "/" in p} == {
        "sources", "compiler_cache", "cluster", "units", "progress", "fa4", "knobs"}


def test_the_build_layout_check_sees_the_display_imported_from_below():
    sources = layout.package_sources(BUILD_DIR)
    up = {**sources, "units/compile_unit.py": sources["units/compile_unit.py"]
          + "\n\ndef _late():\n    from vfa_build.progress import build_monitor\n"}
    problems = layout.layout_problems(up, "vfa_build", BUILD_LAYERS, 3)
    assert "units.compile_unit imports progress.build_monitor, a layer above it" in problems
    assert [p for p in problems if p.startswith("a circle of folders: ")], problems
