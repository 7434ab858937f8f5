package etcddb

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/mvcc"
)

func sampleContents() Contents {
	return Contents{
		ConsistentIndex: 42, Term: 3,
		ConfState: &raftpb.ConfState{Voters: []uint64{1, 2}, Learners: []uint64{3}, AutoLeave: proto.Bool(false)},
		Revisions: mvcc.RevisionState{Rev: 9, CompactRev: 4},
		Leases:    []mvcc.LeaseRecord{{ID: 7, TTL: 60, RemainingTTL: 30}, {ID: 8, TTL: 3600}},
		Auth: auth.State{Enabled: true, Revision: 5,
			Users: []*authpb.User{{Name: []byte("alice"), Password: []byte("hash"), Roles: []string{"r"}}},
			Roles: []*authpb.Role{{Name: []byte("r"), KeyPermission: []*authpb.Permission{{PermType: authpb.Permission_READ, Key: []byte("a"), RangeEnd: []byte("b")}}}}},
		Members: []*pb.Member{{ID: 0xabc, Name: "m1", PeerURLs: []string{"http://p1"}, ClientURLs: []string{"http://c1"}},
			{ID: 0xdef, PeerURLs: []string{"http://p2"}, IsLearner: true}},
		Removed: []uint64{0x5, 0x1234abcd},
		Alarms:  []*pb.AlarmMember{{MemberID: 0xabc, Alarm: pb.AlarmType_NOSPACE}},
	}
}

func sampleVersions() []mvcc.KeyChange {
	return []mvcc.KeyChange{
		{Main: 2, Sub: 0, Key: []byte("a"), KV: &mvccpb.KeyValue{Key: []byte("a"), Value: []byte("1"), CreateRevision: 2, ModRevision: 2, Version: 1}},
		{Main: 5, Sub: 0, Key: []byte("b"), KV: &mvccpb.KeyValue{Key: []byte("b"), Value: []byte("2"), CreateRevision: 5, ModRevision: 5, Version: 1, Lease: 7}},
		{Main: 5, Sub: 1, Key: []byte("c"), KV: &mvccpb.KeyValue{Key: []byte("c"), Value: []byte("3"), CreateRevision: 5, ModRevision: 5, Version: 1}},
		{Main: 9, Sub: 0, Key: []byte("c")}, // a deletion
	}
}

// writeFile writes a snapshot of c and vs to a file and returns its path.
func writeFile(t *testing.T, c Contents, vs []mvcc.KeyChange) string {
	t.Helper()
	var buf bytes.Buffer
	n, err := Write(&buf, t.TempDir(), c, func(fn func(mvcc.KeyChange) error) error {
		for _, v := range vs {
			if err := fn(v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) || n%512 != sha256.Size {
		t.Fatalf("wrote %d bytes (buffer %d): want the size modulo 512 to be 32", n, buf.Len())
	}
	path := filepath.Join(t.TempDir(), "snap.db")
	if err := os.WriteFile(path, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestRoundTrip(t *testing.T) {
	want, vs := sampleContents(), sampleVersions()
	path := writeFile(t, want, vs)
	var got []mvcc.KeyChange
	c, err := Read(path, func(v mvcc.KeyChange) error { got = append(got, v); return nil })
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(vs) {
		t.Fatalf("read %d versions, wrote %d", len(got), len(vs))
	}
	for i := range vs {
		if got[i].Main != vs[i].Main || got[i].Sub != vs[i].Sub || !bytes.Equal(got[i].Key, vs[i].Key) ||
			(got[i].KV == nil) != (vs[i].KV == nil) || (vs[i].KV != nil && !proto.Equal(got[i].KV, vs[i].KV)) {
			t.Errorf("version %d = %+v, wrote %+v", i, got[i], vs[i])
		}
	}
	if c.ConsistentIndex != want.ConsistentIndex || c.Term != want.Term || !proto.Equal(c.ConfState, want.ConfState) {
		t.Errorf("raft state %d/%d %v, wrote %d/%d %v", c.ConsistentIndex, c.Term, c.ConfState, want.ConsistentIndex, want.Term, want.ConfState)
	}
	if c.Revisions != want.Revisions {
		t.Errorf("revisions %+v, wrote %+v", c.Revisions, want.Revisions)
	}
	if len(c.Leases) != 2 || c.Leases[0] != want.Leases[0] || c.Leases[1] != want.Leases[1] {
		t.Errorf("leases %+v, wrote %+v", c.Leases, want.Leases)
	}
	if c.Auth.Enabled != want.Auth.Enabled || c.Auth.Revision != want.Auth.Revision || len(c.Auth.Users) != 1 || len(c.Auth.Roles) != 1 ||
		!proto.Equal(c.Auth.Users[0], want.Auth.Users[0]) || !proto.Equal(c.Auth.Roles[0], want.Auth.Roles[0]) {
		t.Errorf("auth %+v, wrote %+v", c.Auth, want.Auth)
	}
	if len(c.Members) != 2 || !proto.Equal(c.Members[0], want.Members[0]) || !proto.Equal(c.Members[1], want.Members[1]) {
		t.Errorf("members %v, wrote %v", c.Members, want.Members)
	}
	if !slices.Equal(c.Removed, want.Removed) {
		t.Errorf("removed members %x, wrote %x", c.Removed, want.Removed)
	}
	if len(c.Alarms) != 1 || !proto.Equal(c.Alarms[0], want.Alarms[0]) {
		t.Errorf("alarms %v, wrote %v", c.Alarms, want.Alarms)
	}
}

// TestRevisionAfterCompactedDeletion: when the compaction removed the
// newest version (a deletion), the current revision is the compact
// revision, as etcd computes it.
func TestRevisionAfterCompactedDeletion(t *testing.T) {
	c := sampleContents()
	c.Revisions = mvcc.RevisionState{Rev: 9, CompactRev: 9}
	got, err := Read(writeFile(t, c, sampleVersions()[:2]), func(mvcc.KeyChange) error { return nil })
	if err != nil || got.Revisions.Rev != 9 {
		t.Fatalf("revisions %+v, %v; want current revision 9", got.Revisions, err)
	}
}

func TestReadRefuses(t *testing.T) {
	good := writeFile(t, sampleContents(), sampleVersions())
	raw, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := func(name string, body []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, body, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	damaged := bytes.Clone(raw)
	damaged[100] ^= 1
	foreign := filepath.Join(dir, "foreign.db")
	newer := filepath.Join(dir, "newer.db")
	for path, buckets := range map[string]map[string][2]string{
		foreign: {"widgets": {"w", "1"}},
		newer:   {"key": {}, "meta": {"storageVersion", "3.9.0"}},
	} {
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Update(func(tx *bolt.Tx) error {
			for name, kv := range buckets {
				b, err := tx.CreateBucket([]byte(name))
				if err != nil {
					return err
				}
				if kv[0] != "" {
					if err := b.Put([]byte(kv[0]), []byte(kv[1])); err != nil {
						return err
					}
				}
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		db.Close()
	}
	tests := []struct {
		name, path, says string
		is               error
	}{
		{name: "digest mismatch", path: file("damaged.db", damaged), is: ErrChecksum},
		{name: "truncated", path: file("truncated.db", raw[:8192]), says: "truncated"},
		{name: "not bbolt", path: file("text.db", []byte(strings.Repeat("not a database\n", 100))), says: "not a bbolt database"},
		{name: "another program's bbolt", path: foreign, says: "not etcd's"},
		{name: "newer schema", path: newer, says: "storage version 3.9.0 is newer than 3.7.0"},
		{name: "missing", path: filepath.Join(dir, "none.db"), says: "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called := false
			_, err := Read(tt.path, func(mvcc.KeyChange) error { called = true; return nil })
			if err == nil || (tt.is != nil && !errors.Is(err, tt.is)) || (tt.says != "" && !strings.Contains(err.Error(), tt.says)) {
				t.Fatalf("Read: %v; want an error (%v) saying %q", err, tt.is, tt.says)
			}
			if called && tt.is != nil {
				t.Fatal("versions passed on from a file whose digest does not match")
			}
		})
	}
}

// FuzzDecodeLease: a lease record read from an etcd file decodes or fails,
// never panics, and what encodes decodes back.
func FuzzDecodeLease(f *testing.F) {
	f.Add(encodeLease(mvcc.LeaseRecord{ID: 7, TTL: 60, RemainingTTL: 30}))
	f.Add([]byte{0x08})
	f.Add([]byte{0x12, 0x05, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := decodeLease(b)
		if err != nil {
			return
		}
		again, err := decodeLease(encodeLease(l))
		if err != nil || again != l {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", l, again, err)
		}
	})
}

// TestWriteSendsOnlyPages: the snapshot is the database's pages and their
// digest, as etcd's is, even once bbolt has grown the file ahead of its
// pages (it grows it by 16 MiB at a time past 16 MiB of data).
func TestWriteSendsOnlyPages(t *testing.T) {
	value := bytes.Repeat([]byte("v"), 1024)
	var vs []mvcc.KeyChange
	for i := range 24000 {
		key := []byte(fmt.Sprintf("key%06d", i))
		vs = append(vs, mvcc.KeyChange{Main: int64(i + 2), Key: key,
			KV: &mvccpb.KeyValue{Key: key, Value: value, CreateRevision: int64(i + 2), ModRevision: int64(i + 2), Version: 1}})
	}
	path := writeFile(t, sampleContents(), vs)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var pages int64
	if err := db.View(func(tx *bolt.Tx) error { pages = tx.Size(); return nil }); err != nil {
		t.Fatal(err)
	}
	if st.Size() != pages+sha256.Size {
		t.Errorf("snapshot of %d bytes; its database's pages are %d bytes, so want %d", st.Size(), pages, pages+sha256.Size)
	}
	n := 0
	if _, err := Read(path, func(mvcc.KeyChange) error { n++; return nil }); err != nil || n != len(vs) {
		t.Errorf("read back %d versions, %v; want %d", n, err, len(vs))
	}
}

// TestWriteStopsOnError: an error from the versions' reader ends Write
// with that error and no snapshot.
func TestWriteStopsOnError(t *testing.T) {
	boom := errors.New("boom")
	var buf bytes.Buffer
	_, err := Write(&buf, t.TempDir(), sampleContents(), func(fn func(mvcc.KeyChange) error) error {
		for i := range 30000 {
			if i == 25000 {
				return boom
			}
			key := []byte(fmt.Sprintf("k%d", i))
			if err := fn(mvcc.KeyChange{Main: int64(i + 2), Key: key, KV: &mvccpb.KeyValue{Key: key, ModRevision: int64(i + 2)}}); err != nil {
				return err
			}
		}
		return nil
	})
	if !errors.Is(err, boom) || buf.Len() != 0 {
		t.Fatalf("Write = %v with %d bytes written; want %v and nothing", err, buf.Len(), boom)
	}
}
