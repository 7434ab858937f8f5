#!/bin/bash
# Issue 12: seed 003's experiments on strata in one session of consecutive
# runs on the quiet 2-core VM: (a, b) Figure 2, a cluster of three with 0, 1
# and 2 loggers, interleaved; (c) Figures 3-4, one logger shared by 1, 2 and
# 4 clusters; (e) the disk usage per minute behind Equations 1-2; (d) the
# logger's logging rate alone (BenchmarkLearnerLogging).
# Binaries: go build -o /tmp/bin/strata ./cmd/strata; go build -C bench -o /tmp/bin/bench .
set -u
OUT=${1:-/tmp/logger-onerun}
mkdir -p $OUT
cd /work/main/bench
B=/tmp/bin/bench
log() { echo "$(date -u +%H:%M:%S) $* (load $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a $OUT/steps.log; }
log figure2
$B logger -strata-bin /tmp/bin/strata -quiet -configs 1/1,10/10,50/50 -total 3000 -reps 2 -out $OUT/figure2 > $OUT/figure2.log 2>&1
log shared
$B logger -strata-bin /tmp/bin/strata -quiet -shared 1,2,4 -configs 10/10 -total 2000 -reps 2 -out $OUT/shared > $OUT/shared.log 2>&1
log cost
$B logger -strata-bin /tmp/bin/strata -quiet -cost-seconds 60 -configs 10/10 -out $OUT/cost > $OUT/cost.log 2>&1
log rate
(cd /work/main && go test -count=3 -run XXX -bench BenchmarkLearnerLogging -benchtime 20000x ./logger) > $OUT/rate.txt 2>&1
log end
