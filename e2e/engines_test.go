package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/datadir"
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

// TestKeySizeOnEveryEngine: a key, user or role name longer than the
// member's engine can hold (bbolt's 32 KiB keys, appendlog's and
// hybridlog's 64 KiB, less strata's key layout) is refused before it is
// proposed, with InvalidArgument and "etcdserver: key is too large" (or
// the name's message), by Put, by a txn's put and by user and role add;
// the refused writes take no revision and the member goes on serving.
// Pebble takes keys as etcd does, up to the request size (1.5 MiB).
func TestKeySizeOnEveryEngine(t *testing.T) {
	sizes := []int{1 << 10, 40 << 10, 70 << 10, 1 << 20}
	accepted := map[string][]bool{ // per size above
		engines.Pebble:    {true, true, true, true},
		engines.Bbolt:     {true, false, false, false},
		engines.AppendLog: {true, true, false, false},
		engines.HybridLog: {true, true, false, false},
	}
	for _, name := range engines.Names() {
		t.Run(name, func(t *testing.T) {
			p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Flags: []string{"--engine=" + name}})
			cli := p.Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			refused := func(what string, err error, msg string) {
				t.Helper()
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), msg) {
					t.Fatalf("%s on %s: %v; want InvalidArgument %q", what, name, err, msg)
				}
			}
			writes := 0
			for i, size := range sizes {
				key := strings.Repeat(string(rune('a'+i)), size)
				_, putErr := cli.Put(ctx, key, "v")
				_, txnErr := cli.Txn(ctx).Then(clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpPut(key+"t", "v")}, nil)).Commit()
				_, userErr := cli.UserAddWithOptions(ctx, key, "", &clientv3.UserAddOptions{NoPassword: true})
				_, roleErr := cli.RoleAdd(ctx, key)
				if accepted[name][i] {
					for what, err := range map[string]error{"put": putErr, "txn": txnErr, "user add": userErr, "role add": roleErr} {
						if err != nil {
							t.Fatalf("%s of %d bytes on %s: %v", what, size, name, err)
						}
					}
					writes += 2
					continue
				}
				refused(fmt.Sprintf("put of a %d-byte key", size), putErr, "etcdserver: key is too large")
				refused(fmt.Sprintf("txn put of a %d-byte key", size), txnErr, "etcdserver: key is too large")
				refused(fmt.Sprintf("user add of a %d-byte name", size), userErr, "etcdserver: user name is too large")
				refused(fmt.Sprintf("role add of a %d-byte name", size), roleErr, "etcdserver: role name is too large")
			}
			// The member still serves, and only the accepted puts took a revision.
			r, err := cli.Put(ctx, strings.Repeat("z", 1<<10), "after")
			if err != nil {
				t.Fatalf("put after the refusals: %v", err)
			}
			if want := int64(1 + writes + 1); r.Header.Revision != want {
				t.Fatalf("revision %d after the refusals, want %d (refused writes take none)", r.Header.Revision, want)
			}
			got, err := cli.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil || got.Count != int64(writes+1) {
				t.Fatalf("keys after the refusals: %v, %v; want %d", got, err, writes+1)
			}
		})
	}
}

// TestBackupEveryEngine: on each engine other than Pebble (Pebble's runs in
// every backup test), `strata backup create --endpoints` takes versions
// of a running member, their manifests name the engine, and `strata
// restore --from` rebuilds the state of a version onto the same engine
// (the default) and onto Pebble (--engine): the restored member answers
// the revision, keys and HashKV the live member answered.
func TestBackupEveryEngine(t *testing.T) {
	for _, name := range []string{engines.Bbolt, engines.AppendLog, engines.HybridLog} {
		t.Run(name, func(t *testing.T) {
			p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Flags: []string{"--engine=" + name}})
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			cli := p.Client(t)
			target := "file://" + filepath.Join(t.TempDir(), "target")
			run := func(args ...string) string {
				t.Helper()
				res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), args...)
				if res.Code != 0 {
					t.Fatalf("strata %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), res.Code, res.Stdout, res.Stderr)
				}
				return res.Stdout
			}
			for i := range 100 {
				if _, err := cli.Put(ctx, fmt.Sprintf("k%03d", i), strings.Repeat("v", 100)); err != nil {
					t.Fatal(err)
				}
			}
			run("backup", "create", "--endpoints="+p.Endpoint(), "--target="+target)
			if _, err := cli.Put(ctx, "k007", "changed"); err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Delete(ctx, "k050"); err != nil {
				t.Fatal(err)
			}
			want := readBackupState(t, ctx, cli, p.Endpoint())
			run("backup", "create", "--endpoints="+p.Endpoint(), "--target="+target)
			var list []backup.Manifest
			if err := json.Unmarshal([]byte(run("backup", "list", "--target="+target, "--json")), &list); err != nil {
				t.Fatal(err)
			}
			// The second is a log version (the member's log holds the two
			// entries since the first), which names no engine: it replays
			// on its base's.
			if len(list) != 2 || list[0].Engine != name || list[1].Revision != want.rev {
				t.Fatalf("backup list: %+v; want two versions, the first of engine %s, the second at revision %d", list, name, want.rev)
			}
			for _, onto := range []string{"", engines.Pebble} {
				r := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "r", Token: "restored",
					Flags: []string{"--engine=" + cmp.Or(onto, name)}})
				args := []string{"restore", "--from=" + target, "--data-dir=" + r.DataDir(), "--name=" + r.Name(),
					"--initial-cluster=" + r.Name() + "=" + r.PeerURL(), "--initial-advertise-peer-urls=" + r.PeerURL(), "--initial-cluster-token=restored"}
				if onto != "" {
					args = append(args, "--engine="+onto)
				}
				run(args...)
				id, ok, err := datadir.ReadID(vfs.Default, r.DataDir())
				if err != nil || !ok || id.EngineName() != cmp.Or(onto, name) {
					t.Fatalf("restored data dir's identity %+v (%v, found %v); want engine %s", id, err, ok, cmp.Or(onto, name))
				}
				// Launch, not Start: Start may empty the data dir to retry
				// on new ports.
				r.Launch()
				if err := r.WaitReady(30 * time.Second); err != nil {
					t.Fatal(err)
				}
				got := readBackupState(t, ctx, r.Client(t), r.Endpoint())
				if got.rev != want.rev || got.hash != want.hash || strings.Join(got.kvs, "\n") != strings.Join(want.kvs, "\n") {
					t.Errorf("version 2 restored onto %q: revision %d, HashKV %d, %d keys; the live member answered %d, %d, %d keys",
						cmp.Or(onto, name), got.rev, got.hash, len(got.kvs), want.rev, want.hash, len(want.kvs))
				}
				r.Stop()
			}
		})
	}
}
