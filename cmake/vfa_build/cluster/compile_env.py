"""The environment a distributed compile sees: what a compile needs, nothing else.

sccache ships a compile's whole environment with it: the sccache client sends its own
environment to the local sccache server, which runs the compile with it and, for a
distributed compile, sends it to the build server, where sccache-dist passes each
variable to the sandbox (bubblewrap --setenv). Cache credentials (AWS_*, a Redis URL
with a password), the cluster's client token and whatever else a CI job holds would go
to every build server and into every remote cicc, ptxas and gcc. So both ends filter,
by the one list below:

  * the client: this script is the compiler launcher of a build that uses a scheduler
    (cmake/CompilerCache.cmake puts it in front of sccache). It runs sccache with only
    the variables in CLIENT_ENV; sccache's own server, which holds the cache
    credentials, keeps the environment it was started with (it is started here with
    the full environment when it is not running yet).

        compile_env.py SCCACHE ARGS...

  * the build server: dist-compile/bwrap-slots gives bubblewrap an empty environment
    (--clearenv) plus, of the client's variables, exactly those named in SERVER_ENV
    (cluster.py hands it `server_names()`), whatever client sent the compile, through a
    pipe (bwrap --args FD), never on a command line.

Names, not patterns: a pattern such as LC_* would pass any variable a client names so
(LC_TOKEN=...). Standard library only: it runs once per compile, as `python -E -s -S`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

# What gcc and nvcc read from the environment (gcc's "Environment Variables" manual
# page: its locale variables are LANG, LANGUAGE, LC_CTYPE, LC_MESSAGES and LC_ALL; nvcc's
# NVCC_* flags).
COMPILE_ENV = (
    "PATH", "LD_LIBRARY_PATH", "TMPDIR", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES",
    "SOURCE_DATE_EPOCH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "GCC_EXEC_PREFIX",
    "COMPILER_PATH", "DEPENDENCIES_OUTPUT", "SUNPRO_DEPENDENCIES",
    "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN",
)

# The sccache client's own: how it finds its server and where it logs (no credentials;
# the cache's settings are the server's business).
SCCACHE_CLIENT_ENV = ("SCCACHE_SERVER_PORT", "SCCACHE_SERVER_UDS", "SCCACHE_CONF", "SCCACHE_LOG",
                      "SCCACHE_ERROR_LOG", "SCCACHE_IGNORE_SERVER_IO_ERROR")

# What nvcc's driver sets for its steps (the `#$ NAME=value` lines of `nvcc --dryrun`,
# from its nvcc.profile; CUDA 12.x and 13.0 list these): sccache adds them to the
# cicc/ptxas/cudafe++ compiles it ships (cicc finds libdevice through NVVMIR_LIBRARY_DIR).
NVCC_STEP_ENV = ("_CUDART_", "_HERE_", "_NVVM_BRANCH_", "_SPACE_", "_TARGET_DIR_", "_TARGET_SIZE_", "_THERE_",
                 "TOP", "CICC_PATH", "CICC_NEXT_PATH", "NVVMIR_LIBRARY_DIR", "INCLUDES", "SYSTEM_INCLUDES",
                 "LIBRARIES", "CUDAFE_FLAGS", "PTXAS_FLAGS")

CLIENT_ENV = frozenset(COMPILE_ENV + SCCACHE_CLIENT_ENV)
SERVER_ENV = frozenset(COMPILE_ENV + NVCC_STEP_ENV)

DEFAULT_SCCACHE_PORT = 4226  # sccache's own default (SCCACHE_SERVER_PORT)


def client_env(environ: dict[str, str]) -> dict[str, str]:
    """The variables of `environ` a compile shipped to a build server may carry."""
    return {k: v for k, v in environ.items() if k in CLIENT_ENV}


def server_names() -> str:
    """SERVER_ENV as bwrap-slots takes it (VFA_DIST_COMPILE_ENV): space-separated names."""
    return " ".join(sorted(SERVER_ENV))


def sccache_server_answers(environ: dict[str, str]) -> bool:
    """Whether the sccache server this client would use is listening (sccache's get_addr)."""
    uds = environ.get("SCCACHE_SERVER_UDS")
    try:
        if uds:
            family, address = socket.AF_UNIX, ("\0" + uds[4:] if uds.startswith("\\x00") else uds)
        else:
            port = environ.get("SCCACHE_SERVER_PORT", "")
            family, address = socket.AF_INET, ("127.0.0.1", int(port) if port.isdigit() else DEFAULT_SCCACHE_PORT)
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(address)
        return True
    except OSError:
        return False


def main(argv: list[str]) -> int:
    if not argv:
        sys.exit("usage: compile_env.py SCCACHE ARGS... (the compiler launcher of a build that uses sccache-dist)")
    sccache, environ = argv[0], dict(os.environ)
    if not sccache_server_answers(environ):
        # The client would start its server with the filtered environment: no cache
        # credentials. Start it here with the full one (a concurrent start loses the race
        # harmlessly: the compile below connects to whichever server listens).
        subprocess.run([sccache, "--start-server"], env=environ, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    os.execvpe(sccache, argv, client_env(environ))
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
