package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/engine/engines"
	"github.com/strata-kv/strata/internal/testutil"
)

// TestEveryEngine runs the real binary on each engine (--engine) through
// what a client relies on: puts, a txn, a delete, a range at an older
// revision, a lease with a key, a compaction, a watch from a revision; then
// kill -9 and a restart, after which every acknowledged write is there with
// its revision, and the watch history above the compaction is served again.
func TestEveryEngine(t *testing.T) {
	for _, name := range engines.Names() {
		t.Run(name, func(t *testing.T) {
			p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Flags: []string{"--engine=" + name, "--snapshot-count=50"}})
			cli := p.Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var last *clientv3.PutResponse
			for i := range 200 {
				r, err := cli.Put(ctx, fmt.Sprintf("k%03d", i%60), fmt.Sprint(i))
				if err != nil {
					t.Fatal(err)
				}
				last = r
			}
			mid := last.Header.Revision
			if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("k000"), "=", "180")).
				Then(clientv3.OpPut("t", "then"), clientv3.OpDelete("k001")).Else(clientv3.OpPut("t", "else")).Commit(); err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Delete(ctx, "k01", clientv3.WithPrefix()); err != nil {
				t.Fatal(err)
			}
			lease, err := cli.Grant(ctx, 3600)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Put(ctx, "leased", "x", clientv3.WithLease(lease.ID)); err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Compact(ctx, mid-10, clientv3.WithCompactPhysical()); err != nil {
				t.Fatal(err)
			}
			before, err := cli.Get(ctx, "", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			old, err := cli.Get(ctx, "k0", clientv3.WithPrefix(), clientv3.WithRev(mid))
			if err != nil {
				t.Fatal(err)
			}

			p.Kill()
			p.Restart()
			cli = p.Client(t)
			after, err := cli.Get(ctx, "", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			if after.Header.Revision != before.Header.Revision || len(after.Kvs) != len(before.Kvs) {
				t.Fatalf("after kill -9: %d keys at revision %d, want %d at %d", len(after.Kvs), after.Header.Revision, len(before.Kvs), before.Header.Revision)
			}
			for i, kv := range after.Kvs {
				b := before.Kvs[i]
				if string(kv.Key) != string(b.Key) || string(kv.Value) != string(b.Value) || kv.ModRevision != b.ModRevision || kv.Version != b.Version || kv.Lease != b.Lease {
					t.Fatalf("after kill -9: key %d = %v, want %v", i, kv, b)
				}
			}
			again, err := cli.Get(ctx, "k0", clientv3.WithPrefix(), clientv3.WithRev(mid))
			if err != nil || len(again.Kvs) != len(old.Kvs) {
				t.Fatalf("range at revision %d after kill -9: %v, %v; want %d keys", mid, again, err, len(old.Kvs))
			}
			if ttl, err := cli.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys()); err != nil || len(ttl.Keys) != 1 {
				t.Fatalf("lease after kill -9: %v, %v", ttl, err)
			}
			wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
			defer wcancel()
			events := 0
			for w := range cli.Watch(wctx, "k0", clientv3.WithPrefix(), clientv3.WithRev(mid-5)) {
				if err := w.Err(); err != nil {
					t.Fatal(err)
				}
				events += len(w.Events)
				if events >= 5 {
					break
				}
			}
			if events < 5 {
				t.Fatalf("watch from revision %d after kill -9: %d events", mid-5, events)
			}
		})
	}
}
