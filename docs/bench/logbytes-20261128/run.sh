#!/bin/sh
# The log bounded in bytes (node.DefaultSnapshotBytes, DefaultCatchUpBytes;
# raftlog.DefaultSegmentSize 16 MiB): disk and restart after a bulk load of
# 10^6 keys, etcd 3.7.3 against strata with the change (strata) and without
# it (strata-base, d3e37c1), three runs in alternating server order.
#   go build -o /tmp/bin/strata ./cmd/strata
#   git worktree add /tmp/base d3e37c1 && go build -C /tmp/base -o /tmp/bin/strata-base ./cmd/strata
#   (cd tools && go build -o /tmp/bin/ ./cmd/etcd)
set -e
out=$(cd "$(dirname "$0")" && pwd)
for i in 1 2 3; do
	case $i in
	2) servers=strata-base,strata,etcd ;;
	*) servers=etcd,strata,strata-base ;;
	esac
	go run -C "$(git rev-parse --show-toplevel)/bench" . restart -servers $servers \
		-strata-bin /tmp/bin/strata -strata-base-bin /tmp/bin/strata-base -etcd-bin /tmp/bin/etcd \
		-restart-keys 1000000 -quiet -out "$out/run$i"
done
