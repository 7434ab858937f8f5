#!/bin/bash
# Issue 16: YCSB A-AWL at 10^6 keys on every engine against etcd 3.7.3, one round, each workload's own distribution.
set -u
OUT=/tmp/ycsb/out
mkdir -p $OUT
cd /work/main/bench
echo "start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/steps.log
/tmp/bin/bench all -servers etcd,strata,strata-bbolt,strata-appendlog,strata-hybridlog -etcd-bin /tmp/bin/etcd -strata-bin /tmp/bin/strata -quiet \
  -steps ycsb -ycsb-records 1000000 -ycsb-dists std -ycsb-ops 50000 -out $OUT/ycsb > $OUT/ycsb.log 2>&1
echo "end $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $OUT/steps.log
