#!/usr/bin/env python3
"""Bucket the samples of a Go CPU profile (go tool pprof -traces output on
stdin) by the first matching frame, leaf to root. Prints ms and % per bucket."""
import re, sys
from collections import defaultdict

# (bucket, predicate on a frame), checked for each frame from the leaf up;
# the first frame that matches any rule decides. Order of rules matters only
# within one frame.
RULES = [
    ("raft log: fdatasync", lambda f: "SyncData" in f and "raftlog" not in f),
    ("raft log: write", lambda f: f.startswith("os.(*File).WriteAt") or f.startswith("os.(*File).Write") ),
    ("gRPC: socket write", lambda f: f.startswith("net.(*conn).Write") or f.startswith("syscall.write")),
    ("gRPC: socket read", lambda f: f.startswith("net.(*conn).Read") or f.startswith("syscall.read")),
    ("GC", lambda f: f.startswith("runtime.gcBgMarkWorker") or f.startswith("runtime.gcDrain") or f.startswith("runtime.markroot") or f.startswith("runtime.bgsweep") or f.startswith("runtime.bgscavenge")),
    ("malloc", lambda f: f.startswith("runtime.mallocgc") or f.startswith("runtime.newobject") or f.startswith("runtime.growslice") or f.startswith("runtime.makeslice")),
    ("futex / wakeups", lambda f: f.startswith("runtime.futex") or f.startswith("runtime.notewakeup") or f.startswith("runtime.wakep")),
    ("scheduler", lambda f: f.startswith("runtime.schedule") or f.startswith("runtime.findRunnable") or f.startswith("runtime.park_m") or f.startswith("runtime.mcall") or f.startswith("runtime.netpoll") or f.startswith("runtime.usleep") or f.startswith("runtime.stealWork")),
    ("protobuf", lambda f: f.startswith("google.golang.org/protobuf/") or f.startswith("go.etcd.io/raft/v3/raftpb.") or f.startswith("go.etcd.io/etcd/api/v3/etcdserverpb.(*") and ("Marshal" in f or "Unmarshal" in f or "Size" in f)),
    ("Pebble", lambda f: f.startswith("github.com/cockroachdb/pebble/")),
    ("mvcc", lambda f: f.startswith("github.com/strata-kv/strata/mvcc.")),
    ("apply", lambda f: f.startswith("github.com/strata-kv/strata/apply.")),
    ("raft (etcd-io/raft)", lambda f: f.startswith("go.etcd.io/raft/v3.")),
    ("raft log (other)", lambda f: f.startswith("github.com/strata-kv/strata/raftlog.")),
    ("node loop", lambda f: f.startswith("github.com/strata-kv/strata/node.")),
    ("gRPC (other)", lambda f: f.startswith("google.golang.org/grpc") or f.startswith("golang.org/x/net/http2")),
    ("server (etcd API)", lambda f: f.startswith("github.com/strata-kv/strata/server.")),
    ("watch/lease/member", lambda f: f.startswith("github.com/strata-kv/strata/")),
    # etcd's own packages, for its profiles
    ("etcd: WAL", lambda f: f.startswith("go.etcd.io/etcd/server/v3/storage/wal.")),
    ("etcd: bbolt", lambda f: f.startswith("go.etcd.io/bbolt.")),
    ("etcd: mvcc/backend", lambda f: f.startswith("go.etcd.io/etcd/server/v3/storage/")),
    ("etcd: etcdserver", lambda f: f.startswith("go.etcd.io/etcd/server/v3/")),
]

def bucket(stack):
    for f in stack:
        for name, pred in RULES:
            if pred(f):
                return name
    return "other runtime"

def ms(v):
    m = re.match(r"([\d.]+)(ms|s|us|µs)", v)
    x = float(m.group(1))
    return {"ms": x, "s": x * 1000, "us": x / 1000, "µs": x / 1000}[m.group(2)]

tot = defaultdict(float)
stack, val, header = [], None, []
for line in sys.stdin:
    line = line.rstrip("\n")
    if line.startswith("-----------+"):
        if val is not None:
            tot[bucket(stack)] += val
        stack, val = [], None
        continue
    if val is None:
        m = re.match(r"\s*([\d.]+(?:ms|s|us|µs))\s+(\S.*)$", line)
        if m:
            val = ms(m.group(1)); stack = [m.group(2).replace(" (inline)", "")]
        elif line and not line.startswith(" "):
            header.append(line)
        continue
    stack.append(line.strip().replace(" (inline)", ""))
if val is not None:
    tot[bucket(stack)] += val
s = sum(tot.values())
for h in header:
    if h.startswith("Duration"):
        print(h)
for k, v in sorted(tot.items(), key=lambda kv: -kv[1]):
    print(f"{k:28s} {v:8.0f} ms {100*v/s:5.1f}%")
