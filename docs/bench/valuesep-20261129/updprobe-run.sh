#!/bin/bash
BIN=$1
D=$(mktemp -d /tmp/up.XXXX)
P=$((20000 + RANDOM % 20000))
$BIN --name m0 --data-dir $D/data --listen-client-urls http://127.0.0.1:$P --advertise-client-urls http://127.0.0.1:$P \
  --listen-peer-urls http://127.0.0.1:$((P+1)) --initial-advertise-peer-urls http://127.0.0.1:$((P+1)) \
  --initial-cluster m0=http://127.0.0.1:$((P+1)) --quota-backend-bytes 8589934592 --log-level warn > $D/log 2>&1 &
SP=$!
sleep 1
T0=$(date +%s)
/tmp/updprobe/updprobe http://127.0.0.1:$P ${N:-100000} ${ROUNDS:-6} | tail -1
echo "write s: $(( $(date +%s) - T0 )) du after compact: $(du -sm $D/data | cut -f1) MiB"
for t in 30 60 90; do sleep 30; echo "  +${t}s: $(du -sm $D/data | cut -f1) MiB; blob files $(ls $D/data/engine/ | grep -c blob)"; done
kill $SP; wait $SP; rm -rf $D
