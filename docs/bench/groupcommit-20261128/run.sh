#!/bin/bash
# The runs of performance.md's "Group commit under load" (2026-11-28, sixth
# session), on the 2-core AMD EPYC VM, alone. Base: strata at 79125db.
# Experimental build: 79125db plus linger.patch (knobs from the environment).
# Run from the repository root with bin/ holding etcd, strata (base) and
# strata-l (patched): go build -o bin/strata ./cmd/strata, then
# git apply docs/bench/groupcommit-20261128/linger.patch && go build -o bin/strata-l ./cmd/strata.
set -eu
B=$PWD/bin
variant() { # name env...: a wrapper that runs the patched binary with the knobs
  printf '#!/bin/sh\nexport %s\nexec %s/strata-l "$@"\n' "$2" "$B" > "$B/strata-$1"; chmod +x "$B/strata-$1"
}
variant 200 "STRATA_LINGER_US=200"
variant 1000 "STRATA_LINGER_US=1000"
variant A "STRATA_LINGER_US=1000 STRATA_LINGER_MIN=2"
variant B "STRATA_LINGER_US=1000 STRATA_LINGER_MIN=2 STRATA_LINGER_GAP_US=100"
variant D "STRATA_LINGER_US=1000 STRATA_LINGER_MIN=16 STRATA_LINGER_GAP_US=100"
put() { # variant out configs rounds [extra]
  (cd bench && go run . put -servers strata,strata-base -strata-bin "$B/strata-$1" -strata-base-bin "$B/strata" \
    -etcd-bin "$B/etcd" -put-configs "$3" -put-total 20000 -rounds "$4" -quiet -out "/tmp/groupcommit/$2" ${5:-})
}
put 200 linger200 1/1,100/100,100/1000 3
put 1000 linger1000 1/1,100/100,100/1000 3
put A lingerA 4/4,16/16,100/100,100/1000 2
put B lingerB 4/4,16/16,100/100,100/1000 2
put D lingerD 4/4,8/8,16/16,32/32,100/100,100/1000 2
put D lingerD3 100/1000 2 "-members 3"
# workers1.md: server/kv.go's grpc.NumStreamWorkers at 256 instead of
# GOMAXPROCS (strata-w256), same put command, 100/100,100/1000, 3 rounds.
# ycsbget.md: engine/pebble batch.Get reading a key memKeys may hold through
# pebble.Batch.Get (strata-get):
#   go run . ycsb -servers strata,strata-base -ycsb-config 10/100 -ycsb-records 1000000
#     -ycsb-ops 50000 -ycsb-workloads A,AW -ycsb-dists zipfian,uniform -rounds 2
# restart-bound.txt: bench/cmd/loadcurve/load-restart.sh BIN 1000000 [flags],
# alternated default, 8 MiB and 4 MiB, two rounds; etcd once.
