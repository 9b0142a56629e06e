"""Stage torch's headers at a path chosen by their content, and print that path.

Every compile includes torch's headers, and the compiler cache keys on their absolute path:
sccache hashes the preprocessed text, whose line markers name each header by the path it was
read from, for C++ units and CUDA device compiles alike. Under pip's default build isolation
torch lies in a fresh ``/tmp/pip-build-env-*`` folder each time, so every unit that includes
torch missed the cache on every isolated build (docs/build.md: Builds, isolation and the compiler
cache). Compiled from a staged copy at ``<store>/torch-<version>-<digest>`` instead, the
compile lines depend only on torch's headers: two isolated builds, and an isolated build
after a non-isolated one with the same torch, issue the same compile lines.

The copy is made and checked by cmake/vfa_build/sources/staged_tree.py: hashed as it is written, renamed into
place whole, and a copy that is there already is used only when its files are these, owned
by this user and writable by nobody else. The store must be this user's alone.

    python cmake/vfa_build sources.torch_headers --torch-root <site-packages/torch> --version 2.14.1+cu130 --store <dir>

Exit 0: prints the staged torch root (its ``include/`` is torch's) and, on a second line,
"reused" or "staged" and the file count. Exit 2: the headers cannot be staged (a link or
special file among them, an unsafe store, a disk error); the reason on stderr, and the build
compiles from torch's own folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vfa_build.sources import staged_tree  # (a module of this package, run by CMake)

# What is staged: torch's include tree, which holds both of its include dirs
# (include/ and include/torch/csrc/api/include).
INCLUDE = "include"


def stage(torch_root: Path, version: str, store: Path) -> staged_tree.Staged:
    # A link or special file among them is never copied (staged_tree.stage refuses the tree:
    # a link could point anywhere); the build then compiles from torch's own folder.
    manifest, _odd = staged_tree.manifest_of(torch_root, [INCLUDE])
    if not manifest:
        raise staged_tree.StagingError(f"'{torch_root / INCLUDE}' holds no headers")
    # The name says which torch it is; the digest (staged_tree.stage) decides the path.
    return staged_tree.stage(torch_root, [INCLUDE], store, f"torch-{version}", expected=manifest)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--torch-root", type=Path, required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--store", type=Path, required=True)
    args = parser.parse_args(argv)
    if "/" in args.version or args.version.startswith("."):
        print(f"torch's version '{args.version}' cannot name a folder", file=sys.stderr)
        return 2
    try:
        staged = stage(args.torch_root, args.version, args.store)
    except (staged_tree.StagingError, OSError) as error:
        print(error, file=sys.stderr)
        return 2
    print(staged.path)
    print(f"{'reused' if staged.reused else 'staged'} {len(staged.manifest)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
