#!/bin/bash
# Issue 15 rows after the previous-version read changes (engine/pebble:
# kept iterator with L6 filters, memKeys), against etcd 3.7.3, interleaved
# rounds, on the quiet machine. Binaries: go build -o /tmp/final2/strata
# ./cmd/strata; go build -C bench -o /tmp/final2/bench .; etcd from tools/.
set -u
OUT=${1:-/tmp/final2/out}
mkdir -p $OUT
cd /work/main/bench
B=/tmp/final2/bench
COMMON="-servers etcd,strata -etcd-bin /tmp/etcdbin/etcd -strata-bin /tmp/final2/strata -quiet"
log() { echo "$(date -u +%H:%M:%S) $* (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a $OUT/steps.log; }
log put-1
$B all $COMMON -steps put -rounds 3 -put-configs 1/1,100/100,100/1000 -put-total 10000 -out $OUT/put > $OUT/put.log 2>&1
log ycsb
$B all $COMMON -steps ycsb -rounds 2 -ycsb-records 1000000 -ycsb-dists std -ycsb-ops 50000 -out $OUT/ycsb > $OUT/ycsb.log 2>&1
log restart
$B all $COMMON -steps restart -restart-keys 1000000 -out $OUT/restart > $OUT/restart.log 2>&1
log loadcurve
mkdir -p $OUT/load
for s in strata etcd strata etcd; do
  bin=/tmp/final2/strata; [ $s = etcd ] && bin=/tmp/etcdbin/etcd
  n=$(ls $OUT/load | grep -c "^$s-")
  log "load $s round $((n+1))"
  LOADCURVE=/tmp/loadcurve ./cmd/loadcurve/load-restart.sh $bin 1000000 > $OUT/load/$s-$((n+1)).txt 2>&1
done
log done
