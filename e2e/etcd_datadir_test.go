package e2e

import (
	"bytes"
	"context"
	endian "encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/internal/testutil"
)

// Migration from a killed etcd member's data directory: etcd commits its
// bbolt database in batches, so the writes it acknowledged last are only
// in its WAL; strata restore reads the database and replays the WAL's tail,
// and strata then answers every acknowledged write with etcd's revisions.

// walMarker is a value written into etcd's WAL tail, found in the WAL
// files to damage them at a known record.
const walMarker = "WAL-TAIL-MARKER-0123456789"

// tailWrite is one write etcd acknowledged after its database's last
// commit, and the revision it answered.
type tailWrite struct {
	key string
	rev int64
	del bool
}

func TestMigrateEtcdDataDir(t *testing.T) {
	// A batch interval and limit no test reaches: etcd commits its
	// database only when something forces it (start-up, auth changes,
	// compaction), so the writes after the last of those are in the WAL
	// alone. A snapshot count no test reaches keeps the WAL whole.
	src := testutil.StartProcess(t, testutil.Options{Binary: binary(t, etcd), Name: "src",
		Flags: []string{"--snapshot-count=1000000", "--backend-batch-interval=1h", "--backend-batch-limit=1000000"}})
	cli := src.Client(t)
	// Keys, leases, a compaction, users and roles (the auth changes and
	// the compaction force database commits)...
	h := fillHistory(t, cli)
	// Users and roles are read through raft in etcd, which commits its
	// database: read them first.
	var authObs observation
	observeAuth(t, cli, &authObs)
	// Deletions force a database commit (etcd commits a batch that
	// deletes at once, so that reads do not see stale data): they come
	// before the writes that only the WAL holds.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var acked []tailWrite
	del, err := cli.Delete(ctx, "k05")
	if err != nil || del.Deleted != 1 {
		t.Fatalf("delete: %v, %v", del, err)
	}
	acked = append(acked, tailWrite{key: "k05", rev: del.Header.Revision, del: true})
	txn, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("k04"), "!=", "")).
		Then(clientv3.OpPut("txn-put", "yes"), clientv3.OpDelete("k06")).Commit()
	if err != nil || !txn.Succeeded {
		t.Fatalf("txn: %v, %v", txn, err)
	}
	acked = append(acked, tailWrite{key: "txn-put", rev: txn.Header.Revision}, tailWrite{key: "k06", rev: txn.Header.Revision, del: true})
	// Then the writes that only the WAL holds: a lease, keys (some
	// attached to the lease), a txn.
	walOnly := 0
	tailLease, err := cli.Grant(ctx, 900)
	if err != nil {
		t.Fatal(err)
	}
	walOnly++
	h.leases = append(h.leases, tailLease.ID)
	for i := range 30 {
		key, val := fmt.Sprintf("tail%02d", i%20), fmt.Sprintf("w%d", i)
		var opts []clientv3.OpOption
		if i == 3 {
			val = walMarker
		}
		if i%5 == 0 {
			opts = append(opts, clientv3.WithLease(tailLease.ID))
		}
		put, err := cli.Put(ctx, key, val, opts...)
		if err != nil {
			t.Fatal(err)
		}
		acked = append(acked, tailWrite{key: key, rev: put.Header.Revision})
		walOnly++
	}
	txn, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("tail01"), "=", "w21")).
		Then(clientv3.OpPut("tail-txn", "yes"), clientv3.OpPut("tail02", "by txn")).Commit()
	if err != nil || !txn.Succeeded {
		t.Fatalf("txn: %v, %v", txn, err)
	}
	acked = append(acked, tailWrite{key: "tail-txn", rev: txn.Header.Revision}, tailWrite{key: "tail02", rev: txn.Header.Revision})
	walOnly++
	before := observeKV(t, cli, h)
	before.users, before.roles, before.perms = authObs.users, authObs.roles, authObs.perms
	src.Kill() // kill -9: the database's batch is never committed

	dir := t.TempDir()
	etcdDir := src.DataDir()
	dst := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "dst", DataDir: filepath.Join(dir, "dst.strata")})
	restore := func(from string) testutil.Result {
		return testutil.RunToExit(t, 120*time.Second, "", nil, binary(t, strata), "restore",
			"--data-dir="+dst.DataDir(), "--name="+dst.Name(), "--initial-cluster="+dst.Name()+"="+dst.PeerURL(),
			"--initial-advertise-peer-urls="+dst.PeerURL(), "--initial-cluster-token=e2e-"+dst.Name(), from)
	}

	// Bad input first, each on a copy of the data directory: each is
	// refused, saying why, and leaves no data directory.
	for _, c := range []struct {
		name, says string
		damage     func(t *testing.T, d string)
	}{
		{name: "WAL missing", says: "wal: file not found", damage: func(t *testing.T, d string) {
			if err := os.RemoveAll(filepath.Join(d, "member", "wal")); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "corrupt WAL record", says: "wal: crc mismatch", damage: func(t *testing.T, d string) {
			path, at := findInWAL(t, d, walMarker)
			editFile(t, path, func(b []byte) []byte { b[at+4] ^= 0x01; return b })
		}},
		{name: "truncated WAL", says: "unexpected EOF", damage: func(t *testing.T, d string) {
			path, at := findInWAL(t, d, walMarker)
			editFile(t, path, func(b []byte) []byte { return b[:at+4] })
		}},
		{name: "another program's file as the WAL", says: "not an etcd WAL file", damage: func(t *testing.T, d string) {
			path, _ := findInWAL(t, d, walMarker)
			editFile(t, path, func([]byte) []byte { return []byte("# not a WAL: some program's configuration\nkey = value\n") })
		}},
		{name: "WAL older than the database", says: "does not reach the database's consistent index", damage: func(t *testing.T, d string) {
			editMeta(t, d, "consistent_index", endian.BigEndian.AppendUint64(nil, 1<<40))
		}},
		{name: "newer schema", says: "newer than 3.7.0", damage: func(t *testing.T, d string) {
			editMeta(t, d, "storageVersion", []byte("3.9.0"))
		}},
		{name: "a directory that is not etcd's", says: "not an etcd data directory", damage: func(t *testing.T, d string) {
			if err := os.RemoveAll(filepath.Join(d, "member")); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := filepath.Join(t.TempDir(), "etcd")
			copyDir(t, etcdDir, bad)
			c.damage(t, bad)
			res := restore(bad)
			if res.Code == 0 || !strings.Contains(res.Stderr, c.says) {
				t.Errorf("restore: exit %d, stderr %q; want a refusal saying %q", res.Code, res.Stderr, c.says)
			}
			if _, err := os.Stat(dst.DataDir()); err == nil {
				t.Fatalf("a refused restore left a data directory")
			}
			if _, err := os.Stat(dst.DataDir() + ".restoring"); err == nil {
				t.Fatalf("a refused restore left its temporary directory")
			}
		})
	}

	res := restore(etcdDir)
	if res.Code != 0 {
		t.Fatalf("strata restore: exit %d\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	m := regexp.MustCompile(`replayed (\d+) entries of etcd's WAL`).FindStringSubmatch(res.Stdout)
	if m == nil {
		t.Fatalf("strata restore did not report the WAL replay:\n%s", res.Stdout)
	}
	if n, _ := strconv.Atoi(m[1]); n < walOnly {
		t.Errorf("replayed %d entries of the WAL; the writes after the last deletion alone are %d:\n%s", n, walOnly, res.Stdout)
	}
	t.Logf("strata restore: %s", res.Stdout)

	dst.Start()
	dcli := dst.Client(t)
	sameObservation(t, before, observe(t, dcli, h))
	// Every acknowledged write, at the revision etcd answered:
	// a key's last write is its current version, and every write is in
	// its history.
	last := map[string]tailWrite{}
	for _, w := range acked {
		last[w.key] = w
	}
	for _, w := range acked {
		if w.del {
			continue
		}
		got, err := dcli.Get(ctx, w.key, clientv3.WithRev(w.rev))
		if err != nil || len(got.Kvs) != 1 || got.Kvs[0].ModRevision != w.rev {
			t.Errorf("%s at revision %d: %v, %v; want the write etcd acknowledged at %d", w.key, w.rev, got, err, w.rev)
		}
	}
	for key, w := range last {
		got, err := dcli.Get(ctx, key)
		switch {
		case err != nil:
			t.Errorf("get %s: %v", key, err)
		case w.del && len(got.Kvs) != 0:
			t.Errorf("%s deleted at revision %d is back: %v", key, w.rev, got.Kvs)
		case !w.del && (len(got.Kvs) != 1 || got.Kvs[0].ModRevision != w.rev):
			t.Errorf("%s: %v; want modified at revision %d", key, got.Kvs, w.rev)
		}
	}
	if put, err := dcli.Put(ctx, "after", "migration"); err != nil || put.Header.Revision != before.rev+1 {
		t.Errorf("put after the migration: %v, %v; want revision %d", put, err, before.rev+1)
	}
}

// findInWAL returns the WAL file of data dir d that holds s, and where.
func findInWAL(t *testing.T, d, s string) (string, int) {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(d, "member", "wal", "*.wal"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		raw, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if at := bytes.Index(raw, []byte(s)); at >= 0 {
			return name, at
		}
	}
	t.Fatalf("%q is in none of the WAL files %v", s, names)
	return "", 0
}

func editFile(t *testing.T, path string, edit func([]byte) []byte) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, edit(raw), 0o600); err != nil {
		t.Fatal(err)
	}
}

// editMeta sets key in the meta bucket of data dir d's database.
func editMeta(t *testing.T, d, key string, value []byte) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(d, "member", "snap", "db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put([]byte(key), value)
	}); err != nil {
		t.Fatal(err)
	}
}

// copyDir copies the regular files under src into dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if info.IsDir() {
			return os.MkdirAll(target, 0o700)
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
}
