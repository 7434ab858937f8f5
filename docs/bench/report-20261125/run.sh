#!/bin/bash
# The issue 15 report run: every step against etcd 3.7.3, interleaved rounds.
set -u
OUT=${1:-/tmp/final/out}
mkdir -p $OUT
cd /work/main/bench
B=/tmp/final/bench
COMMON="-servers etcd,strata -etcd-bin /tmp/etcdbin/etcd -strata-bin /tmp/final/strata -quiet"
log() { echo "$(date -u +%H:%M:%S) $* (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a $OUT/steps.log; }
log put-1
$B all $COMMON -steps put -rounds 3 -put-configs 1/1,100/100,100/1000 -put-total 10000 -out $OUT/put > $OUT/put.log 2>&1
log put-3members
$B all $COMMON -steps put -members 3 -rounds 3 -put-configs 100/1000 -put-total 20000 -out $OUT/put3 > $OUT/put3.log 2>&1
log list
$B all $COMMON -steps list -rounds 2 -list-keys 10000,100000 -list-configs 1/1,10/10 -list-total 20 -out $OUT/list > $OUT/list.log 2>&1
log ycsb
$B all $COMMON -steps ycsb -rounds 2 -ycsb-records 1000000 -ycsb-dists std,uniform -ycsb-ops 50000 -out $OUT/ycsb > $OUT/ycsb.log 2>&1
log restart-defrag
$B all $COMMON -steps restart,defrag -restart-keys 1000000 -defrag-keys 100000 -out $OUT/restart > $OUT/restart.log 2>&1
log loadcurve
mkdir -p $OUT/load
for r in 1 2; do
  for s in etcd strata; do
    [ $r = 2 ] && [ $s = etcd ] && continue
    bin=/tmp/final/strata; [ $s = etcd ] && bin=/tmp/etcdbin/etcd
    log "load $s round $r"
    LOADCURVE=/tmp/loadcurve ./cmd/loadcurve/load-restart.sh $bin 1000000 > $OUT/load/$s-$r.txt 2>&1
  done
done
log "load etcd round 2"
LOADCURVE=/tmp/loadcurve ./cmd/loadcurve/load-restart.sh /tmp/etcdbin/etcd 1000000 > $OUT/load/etcd-2.txt 2>&1
log grow
$B grow -servers etcd,strata -etcd-bin /tmp/etcdbin/etcd -strata-bin /tmp/final/strata -grow-bytes 2GiB -grow-interval 10s -out $OUT/grow > $OUT/grow.log 2>&1
log done
