#!/bin/bash
# Issue 16: every engine against etcd at the server level, one run, one round.
set -u
OUT=${1:-/tmp/final/engines}
cd /work/main/bench
/tmp/final/bench all -servers etcd,strata,strata-bbolt,strata-appendlog,strata-hybridlog \
  -etcd-bin /tmp/etcdbin/etcd -strata-bin /tmp/final/strata -quiet \
  -steps put,ycsb,restart -put-configs 1/1,100/100,100/1000 -put-total 10000 \
  -ycsb-records 10000 -ycsb-ops 20000 -restart-keys 100000 -out $OUT > $OUT.log 2>&1
echo "exit $?" >> $OUT.log
