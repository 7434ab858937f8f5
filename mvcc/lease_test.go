package mvcc

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	epebble "github.com/strata-kv/strata/engine/pebble"
)

func TestRevokeLease(t *testing.T) {
	e, err := epebble.Open("db", epebble.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	s, err := Open(e, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	index := uint64(0)
	commit := func(w *WriteBatch) {
		index++
		if err := w.Commit(index); err != nil {
			t.Fatal(err)
		}
	}
	w := s.Write(leaseFunc(func(id int64) bool { return id == 1 || id == 2 }))
	for _, r := range []LeaseRecord{{ID: 1, TTL: 10}, {ID: 2, TTL: 20, RemainingTTL: 7}} {
		if err := w.PutLease(r); err != nil {
			t.Fatal(err)
		}
	}
	puts := []struct {
		key   string
		lease int64
	}{{"a", 1}, {"b", 1}, {"c", 1}, {"c", 2}, {"d", 2}, {"e", 0}}
	for _, p := range puts {
		if _, err := w.Put(&pb.PutRequest{Key: []byte(p.key), Value: []byte("v"), Lease: p.lease}); err != nil {
			t.Fatal(err)
		}
	}
	commit(w)
	recs, err := s.Leases()
	if err != nil || len(recs) != 2 || recs[1] != (LeaseRecord{ID: 2, TTL: 20, RemainingTTL: 7}) {
		t.Fatalf("Leases() = %v, %v", recs, err)
	}
	rev := s.Rev()

	w = s.Write(leaseFunc(func(id int64) bool { return id == 1 || id == 2 }))
	got, deleted, err := w.RevokeLease(1)
	if err != nil {
		t.Fatal(err)
	}
	commit(w)
	// c moved to lease 2: only a and b go, in one revision.
	if got != rev+1 || deleted != 2 || s.Rev() != rev+1 {
		t.Fatalf("revoke: rev %d deleted %d store rev %d; want rev %d deleted 2", got, deleted, s.Rev(), rev+1)
	}
	resp, err := s.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range resp.Kvs {
		keys = append(keys, string(kv.Key))
	}
	if len(keys) != 3 || keys[0] != "c" || keys[1] != "d" || keys[2] != "e" {
		t.Fatalf("keys after revoke %q, want [c d e]", keys)
	}
	if recs, _ := s.Leases(); len(recs) != 1 || recs[0].ID != 2 {
		t.Fatalf("lease records after revoke: %v", recs)
	}

	// A lease with no keys takes no revision.
	w = s.Write(leaseFunc(func(id int64) bool { return id == 1 || id == 2 }))
	if err := w.PutLease(LeaseRecord{ID: 3, TTL: 5}); err != nil {
		t.Fatal(err)
	}
	if got, deleted, err = w.RevokeLease(3); err != nil || deleted != 0 || got != rev+1 {
		t.Fatalf("revoke of an empty lease: rev %d deleted %d err %v", got, deleted, err)
	}
	commit(w)
	if s.Rev() != rev+1 {
		t.Fatalf("empty revoke moved the revision to %d", s.Rev())
	}
}

func FuzzDecodeLeaseRecord(f *testing.F) {
	r := LeaseRecord{ID: 5, TTL: 60, RemainingTTL: 12}
	f.Add(leaseRecordKey(r.ID), r.encode())
	f.Add([]byte("mg"), []byte{1, 2})
	f.Fuzz(func(t *testing.T, k, v []byte) {
		rec, err := decodeLeaseRecord(k, v)
		if err != nil {
			return
		}
		if string(leaseRecordKey(rec.ID)[len(prefixLeaseRecord):]) != string(k[len(prefixLeaseRecord):]) ||
			string(rec.encode()) != string(v) {
			t.Fatalf("record %v does not round-trip", rec)
		}
	})
}
