"""FA4's dependency check (fa4_deps) and the FA4 staging/planning prototype, on a CPU with no
cutlass installed: fake distributions are dist-info folders on sys.path."""

from __future__ import annotations

import dataclasses

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vendored_flash_attn.families.fa4 import deps as fa4_deps, plan as fa4_plan
from vendored_flash_attn.errors import FlashAttnUnavailableError

ROOT = Path(__file__).resolve().parents[2]


def _load_precompile():
    from vfa_build.fa4 import precompile as module

    return module


precompile = _load_precompile()


def _fake_distribution(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def _satisfying_version(requirement: str) -> str:
    """A version the requirement accepts: its == or >= bound, else any."""
    from packaging.requirements import Requirement

    for spec in Requirement(requirement).specifier:
        if spec.operator in ("==", ">="):
            return spec.version
    return "1.0"


@pytest.fixture
def site(tmp_path, monkeypatch):
    """An empty site dir searched first by importlib.metadata."""
    path = tmp_path / "site"
    path.mkdir()
    monkeypatch.syspath_prepend(str(path))
    return path


def _install_all(site: Path, **overrides: str) -> None:
    for requirement in fa4_deps.required():
        name = fa4_deps.requirement_name(requirement)
        if overrides.get(name) != "absent":
            _fake_distribution(site, name, overrides.get(name) or _satisfying_version(requirement))


def test_the_extra_is_the_declaration():
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["fa4"]
    assert fa4_deps.required() == tuple(extra)
    assert any(r.startswith("nvidia-cutlass-dsl==") for r in extra)


def test_missing_cutlass_is_refused_with_the_install_command(site):
    _install_all(site, **{"nvidia-cutlass-dsl": "absent"})
    with pytest.raises(fa4_deps.FA4DependencyError) as info:
        fa4_deps.check()
    message = str(info.value)
    required = next(r for r in fa4_deps.required() if r.startswith("nvidia-cutlass-dsl"))
    assert "nvidia-cutlass-dsl is not installed" in message
    assert required in message
    assert 'pip install "vendored-flash-attn[fa4]"' in message
    assert isinstance(info.value, FlashAttnUnavailableError)


def test_wrong_cutlass_version_names_installed_and_required(site):
    _install_all(site, **{"nvidia-cutlass-dsl": "4.7.0"})
    with pytest.raises(fa4_deps.FA4DependencyError) as info:
        fa4_deps.check()
    message = str(info.value)
    required = next(r for r in fa4_deps.required() if r.startswith("nvidia-cutlass-dsl"))
    assert "nvidia-cutlass-dsl 4.7.0 is installed" in message
    assert required.removeprefix("nvidia-cutlass-dsl") + " is required" in message
    assert 'pip install "vendored-flash-attn[fa4]"' in message
    # Only the wrong one is named.
    assert "quack-kernels" not in message


def test_range_outside_is_refused(site):
    _install_all(site, **{"apache-tvm-ffi": "0.2.0"})
    assert fa4_deps.problems() == ["apache-tvm-ffi 0.2.0 is installed, <0.2,>=0.1.12 is required"]


def test_right_versions_pass(site):
    _install_all(site)
    assert fa4_deps.problems() == []
    fa4_deps.check()


def test_requirements_from_installed_metadata(site):
    info = site / "vendored_flash_attn-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vendored-flash-attn\nVersion: 0.1.0\n"
        "Requires-Dist: torch>=2.10\n"
        'Requires-Dist: nvidia-cutlass-dsl==4.6.0.dev0; extra == "fa4"\n'
        'Requires-Dist: pytest>=8; extra == "test"\n'
        "Requires-Dist: quack-kernels>=0.5.3 ; extra == 'fa4'\n")
    assert fa4_deps.extra_from_metadata() == ("nvidia-cutlass-dsl==4.6.0.dev0", "quack-kernels>=0.5.3")


def _pin_pyproject(dependencies: list[str]) -> str:
    listed = ",\n".join(f'    "{d}"' for d in dependencies)
    return f'[project]\nname = "flash-attn-4"\ndependencies = [\n{listed},\n]\n'


def _pin_dependencies_of_the_extra() -> list[str]:
    """What a pin must declare for the extra to agree: the extra less ADDED_TO_PIN, plus torch."""
    own = [r for r in fa4_deps.required() if fa4_deps.requirement_name(r) not in fa4_deps.ADDED_TO_PIN]
    return own[:1] + ["torch"] + own[1:]


def test_pin_that_agrees_has_no_drift():
    assert fa4_deps.pin_drift(_pin_pyproject(_pin_dependencies_of_the_extra())) == []


def test_pin_bump_is_named():
    pinned = [("nvidia-cutlass-dsl==4.6.2" if d.startswith("nvidia-cutlass-dsl") else d)
              for d in _pin_dependencies_of_the_extra()] + ["einops2"]
    drift = fa4_deps.pin_drift(_pin_pyproject(pinned))
    assert any(d.startswith("nvidia-cutlass-dsl: the pin requires nvidia-cutlass-dsl==4.6.2") for d in drift), drift
    assert any(d.startswith("einops2: the pin requires") for d in drift), drift
    assert len(drift) == 2


def test_importing_the_package_and_checking_never_import_cutlass(tmp_path):
    """A `cutlass` that records its import is on the path; neither step may import it."""
    (tmp_path / "cutlass.py").write_text("import sys; sys.stderr.write('CUTLASS IMPORTED'); raise SystemExit(3)\n")
    code = ("import sys, vendored_flash_attn\n"
            "assert 'cutlass' not in sys.modules\n"
            "from vendored_flash_attn.families.fa4 import deps as fa4_deps\n"
            "try:\n    fa4_deps.check()\nexcept fa4_deps.FA4DependencyError:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cutlass', 'quack', 'tvm_ffi')))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(tmp_path)])}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "CUTLASS IMPORTED" not in result.stderr
    assert result.stdout.strip() == "[]"


# --- cmake/vfa_build/fa4/stage.py and fa4_plan: staging and planning (standard library only) -------

def _fake_cute(root: Path, dependencies: list[str]) -> Path:
    cute = root / "flash_attn" / "cute"
    cute.mkdir(parents=True)
    (cute / "__init__.py").write_text("from .interface import flash_attn_func\n")
    (cute / "interface.py").write_text(
        "import flash_attn.cute.utils as utils\n"
        "from flash_attn.cute import fa_logging  # flash_attn.cute in a comment stays\n"
        "from flash_attn.cute.cache_utils import (\n    get_jit_cache,\n)\n"
        "import vendored_flash_attn.cute_helpers  # not upstream's package\n"
        "def flash_attn_func():\n    return 'flash_attn_func'\n")
    (cute / "LICENSE").write_text("BSD\n")
    (cute / "pyproject.toml").write_text(_pin_pyproject(dependencies))
    (cute / "bench.cu").write_text("not shipped\n")
    return cute


def test_stage_rewrites_absolute_imports(tmp_path):
    cute = _fake_cute(tmp_path / "src", _pin_dependencies_of_the_extra())
    summary = precompile.fa4_stage.stage(cute, tmp_path / "stage")
    staged = tmp_path / "stage" / "vendored_flash_attn" / "_fa4" / "cute"
    text = (staged / "interface.py").read_text()
    assert "import vendored_flash_attn._fa4.cute.utils as utils" in text
    assert "from vendored_flash_attn._fa4.cute import fa_logging" in text
    assert "from vendored_flash_attn._fa4.cute.cache_utils import (" in text
    assert "import vendored_flash_attn.cute_helpers" in text
    assert "def flash_attn_func():" in text
    assert precompile.fa4_stage.remaining_upstream_references(text) == []
    assert summary["rewritten"] == ["interface.py"]
    assert sorted(p.name for p in staged.iterdir()) == ["LICENSE", "__init__.py", "interface.py"]
    assert (tmp_path / "stage" / "vendored_flash_attn" / "_fa4" / "__init__.py").is_file()


def test_stage_refuses_a_pin_whose_dependencies_drifted(tmp_path):
    pinned = [("nvidia-cutlass-dsl==4.6.2" if d.startswith("nvidia-cutlass-dsl") else d)
              for d in _pin_dependencies_of_the_extra()]
    cute = _fake_cute(tmp_path / "src", pinned)
    with pytest.raises(SystemExit, match="nvidia-cutlass-dsl==4.6.2"):
        precompile.fa4_stage.stage(cute, tmp_path / "stage")


def test_plan_enumerates_each_kernel_once():
    selection = fa4_plan.Selection(head_dims=(64, 128), dtypes=("bf16",), features=("paged",),
                                     gqa_ratios=(1, 4), return_lse=(False,))
    names = [c.name for c in fa4_plan.plan(selection)]
    # 3 layouts (varlen, paged with the kernel's tile as page, paged with another page size)
    # x 2 head dims x 2 masks (no `local` feature) x 2 ratios; no split without `split`.
    assert len(names) == len(set(names)) == 3 * 2 * 2 * 2
    assert "paged-hd64-bf16-causal-gqa4" in names
    assert "paged_cpasync-hd128-bf16-full-gqa1" in names
    assert not [n for n in names if "split" in n or "local" in n or "lse" in n]


def test_the_wheel_features_widen_the_plan_the_way_calls_reach_kernels():
    base = dict(head_dims=(128,), dtypes=("bf16",), gqa_ratios=(4,), return_lse=(False, True))
    varlen_only = fa4_plan.plan(fa4_plan.Selection(features=(), **base))
    assert [c.name for c in varlen_only] == ["varlen-hd128-bf16-full-gqa4", "varlen-hd128-bf16-full-gqa4-lse",
                                             "varlen-hd128-bf16-causal-gqa4", "varlen-hd128-bf16-causal-gqa4-lse"]
    every = fa4_plan.plan(fa4_plan.Selection(features=("paged", "split", "local"), **base))
    assert len(every) == 3 * 3 * 2 * 2  # layouts x masks x split x lse
    # softcap's value is in the key: no choice of FA4's features knob (one kernel per value)
    with pytest.raises(ValueError, match="VFA_FA4_PRECOMPILE_FEATURES"):
        fa4_plan.Selection(features=("paged", "softcap"), **base)


def test_fp8_kernels_follow_what_fa4_takes_on_each_arch():
    selection = fa4_plan.Selection(head_dims=(128, 512), dtypes=("e4m3",), features=("paged",), gqa_ratios=(1,),
                                     return_lse=(False,))
    # sm90: FP8 KV with a 16-bit q, paged with the kernel's tile as page only, at the head dims
    # FA4's declaration takes it at (fa4.check_call): 512, not 128
    assert {(c.layout, c.head_dim) for c in fa4_plan.plan(selection, "sm_90a")} == {("paged", 512)}
    assert {c.layout for c in fa4_plan.plan(selection, "sm_100a")} == {"varlen", "paged", "paged_cpasync"}
    assert fa4_plan.plan(selection, "sm_120a") == []
    bf16 = fa4_plan.Selection(dtypes=("bf16",), features=("paged", "split"), gqa_ratios=(1,), return_lse=(False,))
    # sm120 is excluded by FA4's declaration (its kernel does not compile at the pin)
    assert fa4_plan.plan(bf16, "sm_120a") == [] and fa4_plan.plan(bf16, "sm_100a")


def test_plan_refuses_what_upstream_cannot_take():
    with pytest.raises(ValueError, match="VFA_FA4_PRECOMPILE_GQA_RATIOS"):
        fa4_plan.Selection(gqa_ratios=(0,))
    with pytest.raises(ValueError, match="VFA_FA4_PRECOMPILE_HEAD_DIMS"):
        fa4_plan.Selection(head_dims=(72,))
    with pytest.raises(ValueError, match="e5m2"):
        fa4_plan.Selection(dtypes=("e5m2",))
    with pytest.raises(ValueError, match="sparse"):
        fa4_plan.Selection(features=("sparse",))
    with pytest.raises(SystemExit, match="sm_90a"):
        fa4_plan.plan(fa4_plan.Selection(), "hopper")


def test_the_plan_is_what_the_adapter_takes_not_a_copy_of_its_rules(monkeypatch):
    # Every planned call is one fa4.run accepts; a rule of the adapter's changed changes the plan
    # with no change here: FP8 KV at head dim 128, refused by the declaration today (its sm90
    # kernels compute wrong there), planned once the declaration takes it.
    from vendored_flash_attn.families.fa4 import adapter as fa4

    selection = fa4_plan.Selection(head_dims=(128, 512), dtypes=("e4m3",), features=("paged",), gqa_ratios=(1,),
                                   return_lse=(False,))
    assert [c.name for c in fa4_plan.plan(selection, "sm_90a")] == ["paged-hd512-e4m3-full-gqa1",
                                                                    "paged-hd512-e4m3-causal-gqa1"]
    rules = dataclasses.replace(fa4.FAMILY.call, fp8_kv_head_dims=(128, 512))
    monkeypatch.setattr(fa4, "FAMILY", dataclasses.replace(fa4.FAMILY, call=rules))
    monkeypatch.setattr(fa4, "_ACCEPTED", {})
    planned = {(c.layout, c.head_dim) for c in fa4_plan.plan(selection, "sm_90a")}
    # paged_cpasync stays out: the adapter's page-size rule (FP8 KV needs the kernel's tile as page)
    assert planned == {("paged", 128), ("paged", 512)}


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
def test_the_presets_plan_what_the_fa3_knobs_planned_before(arch):
    # FA4's own knobs' presets give the kernels FA3's knobs' presets gave (issue 36): minimal is
    # head dim 128, bf16 + e4m3, paged + split + local, GQA 1/4/8 (108 calls on sm_90a); full is
    # FA3's head dims and dtypes with the three features FA4 precompiles.
    minimal = fa4_plan.Selection.preset("minimal")
    assert minimal == fa4_plan.Selection(head_dims=(128,), dtypes=("bf16", "e4m3"), features=("paged", "split", "local"),
                                         gqa_ratios=(1, 4, 8))
    full = fa4_plan.Selection.preset("full")
    assert full.head_dims == (64, 96, 128, 192, 256) and full.dtypes == ("bf16", "fp16", "e4m3")
    assert full.features == ("paged", "split", "local") and full.gqa_ratios == (1, 4, 8)
    assert len(fa4_plan.plan(minimal, arch)) == {"sm_90a": 108, "sm_100a": 216}[arch]
