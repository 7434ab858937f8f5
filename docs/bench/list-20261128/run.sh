#!/bin/bash
# LIST rows against etcd 3.7.3: strata with ranges answered from the stored
# bytes, Range and RangeStream (b89a46f), and without (strata-base, 14c3474),
# interleaved rounds.
#   go build -o /tmp/bin/strata ./cmd/strata
#   git worktree add /tmp/base 14c3474 && go build -C /tmp/base -o /tmp/bin/strata-base ./cmd/strata
#   (cd tools && go build -o /tmp/bin/ ./cmd/etcd)
#   go build -C bench -o /tmp/bin/bench .
set -u
REPO=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
OUT=${1:-$REPO/docs/bench/list-20261128}
cd "$REPO/bench"
/tmp/bin/bench all -steps list -servers etcd,strata,strata-base -etcd-bin /tmp/bin/etcd \
  -strata-bin /tmp/bin/strata -strata-base-bin /tmp/bin/strata-base -quiet \
  -list-keys 10000,100000 -list-configs 1/1,10/10 -list-modes range,stream -list-total 20 -rounds 2 \
  -out "$OUT/list" > "$OUT/list.log" 2>&1
