#!/bin/bash
# cluster3.sh: three strata members on loopback ports with --enable-pprof,
# their data and logs in /tmp/rs/c3, each PID in /tmp/rs/c3/pidN (stop them
# with kill -- -$(cat /tmp/rs/c3/pidN)). BIN picks the binary.
set -u
rm -rf /tmp/rs/c3; mkdir -p /tmp/rs/c3
IC="m0=http://127.0.0.1:24000,m1=http://127.0.0.1:24010,m2=http://127.0.0.1:24020"
for i in 0 1 2; do
 cp=$((23900+i*10)); pp=$((24000+i*10))
 setsid ${BIN:-/tmp/bin/strata} --enable-pprof --name m$i --data-dir /tmp/rs/c3/m$i --listen-client-urls http://127.0.0.1:$cp --advertise-client-urls http://127.0.0.1:$cp --listen-peer-urls http://127.0.0.1:$pp --initial-advertise-peer-urls http://127.0.0.1:$pp --initial-cluster $IC --initial-cluster-state new --log-level warn > /tmp/rs/c3/log$i 2>&1 &
 echo $! > /tmp/rs/c3/pid$i
done
sleep 2
