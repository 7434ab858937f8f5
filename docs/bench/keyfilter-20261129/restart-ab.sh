#!/bin/bash
# restart-ab.sh N ROUNDS BIN_A BIN_B: load N keys into BIN_A, kill -9 it, then
# restart copies of that data directory with A and B alternated (ABBA...),
# timing each until /health answers true; prints the filter's build log line.
set -u
N=$1; ROUNDS=$2; A=$3; B=$4
D=$(mktemp -d /tmp/restart-ab-XXXX)
PORT=$((20000 + RANDOM % 10000)); PPORT=$((PORT + 1))
start() { # bin dir
  "$1" --name l --data-dir "$2" --listen-client-urls "http://127.0.0.1:$PORT" --advertise-client-urls "http://127.0.0.1:$PORT" \
    --listen-peer-urls "http://127.0.0.1:$PPORT" --initial-advertise-peer-urls "http://127.0.0.1:$PPORT" \
    --initial-cluster "l=http://127.0.0.1:$PPORT" --quota-backend-bytes 8589934592 --log-level info > "$D/server.log" 2>&1 &
  PID=$!
}
healthy() { for _ in $(seq 6000); do curl -s -m 1 "http://127.0.0.1:$PORT/health" | grep -q true && return 0; sleep 0.01; done; return 1; }
start "$A" "$D/src"; healthy || exit 1
"${LOADCURVE:-/tmp/bin/loadcurve}" -ep "127.0.0.1:$PORT" -n "$N" | tail -1
kill -9 $PID; wait $PID 2>/dev/null
for r in $(seq "$ROUNDS"); do
  order="$A $B"; [ $((r % 2)) = 0 ] && order="$B $A"
  for bin in $order; do
    rm -rf "$D/run"; cp -a "$D/src" "$D/run"; sync
    T0=$(date +%s.%N); start "$bin" "$D/run"; healthy
    T=$(echo "$(date +%s.%N) - $T0" | bc)
    sleep 1
    echo "$(basename "$bin") restart_s=$T $(grep -o '"msg":"replayed[^}]*\|"msg":"filter of current keys built[^}]*' "$D/server.log" | tr '\n' ' ')"
    kill $PID; wait $PID 2>/dev/null
  done
done
rm -rf "$D"
