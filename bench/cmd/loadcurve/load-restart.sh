#!/bin/bash
# load-restart.sh BIN N [server flags...]: start BIN (strata or etcd: the same
# flags) as a single member on loopback ports with a fresh data directory,
# load N keys with loadcurve, report the server's CPU seconds, peak RSS and
# disk, then kill -9 it and time a restart until /health answers true.
# Run from bench/: go build -o /tmp/loadcurve ./cmd/loadcurve first.
# LOADCURVE_FLAGS adds loadcurve flags, e.g. "-txn 1 -w 64" for plain puts.
set -u
BIN=$1; N=$2; shift 2
LOADCURVE=${LOADCURVE:-/tmp/loadcurve}
D=$(mktemp -d "${TMPDIR:-/tmp}/load-restart-XXXX")
PORT=$((20000 + RANDOM % 10000)); PPORT=$((PORT + 1))
start() {
  "$BIN" --name l --data-dir "$D/d" --listen-client-urls "http://127.0.0.1:$PORT" --advertise-client-urls "http://127.0.0.1:$PORT" \
    --listen-peer-urls "http://127.0.0.1:$PPORT" --initial-advertise-peer-urls "http://127.0.0.1:$PPORT" \
    --initial-cluster "l=http://127.0.0.1:$PPORT" --quota-backend-bytes 8589934592 --log-level warn "$@" >> "$D/server.log" 2>&1 &
  PID=$!
}
healthy() {
  for _ in $(seq 6000); do
    curl -s -m 1 "http://127.0.0.1:$PORT/health" | grep -q true && return 0
    sleep 0.01
  done
  return 1
}
start "$@"
healthy || { echo "server did not start"; cat "$D/server.log"; kill -9 $PID; rm -rf "$D"; exit 1; }
# shellcheck disable=SC2086 # LOADCURVE_FLAGS is a list of flags
"$LOADCURVE" -ep "127.0.0.1:$PORT" -n "$N" ${LOADCURVE_FLAGS:-}
echo "cpu_s: $(awk '{print ($14+$15)/100}' /proc/$PID/stat)"
echo "peak_rss_kib: $(awk '/VmHWM/{print $2}' /proc/$PID/status)"
echo "disk_mib: $(du -sm "$D/d" | cut -f1)"
kill -9 $PID; wait $PID 2>/dev/null
T0=$(date +%s.%N)
start "$@"
healthy && echo "restart_s: $(echo "$(date +%s.%N) - $T0" | bc)"
kill $PID; wait $PID 2>/dev/null
rm -rf "$D"
