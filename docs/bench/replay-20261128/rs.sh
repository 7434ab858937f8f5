#!/bin/bash
# rs.sh SRC BIN [flags]: copy the crashed dir, restart BIN on it, time until healthy
set -u
SRC=$1; BIN=$2; shift 2
W=$(mktemp -d /tmp/rp/w-XXXX); cp -a $SRC/d $W/d; sync
PORT=$((20000 + RANDOM % 10000)); PPORT=$((PORT + 1))
T0=$(date +%s.%N)
$BIN --name l --data-dir $W/d --listen-client-urls http://127.0.0.1:$PORT --advertise-client-urls http://127.0.0.1:$PORT \
  --listen-peer-urls http://127.0.0.1:$PPORT --initial-advertise-peer-urls http://127.0.0.1:$PPORT \
  --initial-cluster l=http://127.0.0.1:$PPORT --quota-backend-bytes 8589934592 --log-level info "$@" > $W/server.log 2>&1 &
PID=$!
for _ in $(seq 6000); do curl -s -m 1 http://127.0.0.1:$PORT/health | grep -q true && break; sleep 0.01; done
T1=$(date +%s.%N)
echo "restart_s: $(echo "$T1 - $T0" | bc) $(grep -o '"log-open":[0-9.]*,"from-index.*"replay":[0-9.]*' $W/server.log)"
sleep ${WAIT:-0.5}; kill $PID; wait $PID 2>/dev/null; rm -rf $W
