#!/bin/bash
# faults-first-list.sh: a fresh single strata member, 10^5 keys of 1 KiB
# loaded (the bench's LoadList), then three RangeStream LISTs of all of
# them, one at a time; prints the server's minor page faults and CPU ticks
# (/proc/PID/stat) between the steps. ENVX sets the server's environment,
# e.g. ENVX=GLIBC_TUNABLES=glibc.malloc.hugetlb=1. rsprobe is rsprobe.go.txt
# built inside the bench module (go build -o /tmp/bin/rsprobe ./cmd/rsprobe).
set -u
STRATA=${STRATA:-/tmp/bin/strata}; RSPROBE=${RSPROBE:-/tmp/bin/rsprobe}
D=$(mktemp -d)
setsid env ${ENVX:-X=1} "$STRATA" --data-dir "$D/d" --listen-client-urls http://127.0.0.1:23790 --advertise-client-urls http://127.0.0.1:23790 \
  --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster default=http://127.0.0.1:23800 --log-level warn > "$D/log" 2>&1 &
P=$!
sleep 1
f() { awk '{print "minflt", $10, "utime", $14, "stime", $15}' /proc/$P/stat; }
f
"$RSPROBE" -ep 127.0.0.1:23790 -reqs 0
for _ in 1 2 3; do
  f
  "$RSPROBE" -ep 127.0.0.1:23790 -reqs 1 -load=false
done
f
kill -- -$P
sleep 0.5
rm -rf "$D"
