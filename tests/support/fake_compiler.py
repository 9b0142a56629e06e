"""A compiler launcher for build tests that must not wait for nvcc: set as
CMAKE_<LANG>_COMPILER_LAUNCHER, it is called as `fake_compiler.py COMPILER ARGS...`.

By default it writes an empty object (a copy of $FAKE_EMPTY_OBJECT, else the host
compiler on an empty file) and the depfile ninja expects, without running the real
compile: a module of empty objects still links. With $FAKE_NOISE_ROOT set every unit first prints, as every unit of the
real upstream does with CUDA 13, gcc's `long4` deprecation warnings located in that
(CUTLASS) tree, plus one warning located elsewhere. $FAKE_COMPILE_PLAN (JSON:
[[substring, action], ...], first match on the command line wins) changes what a unit
does:

  "sleep:S"          succeed after S seconds
  "until:NAME"       succeed once $FAKE_MARKERS/NAME exists (a test's event); after 300 s
                     without it, succeed anyway and leave <name>.timedout (the test says so)
  "wait-for:PATH"    succeed once PATH exists (a test acts while the unit compiles; 300 s at most)
  "fail"             print an error located in the upstream source, exit 1
  "fail-after:NAME"  the same, once a unit whose output name contains NAME has started
  "real:HEADER"      run the real compile with `-include HEADER` (a test's broken header)

$FAKE_MARKERS is a folder where each unit leaves <name>.started / <name>.ended (times) and
<name>.pid (its process, to see whether it still runs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def arg_after(args: list[str], flag: str) -> str | None:
    for i in range(len(args) - 2, -1, -1):
        if args[i] == flag:
            return args[i + 1]
    return None


def noise(root: str) -> str:
    header = f"{root}/include/cutlass/platform/platform.h"
    text = ""
    for line, name in ((599, "long4"), (603, "ulong4")):
        text += (f"In file included from {root}/include/cutlass/numeric_types.h:40,\n"
                 f"                 from {root}/include/cute/tensor.hpp:3:\n"
                 f"{header}:{line}:21: warning: \u2018{name}\u2019 is deprecated: use {name}_16a or "
                 f"{name}_32a [-Wdeprecated-declarations]\n"
                 f"  {line} | struct alignment_of<{name}> {{\n"
                 f"      |                     ^~~~~\n"
                 f"/usr/local/cuda/include/vector_types.h:532:98: note: declared here\n"
                 f"  532 | typedef __device_builtin__ struct {name} __VECTOR_TYPE_DEPRECATED__(\"use {name}_16a\") {name};\n"
                 f"      |                                                                ^~~~~\n")
    text += "/tmp/vfa-our-own-code/generated.cpp:7:5: warning: unused variable \u2018ours\u2019 [-Wunused-variable]\n"
    return text


def main() -> int:
    command = sys.argv[1:]
    joined = " ".join(command)
    obj = arg_after(command, "-o")
    markers = os.environ.get("FAKE_MARKERS")
    name = Path(obj).name if obj else "unit"
    if markers:
        Path(markers, f"{name}.pid").write_text(str(os.getpid()))
        Path(markers, f"{name}.started").write_text(str(time.time()))
    action = ""
    for pattern, what in json.loads(os.environ.get("FAKE_COMPILE_PLAN", "[]")):
        if pattern in joined:
            action = what
            break
    root = os.environ.get("FAKE_NOISE_ROOT")
    if root:  # like every unit of the real upstream with CUDA 13
        sys.stdout.write(noise(root))
    rc = 0
    if action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
    elif action.startswith("until:") and markers:
        release, deadline = Path(markers, action.split(":", 1)[1]), time.monotonic() + 300
        while not release.exists():
            if time.monotonic() > deadline:
                Path(markers, f"{name}.timedout").write_text(str(time.time()))
                break
            time.sleep(0.05)
    elif action.startswith("wait-for:"):
        go, deadline = Path(action.split(":", 1)[1]), time.monotonic() + 300
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    elif action.startswith(("fail", "fail-after:")):
        if action.startswith("fail-after:") and markers:
            other = action.split(":", 1)[1]
            deadline = time.time() + 60
            while time.time() < deadline and not any(
                    p.name.endswith(".started") and other in p.name for p in Path(markers).iterdir()):
                time.sleep(0.05)
        sys.stdout.write(f"{root}/hopper/flash_api.cpp:12:3: error: deliberate failure of this unit\n"
                         f"   12 |   broken();\n      |   ^~~~~~\n")
        rc = 1
    elif action.startswith("real:"):
        header = action.split(":", 1)[1]
        sys.stdout.flush()
        rc = subprocess.run([*command, "-include", header]).returncode
    if rc == 0 and obj and not action.startswith("real:"):
        Path(obj).parent.mkdir(parents=True, exist_ok=True)
        empty = os.environ.get("FAKE_EMPTY_OBJECT")
        if empty:
            shutil.copyfile(empty, obj)
        else:
            rc = subprocess.run(["c++", "-x", "c++", "-c", os.devnull, "-o", obj]).returncode
    depfile = arg_after(command, "-MF")
    if depfile and rc == 0 and not Path(depfile).exists():
        Path(depfile).write_text(f"{obj}: \n")
    if markers:
        Path(markers, f"{name}.ended").write_text(str(time.time()))
    sys.stdout.flush()
    return rc


if __name__ == "__main__":
    sys.exit(main())
