package mvcc

import (
	"bytes"
	"errors"
	"testing"

	bolt "go.etcd.io/bbolt"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	ebbolt "github.com/strata-kv/strata/engine/bbolt"
)

// FuzzHistoryKey: escaped keys round-trip, and history entries of different
// keys sort as the raw keys do, whatever their revisions.
func FuzzHistoryKey(f *testing.F) {
	f.Add([]byte("a"), []byte("a\x00"), int64(2), int64(9))
	f.Add([]byte("\x00\xff"), []byte("\x00"), int64(5), int64(1))
	f.Add([]byte(""), []byte("\x01"), int64(1), int64(1))
	f.Fuzz(func(t *testing.T, a, b []byte, ra, rb int64) {
		ka := historyKey(a, ra, 3)
		key, main, sub, err := parseHistoryKey(ka)
		if err != nil || !bytes.Equal(key, a) || main != ra || sub != 3 {
			t.Fatalf("round trip of %q@%d: %q %d %d %v", a, ra, key, main, sub, err)
		}
		if c := bytes.Compare(a, b); c != 0 {
			if got := bytes.Compare(ka, historyKey(b, rb, 0)); got != c {
				t.Fatalf("order of %q and %q: history keys compare %d, raw %d", a, b, got, c)
			}
			// Every entry of a lies inside a's bounds, none of b's does.
			if bytes.Compare(ka, historyPrefix(a)) < 0 || bytes.Compare(ka, historyKeyEnd(a)) >= 0 {
				t.Fatalf("history key of %q outside its bounds", a)
			}
			kb := historyKey(b, rb, 0)
			if bytes.Compare(kb, historyPrefix(a)) >= 0 && bytes.Compare(kb, historyKeyEnd(a)) < 0 {
				t.Fatalf("history key of %q inside the bounds of %q", b, a)
			}
		}
		if ra >= 0 && rb >= ra && bytes.Compare(historySeek(a, rb), ka) > 0 {
			t.Fatalf("seek to %d passes the version at %d", rb, ra)
		}
	})
}

// FuzzDecode: no decoder of stored bytes panics on arbitrary input.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("mhab\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01"))
	f.Add(state{rev: 5, compactRev: -1}.encode())
	f.Add(compactJob{target: 4, doneMain: 2, doneSub: 1}.encode())
	f.Add([]byte{1, 'k'})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _, _ = parseHistoryKey(b)
		_, _, _ = unescape(b)
		_, _, _ = parseRevKey(b)
		_, _, _ = parseRevValue(b)
		if st, err := decodeState(b); err == nil && !bytes.Equal(st.encode(), b) {
			t.Fatalf("state does not round-trip")
		}
		if j, err := decodeCompactJob(b); err == nil && !bytes.Equal(j.encode(), b) {
			t.Fatalf("compaction job does not round-trip")
		}
		_, _ = decodeKV(b)
	})
}

// TestCheckKeyIsExact: on a bbolt engine (32 KiB keys), the longest key
// CheckKey admits is put, with a lease, committed, flushed and read back,
// and a key one byte longer, which CheckKey refuses, is refused by the
// engine too: the check is neither looser than the engine (a committed put
// that cannot apply) nor stricter. Keys of 0x00 bytes, which the history
// key escapes to two bytes each, have half the room.
func TestCheckKeyIsExact(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fill    byte
		longest int
	}{
		{"letters", 'a', bolt.MaxKeySize - 20},
		{"zeros", 0, (bolt.MaxKeySize - 20) / 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := ebbolt.Open(t.TempDir(), ebbolt.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			s, err := Open(e, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			longest := bytes.Repeat([]byte{tc.fill}, tc.longest)
			tooLong := append(bytes.Clone(longest), tc.fill)
			if err := s.CheckKey(longest); err != nil {
				t.Fatalf("CheckKey(%d bytes): %v", len(longest), err)
			}
			if err := s.CheckKey(tooLong); !errors.Is(err, ErrKeyTooLarge) {
				t.Fatalf("CheckKey(%d bytes) = %v, want ErrKeyTooLarge", len(tooLong), err)
			}
			leases := leaseFunc(func(id int64) bool { return id == 7 })
			w := s.Write(leases)
			if err := w.PutLease(LeaseRecord{ID: 7, TTL: 10}); err != nil {
				t.Fatal(err)
			}
			if _, err := w.Put(&pb.PutRequest{Key: longest, Value: []byte("v"), Lease: 7}); err != nil {
				t.Fatalf("put of the longest admitted key: %v", err)
			}
			if err := w.Commit(1); err != nil {
				t.Fatal(err)
			}
			if err := e.Flush(); err != nil {
				t.Fatal(err)
			}
			resp, err := s.Range(&pb.RangeRequest{Key: longest})
			if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease != 7 {
				t.Fatalf("range of the longest key: %v, %v", resp, err)
			}
			// The longest key's history entry is written when its version
			// is replaced, and its tombstone when it is deleted.
			w = s.Write(leases)
			if _, err := w.Put(&pb.PutRequest{Key: longest, Value: []byte("w"), Lease: 7}); err != nil {
				t.Fatalf("overwrite of the longest admitted key: %v", err)
			}
			if _, err := w.DeleteRange(&pb.DeleteRangeRequest{Key: longest}); err != nil {
				t.Fatalf("delete of the longest admitted key: %v", err)
			}
			if err := w.Commit(2); err != nil {
				t.Fatal(err)
			}
			// One more byte and the engine refuses the key somewhere in its
			// life: at the latest when its first version moves to history.
			w = s.Write(leases)
			_, err = w.Put(&pb.PutRequest{Key: tooLong, Value: []byte("v"), Lease: 7})
			if err == nil {
				_, err = w.Put(&pb.PutRequest{Key: tooLong, Value: []byte("w"), Lease: 7})
			}
			w.Abort()
			if err == nil {
				t.Fatalf("the engine took a key of %d bytes that CheckKey refuses", len(tooLong))
			}
		})
	}
}

// TestEngineKeyLen: engineKeyLen is the longest of the keys a put writes.
func TestEngineKeyLen(t *testing.T) {
	for _, key := range []string{"a", "\x00", "a\x00b\x00\x00", "\xff\xff", string(bytes.Repeat([]byte{0}, 100))} {
		k := []byte(key)
		want := max(len(currentKey(k)), len(historyKey(k, 1<<40, 3)), len(leaseKey(1<<40, k)))
		if got := engineKeyLen(k); got != want {
			t.Errorf("engineKeyLen(%q) = %d, want %d", key, got, want)
		}
	}
}
