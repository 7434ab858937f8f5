#!/bin/sh
# Incremental backup bytes after 1% changes, per engine, files versions only, etcd's full snapshots in the same run.
for e in ${ENGINES:-pebble bbolt appendlog hybridlog}; do
  /tmp/bin/bench backup -etcd-bin /tmp/bin/etcd -strata-bin /tmp/bin/strata -experiments update -base-keys 100000 -update-steps 3 -update-pct 1 \
    -strata-flags=--engine=$e,--backup-log-ratio=0 -quiet -repo /work/main -out /tmp/bk/$e > /tmp/bk/$e.log 2>&1
  echo "$e done $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/bk/steps.log
done
