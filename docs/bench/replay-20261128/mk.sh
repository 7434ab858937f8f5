#!/bin/bash
# mk.sh OUT N [flags]: load N keys into a fresh strata, kill -9, keep the crashed dir in OUT
set -u
BIN=/tmp/bin/strata; OUT=$1; N=$2; shift 2
rm -rf $OUT; mkdir -p $OUT
PORT=$((20000 + RANDOM % 10000)); PPORT=$((PORT + 1))
$BIN --name l --data-dir $OUT/d --listen-client-urls http://127.0.0.1:$PORT --advertise-client-urls http://127.0.0.1:$PORT \
  --listen-peer-urls http://127.0.0.1:$PPORT --initial-advertise-peer-urls http://127.0.0.1:$PPORT \
  --initial-cluster l=http://127.0.0.1:$PPORT --quota-backend-bytes 8589934592 --log-level warn "$@" > $OUT/server.log 2>&1 &
PID=$!
for _ in $(seq 600); do curl -s -m 1 http://127.0.0.1:$PORT/health | grep -q true && break; sleep 0.01; done
/tmp/bin/loadcurve -ep 127.0.0.1:$PORT -n $N | tail -1
kill -9 $PID; wait $PID 2>/dev/null
echo "$PORT" > $OUT/port
