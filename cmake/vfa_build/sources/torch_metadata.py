"""Print torch's CMake prefix, version and CUDA version, one per line, without
importing torch.

The build needs only these three strings; importing torch to get them costs
seconds (3-6 s on the H200 host), a large share of a warm rebuild. torch keeps
them in torch/version.py, which imports nothing of torch, and its CMake config
lives in torch/share/cmake (what torch.utils.cmake_prefix_path returns).
"""

import importlib.util
import runpy
import sys
from pathlib import Path

spec = importlib.util.find_spec("torch")
if spec is None or not spec.submodule_search_locations:
    sys.exit(f"torch is not installed for {sys.executable}")
root = Path(list(spec.submodule_search_locations)[0])
version_file = root / "version.py"
if not version_file.is_file():
    sys.exit(f"{version_file} is missing: the torch installation is incomplete")
info = runpy.run_path(str(version_file))
print(root / "share" / "cmake")
print(info["__version__"])
print(info.get("cuda") or "")
