package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/internal/testutil"
)

// Snapshots in etcd's format, both ways: a strata member's `etcdctl snapshot
// save` is read by etcdutl and restored into a real etcd, and a real etcd's
// snapshot is restored into strata; each side then answers the same reads
// the other answered before the snapshot.

// snapHistory is what fillHistory wrote that the reads check.
type snapHistory struct {
	compactRev int64
	leases     []clientv3.LeaseID
}

// fillHistory writes a history with every kind of state a snapshot carries:
// keys with several versions, deletions, keys attached to leases, a
// physical compaction, users and roles (auth left off, so that clients need
// no credentials).
func fillHistory(t *testing.T, cli *clientv3.Client) snapHistory {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var h snapHistory
	for _, ttl := range []int64{600, 3600} {
		l, err := cli.Grant(ctx, ttl)
		if err != nil {
			t.Fatal(err)
		}
		h.leases = append(h.leases, l.ID)
	}
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range 60 {
		opts := []clientv3.OpOption{}
		if i%7 == 0 {
			opts = append(opts, clientv3.WithLease(h.leases[i%2]))
		}
		must(cli.Put(ctx, fmt.Sprintf("k%02d", i%25), fmt.Sprintf("v%d", i), opts...))
	}
	must(cli.Put(ctx, "big", strings.Repeat("x", 64<<10)))
	must(cli.Delete(ctx, "k1", clientv3.WithPrefix()))
	mid, err := cli.Get(ctx, "k00")
	if err != nil {
		t.Fatal(err)
	}
	h.compactRev = mid.Header.Revision - 20
	must(cli.Compact(ctx, h.compactRev, clientv3.WithCompactPhysical()))
	must(cli.Put(ctx, "k05", "after compaction"))
	must(cli.Delete(ctx, "k06"))
	must(cli.Txn(ctx).Then(clientv3.OpPut("t1", "a"), clientv3.OpPut("t2", "b"), clientv3.OpDelete("k07")).Commit())
	must(cli.UserAdd(ctx, "alice", "secret"))
	must(cli.RoleAdd(ctx, "readers"))
	must(cli.RoleGrantPermission(ctx, "readers", "k", "l", clientv3.PermissionType(clientv3.PermRead)))
	must(cli.UserGrantRole(ctx, "alice", "readers"))
	return h
}

// observation is what a member answers about the history.
type observation struct {
	rev     int64
	current []*mvccpb.KeyValue
	// atHistory is the key space at the revision after the compaction.
	atHistory []*mvccpb.KeyValue
	// compactedErr is the error of a read below the compaction.
	compactedErr string
	leases       []string
	users, roles []string
	perms        string
}

func observe(t *testing.T, cli *clientv3.Client, h snapHistory) observation {
	t.Helper()
	o := observeKV(t, cli, h)
	observeAuth(t, cli, &o)
	return o
}

// observeKV is observe without users and roles, whose reads etcd makes
// through raft (and they commit its database).
func observeKV(t *testing.T, cli *clientv3.Client, h snapHistory) observation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var o observation
	cur, err := cli.Get(ctx, "", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	o.rev, o.current = cur.Header.Revision, cur.Kvs
	old, err := cli.Get(ctx, "", clientv3.WithPrefix(), clientv3.WithRev(h.compactRev+1))
	if err != nil {
		t.Fatal(err)
	}
	o.atHistory = old.Kvs
	if _, err := cli.Get(ctx, "k00", clientv3.WithRev(h.compactRev-1)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("read below the compaction: %v, want %v", err, rpctypes.ErrCompacted)
	} else {
		o.compactedErr = err.Error()
	}
	for _, id := range h.leases {
		ttl, err := cli.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatal(err)
		}
		if ttl.TTL <= 0 || ttl.TTL > ttl.GrantedTTL {
			t.Fatalf("lease %x: remaining TTL %d of %d", id, ttl.TTL, ttl.GrantedTTL)
		}
		var keys []string
		for _, k := range ttl.Keys {
			keys = append(keys, string(k))
		}
		slices.Sort(keys)
		o.leases = append(o.leases, fmt.Sprintf("%x granted %d keys %v", id, ttl.GrantedTTL, keys))
	}
	return o
}

// observeAuth adds the users and roles to o.
func observeAuth(t *testing.T, cli *clientv3.Client, o *observation) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	users, err := cli.UserList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	roles, err := cli.RoleList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o.users, o.roles = users.Users, roles.Roles
	alice, err := cli.UserGet(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	readers, err := cli.RoleGet(ctx, "readers")
	if err != nil {
		t.Fatal(err)
	}
	o.perms = fmt.Sprintf("alice roles %v; readers perms %v", alice.Roles, readers.Perm)
}

// sameObservation fails the test where after differs from before.
func sameObservation(t *testing.T, before, after observation) {
	t.Helper()
	if after.rev != before.rev {
		t.Errorf("revision %d, want %d", after.rev, before.rev)
	}
	sameKVs := func(what string, got, want []*mvccpb.KeyValue) {
		t.Helper()
		if len(got) != len(want) {
			t.Errorf("%s: %d keys, want %d", what, len(got), len(want))
			return
		}
		for i := range want {
			g, w := got[i], want[i]
			if !bytes.Equal(g.Key, w.Key) || !bytes.Equal(g.Value, w.Value) || g.CreateRevision != w.CreateRevision ||
				g.ModRevision != w.ModRevision || g.Version != w.Version || g.Lease != w.Lease {
				t.Errorf("%s: key %d = %q create %d mod %d version %d lease %x; want %q create %d mod %d version %d lease %x",
					what, i, g.Key, g.CreateRevision, g.ModRevision, g.Version, g.Lease, w.Key, w.CreateRevision, w.ModRevision, w.Version, w.Lease)
			}
		}
	}
	sameKVs("current keys", after.current, before.current)
	sameKVs("keys after the compaction", after.atHistory, before.atHistory)
	if after.compactedErr != before.compactedErr {
		t.Errorf("read below the compaction: %q, want %q", after.compactedErr, before.compactedErr)
	}
	for _, pair := range [][2]any{{after.leases, before.leases}, {after.users, before.users}, {after.roles, before.roles}, {after.perms, before.perms}} {
		if g, w := fmt.Sprint(pair[0]), fmt.Sprint(pair[1]); g != w {
			t.Errorf("got %s, want %s", g, w)
		}
	}
}

// snapshotStatus is etcdutl snapshot status -w json's answer.
type snapshotStatus struct {
	Hash      uint32 `json:"hash"`
	Revision  int64  `json:"revision"`
	TotalKey  int    `json:"totalKey"`
	TotalSize int64  `json:"totalSize"`
	Version   string `json:"version"`
}

func TestSnapshotToEtcd(t *testing.T) {
	src := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src"})
	cli := src.Client(t)
	h := fillHistory(t, cli)
	before := observe(t, cli, h)

	dir := t.TempDir()
	file := filepath.Join(dir, "strata.db")
	mustCtlOn(t, []string{src.Endpoint()}, "snapshot", "save", file)

	res := testutil.RunToExit(t, 30*time.Second, "", nil, bins.Etcdutl, "snapshot", "status", file, "-w", "json")
	if res.Code != 0 {
		t.Fatalf("etcdutl snapshot status: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	var st snapshotStatus
	if err := json.Unmarshal([]byte(res.Stdout), &st); err != nil {
		t.Fatalf("etcdutl snapshot status printed %q: %v", res.Stdout, err)
	}
	if st.Revision != before.rev || st.TotalKey != len(before.current) || st.Version != "3.7.0" {
		t.Errorf("etcdutl snapshot status: %+v; want revision %d, %d keys, version 3.7.0", st, before.rev, len(before.current))
	}

	dst := testutil.NewProcess(t, testutil.Options{Binary: binary(t, etcd), Name: "dst", DataDir: filepath.Join(dir, "dst.etcd")})
	res = testutil.RunToExit(t, 60*time.Second, "", nil, bins.Etcdutl, "snapshot", "restore", file,
		"--data-dir", dst.DataDir(), "--name", dst.Name(), "--initial-cluster", dst.Name()+"="+dst.PeerURL(),
		"--initial-advertise-peer-urls", dst.PeerURL(), "--initial-cluster-token", "e2e-"+dst.Name())
	if res.Code != 0 {
		t.Fatalf("etcdutl snapshot restore: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	dst.Start()
	sameObservation(t, before, observe(t, dst.Client(t), h))
}

func TestSnapshotFromEtcd(t *testing.T) {
	src := testutil.StartProcess(t, testutil.Options{Binary: binary(t, etcd), Name: "src"})
	cli := src.Client(t)
	h := fillHistory(t, cli)
	before := observe(t, cli, h)

	dir := t.TempDir()
	file := filepath.Join(dir, "etcd.db")
	mustCtlOn(t, []string{src.Endpoint()}, "snapshot", "save", file)

	dst := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "dst", DataDir: filepath.Join(dir, "dst.strata")})
	restore := func(backup string) testutil.Result {
		return testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore",
			"--data-dir="+dst.DataDir(), "--name="+dst.Name(), "--initial-cluster="+dst.Name()+"="+dst.PeerURL(),
			"--initial-advertise-peer-urls="+dst.PeerURL(), "--initial-cluster-token=e2e-"+dst.Name(), backup)
	}

	// Bad input first: each is refused and leaves no data directory.
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	damaged := bytes.Clone(raw)
	damaged[len(damaged)/2] ^= 0x01
	foreign := filepath.Join(dir, "foreign.db")
	db, err := bolt.Open(foreign, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("widgets")); return err }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	for _, c := range []struct {
		name, file, says string
		body             []byte
	}{
		{name: "damaged", body: damaged, says: "sha256 mismatch"},
		{name: "truncated", body: raw[:len(raw)/3], says: "truncated"},
		{name: "text", body: []byte("hello, world\n"), says: "not a bbolt database"},
		{name: "bbolt of another program", file: foreign, says: "not etcd's"},
	} {
		path := c.file
		if path == "" {
			path = filepath.Join(dir, c.name+".db")
			if err := os.WriteFile(path, c.body, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if res := restore(path); res.Code == 0 || !strings.Contains(res.Stderr, c.says) {
			t.Errorf("restore of a %s file: exit %d, stderr %q; want a refusal saying %q", c.name, res.Code, res.Stderr, c.says)
		}
		if _, err := os.Stat(dst.DataDir()); err == nil {
			t.Fatalf("restore of a %s file left a data directory", c.name)
		}
	}

	if res := restore(file); res.Code != 0 {
		t.Fatalf("strata restore: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	dst.Start()
	dcli := dst.Client(t)
	sameObservation(t, before, observe(t, dcli, h))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if put, err := dcli.Put(ctx, "after", "restore"); err != nil || put.Header.Revision != before.rev+1 {
		t.Errorf("put after restore: %v, %v; want revision %d", put, err, before.rev+1)
	}
}
