#!/bin/bash
# The issue 15 report run (eighteenth session): the sixteenth session's script
# (report-20261129c/run.sh) with its output directory, and the restart and
# defrag step in three interleaved rounds (one each there; the sixteenth
# session ran the restart in four rounds after the run).
# Binaries in /tmp/bin:
#   go build -o /tmp/bin/strata ./cmd/strata
#   (cd tools && go build -o /tmp/bin/ ./cmd/etcd)
#   go build -C bench -o /tmp/bin/bench . && go build -C bench -o /tmp/bin/loadcurve ./cmd/loadcurve
set -u
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
OUT=${1:-$REPO/docs/bench/report-20261130}
mkdir -p "$OUT"
cd "$REPO/bench"
B=/tmp/bin/bench
COMMON="-servers etcd,strata -etcd-bin /tmp/bin/etcd -strata-bin /tmp/bin/strata -quiet"
log() { echo "$(date -u +%H:%M:%S) $* (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$OUT/steps.log"; }
log put-1
$B all $COMMON -steps put -rounds 3 -put-configs 1/1,100/100,100/1000 -put-total 10000 -out "$OUT/put" > "$OUT/put.log" 2>&1
log put-3members
$B all $COMMON -steps put -members 3 -rounds 3 -put-configs 100/1000 -put-total 20000 -out "$OUT/put3" > "$OUT/put3.log" 2>&1
log list
$B all $COMMON -steps list -rounds 2 -list-keys 10000,100000 -list-configs 1/1,10/10 -list-modes range,stream -list-total 20 -out "$OUT/list" > "$OUT/list.log" 2>&1
log ycsb
$B all $COMMON -steps ycsb -rounds 4 -ycsb-records 1000000 -ycsb-dists std,uniform -ycsb-ops 50000 -out "$OUT/ycsb" > "$OUT/ycsb.log" 2>&1
log restart-defrag
$B all $COMMON -steps restart,defrag -rounds 3 -restart-keys 1000000 -defrag-keys 100000 -out "$OUT/restart" > "$OUT/restart.log" 2>&1
log loadcurve
mkdir -p "$OUT/load"
# Alternated: etcd, strata, strata, etcd, etcd, strata.
i=0
for s in etcd strata strata etcd etcd strata; do
  i=$((i + 1))
  bin=/tmp/bin/strata; [ $s = etcd ] && bin=/tmp/bin/etcd
  log "load $s run $i"
  LOADCURVE=/tmp/bin/loadcurve ./cmd/loadcurve/load-restart.sh $bin 1000000 > "$OUT/load/$s-$i.txt" 2>&1
done
log grow
$B grow -servers etcd,strata -etcd-bin /tmp/bin/etcd -strata-bin /tmp/bin/strata -grow-bytes 2GiB -grow-interval 10s -out "$OUT/grow" > "$OUT/grow.log" 2>&1
log restart-10m
$B all $COMMON -steps restart -restart-keys 10000000 -out "$OUT/restart10m" > "$OUT/restart10m.log" 2>&1
for s in etcd strata; do
  bin=/tmp/bin/strata; [ $s = etcd ] && bin=/tmp/bin/etcd
  log "load10m $s"
  LOADCURVE=/tmp/bin/loadcurve ./cmd/loadcurve/load-restart.sh $bin 10000000 > "$OUT/load/$s-10m.txt" 2>&1
done
log done
