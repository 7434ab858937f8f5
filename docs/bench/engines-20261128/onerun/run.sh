#!/bin/bash
# Issue 16: every engine against etcd 3.7.3 on every row, in one session of
# consecutive bench invocations on the quiet 2-core VM, one round each.
# Binaries: go build -o /tmp/bin/strata ./cmd/strata; go build -C bench -o /tmp/bin/bench .;
# go build -C tools -o /tmp/bin/ ./cmd/etcd ./cmd/etcdctl ./cmd/etcdutl.
set -u
OUT=${1:-/tmp/onerun/out}
mkdir -p $OUT
cd /work/main/bench
B=/tmp/bin/bench
COMMON="-etcd-bin /tmp/bin/etcd -strata-bin /tmp/bin/strata -quiet"
log() { echo "$(date -u +%H:%M:%S) $* (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a $OUT/steps.log; }
log all
$B all $COMMON -servers etcd,strata,strata-bbolt,strata-appendlog,strata-hybridlog \
  -steps put,range,list,ycsb,restart,defrag -put-configs 1/1,100/100,100/1000 -put-total 10000 \
  -ycsb-records 10000,1000000 -ycsb-dists std -ycsb-ops 50000 -restart-keys 1000000 -defrag-keys 100000 \
  -out $OUT/all > $OUT/all.log 2>&1
for e in pebble bbolt appendlog hybridlog; do
  log backup-$e
  $B backup $COMMON -experiments update -base-keys 100000 -update-steps 3 -update-pct 1 \
    -strata-flags=--engine=$e,--backup-log-ratio=0 -out $OUT/backup-$e > $OUT/backup-$e.log 2>&1
done
log end
