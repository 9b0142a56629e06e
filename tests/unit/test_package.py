"""``import vendored_flash_attn`` is cheap and never fails; names resolve on first use."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import vendored_flash_attn

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
    code = ("import locale, sys, vendored_flash_attn.interface as i, vendored_flash_attn.measured as m; "
            "from vendored_flash_attn.families import registry; "
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
    files = sorted((ROOT / "python" / "vendored_flash_attn").glob("*.py")) + sorted((ROOT / "cmake").glob("*.py"))
    assert len(files) > 20
    found = {str(p.relative_to(ROOT)): lines for p in files if (lines := _text_io_without_encoding(p))}
    assert found == {}, f"text I/O in the locale's encoding: {found}; pass encoding=\"utf-8\""


def test_the_packages_first_words_name_every_family():
    """The module docstring's first paragraph (what `help()` and a reader meet first) names
    each declared family."""
    from vendored_flash_attn.families import registry

    first = vendored_flash_attn.__doc__.split("\n\n")[0]
    assert [f.title for f in registry() if f.title not in first] == [], first
