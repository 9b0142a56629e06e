"""Configure a source tree for real (`minimal` and `full`, configure only) and keep what the
configure decided: compile_commands.json and build_info.json, with the tree's and the build
dir's paths replaced by placeholders, so that two trees (before and after a change that must
not change what builds) compare file for file.

    python benchmarks/configure_compare.py snapshot --tree <checkout> --out <dir>
    python benchmarks/configure_compare.py diff <dir before> <dir after>

Each configure runs `cmake -S <tree> -B <build> -G Ninja -DVFA_PRESET=<preset>
-DVFA_COMPILER_CACHE=off -DVFA_BUILD_FA4=off` (as docs/trust.md's source-check figures configure;
plus -DVFA_BUILD_MEMORY_MB=16384, whose default is the memory free at that moment)
from the real source cache (`VFA_SOURCE_CACHE` or its default; fill it first, docs/trust.md: "Filling
the cache"), with the cmake and Python of the environment running this script.
"""

from __future__ import annotations

import argparse
import difflib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PRESETS = ("minimal", "full")
FILES = ("compile_commands.json", "build_info.json")


def _cmake() -> str:
    here = Path(sys.executable).parent / "cmake"
    return str(here) if here.exists() else (shutil.which("cmake") or "cmake")


def _normalised(text: str, tree: Path, build: Path) -> str:
    # build first: it may lie under the tree
    for path, word in ((build.resolve(), "<build>"), (tree.resolve(), "<tree>")):
        text = text.replace(str(path), word)
    return text


def snapshot(tree: Path, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for preset in PRESETS:
        with tempfile.TemporaryDirectory(prefix=f"vfa-configure-{preset}-") as tmp:
            build = Path(tmp)
            # VFA_BUILD_MEMORY_MB fixed: its default is the memory available at that moment
            cmd = [_cmake(), "-S", str(tree), "-B", str(build), "-G", "Ninja", f"-DVFA_PRESET={preset}",
                   "-DVFA_COMPILER_CACHE=off", "-DVFA_BUILD_FA4=off", "-DVFA_BUILD_MEMORY_MB=16384",
                   f"-DPython_EXECUTABLE={sys.executable}"]
            result = subprocess.run(cmd, capture_output=True, text=True)
            (out / f"{preset}.configure.log").write_text(result.stdout + result.stderr)
            if result.returncode != 0:
                print(f"{preset}: configure failed (exit {result.returncode}); see {out}/{preset}.configure.log")
                return 1
            for name in FILES:
                text = _normalised((build / name).read_text(), tree, build)
                if name == "compile_commands.json":
                    text = json.dumps(sorted(json.loads(text), key=lambda e: e["file"]), indent=1)
                (out / f"{preset}.{name}").write_text(text)
            print(f"{preset}: {out}")
    return 0


def diff(before: Path, after: Path) -> int:
    differs = 0
    for preset in PRESETS:
        for name in FILES:
            a, b = (d / f"{preset}.{name}" for d in (before, after))
            lines = list(difflib.unified_diff(a.read_text().splitlines(True), b.read_text().splitlines(True),
                                              str(a), str(b)))
            print(f"{preset} {name}: {'identical' if not lines else f'{len(lines)} diff lines'}")
            sys.stdout.writelines(lines[:200])
            differs |= bool(lines)
    return 1 if differs else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot")
    snap.add_argument("--tree", type=Path, required=True)
    snap.add_argument("--out", type=Path, required=True)
    cmp_ = sub.add_parser("diff")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    args = parser.parse_args()
    return snapshot(args.tree, args.out) if args.command == "snapshot" else diff(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
