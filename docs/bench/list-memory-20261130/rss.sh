#!/bin/bash
# usage: rss.sh <binary> <datadir> ; prints RSS idle, after load, peak during one list
BIN=$1; DD=$2; PORT=${3:-23790}
rm -rf $DD
$BIN --data-dir $DD --listen-client-urls http://127.0.0.1:$PORT --advertise-client-urls http://127.0.0.1:$PORT --listen-peer-urls http://127.0.0.1:$((PORT+1)) --initial-advertise-peer-urls http://127.0.0.1:$((PORT+1)) --initial-cluster default=http://127.0.0.1:$((PORT+1)) --log-level warn $EXTRA > $DD.log 2>&1 &
PID=$!
sleep 2
echo "idle: $(grep -E 'VmRSS|RssAnon|RssFile' /proc/$PID/status | tr -s ' \n' ' ')"
python3 - "$PORT" <<'PY'
import sys,subprocess
port=sys.argv[1]
v='v'*1024
lines=[]
for i in range(10000):
    lines.append(f"put list/{i:08d} {v}")
# use etcdctl txn in batches of 100
for lo in range(0,10000,100):
    txt="\n"+"\n".join(lines[lo:lo+100])+"\n\n\n"
    subprocess.run(["/tmp/bin/etcdctl","--endpoints=127.0.0.1:"+port,"txn"],input=txt.encode(),stdout=subprocess.DEVNULL,check=True)
PY
sleep 1
echo "loaded: $(grep -E 'VmRSS|RssAnon|RssFile' /proc/$PID/status | tr -s ' \n' ' ')"
[ -n "$PPROF" ] && curl -s -o /tmp/probe/heap.pb.gz "http://127.0.0.1:$PORT/debug/pprof/heap?gc=1"
curl -s http://127.0.0.1:$PORT/metrics | grep -E "^go_memstats_(heap_inuse|heap_idle|heap_released|heap_alloc|stack_inuse|sys|next_gc)_bytes|^go_gc_gogc|^go_gc_gomemlimit"
echo 5 > /proc/$PID/clear_refs
/tmp/bin/etcdctl --endpoints=127.0.0.1:$PORT get list/ --prefix --keys-only=false -w json > /dev/null
/tmp/bin/etcdctl --endpoints=127.0.0.1:$PORT get list/ --prefix -w json > /dev/null
echo "after 2 lists: $(grep -E 'VmHWM|VmRSS|RssAnon|RssFile' /proc/$PID/status | tr -s ' \n' ' ')"
awk '/^[0-9a-f]+-[0-9a-f]+ /{name=$6} /^Rss:/{r[name]+=$2} END{for(n in r) if(r[n]>500) print r[n], n}' /proc/$PID/smaps | sort -rn | head -12
/tmp/bin/etcdctl --endpoints=127.0.0.1:$PORT get list/ --prefix --count-only -w fields | grep Count; kill $PID; wait $PID
