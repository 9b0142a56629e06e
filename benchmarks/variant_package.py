"""Assemble a variant of the installed package for a side-by-side measurement.

Build choices (FA2 as sm80 SASS + PTX versus sm90 SASS, FP8 two-level accumulation on
versus off) are compared by running the same benchmark against two packages that
differ in one module. This copies the installed ``vendored_flash_attn`` to DEST,
swaps in a module built elsewhere (a plain CMake build dir of this project), and
takes that component's section and knobs from the variant's build_info.json, so the
variant's build info tells the truth about it.

    python benchmarks/variant_package.py --component fa2 \\
        --build-dir BUILD_DIR_OF_THE_VARIANT --dest /tmp/variant-fa2-ptx
    PYTHONPATH=/tmp/variant-fa2-ptx python benchmarks/first_call.py ...
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
from pathlib import Path


def modules() -> dict[str, str]:
    """Each compiled family's module, by family name (cmake/knobs.json families)."""
    from vendored_flash_attn.declaration.families import registry

    return {f.name: f.module for f in registry() if f.module}


def installed_package() -> Path:
    spec = importlib.util.find_spec("vendored_flash_attn")
    if spec is None or spec.origin is None:
        raise SystemExit("vendored_flash_attn is not installed")
    return Path(spec.origin).parent


def assemble(component: str, build_dir: Path, dest: Path, label: str) -> Path:
    module = modules()[component]
    built = sorted(build_dir.glob(f"{module}*.so"))
    if not built:
        raise SystemExit(f"{build_dir} holds no {module}*.so")
    package = dest / "vendored_flash_attn"
    if package.exists():
        shutil.rmtree(package)
    shutil.copytree(installed_package(), package)
    for old in package.glob(f"{module}*.so"):
        old.unlink()
    shutil.copy2(built[0], package / built[0].name)

    info = json.loads((package / "build_info.json").read_text())
    variant = json.loads((build_dir / "build_info.json").read_text())
    info[component] = variant[component]
    for name, knob in variant.get("options", {}).items():
        if knob.get("origin") != "default":
            info.setdefault("options", {})[name] = knob
    info["variant"] = {"component": component, "label": label}
    (package / "build_info.json").write_text(json.dumps(info, indent=2))
    return package


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--component", choices=sorted(modules()), required=True)
    parser.add_argument("--build-dir", type=Path, required=True, help="CMake build dir of the variant")
    parser.add_argument("--dest", type=Path, required=True, help="folder to put on PYTHONPATH")
    parser.add_argument("--label", default="variant", help="name recorded in the build info")
    args = parser.parse_args()
    package = assemble(args.component, args.build_dir, args.dest, args.label)
    print(f"{package}: {modules()[args.component]} from {args.build_dir} ({args.label})")


if __name__ == "__main__":
    main()
