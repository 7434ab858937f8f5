package mvcc

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"
)

// TestCopiedAndMovedRecordsAgree: a store whose versions were written as
// copied current records (every version in history as well: what data
// directories written before moved records hold, and what a replay of
// compacted log batches writes) answers exactly as the store whose Puts
// wrote moved records, before and after both go on with the same writes
// and compact: ranges at every revision, events with previous versions,
// HashKV at every revision, the key spaces Maintenance's Hash covers, and
// the number of versions kept.
func TestCopiedAndMovedRecordsAgree(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			moved := openMemStore(t)
			for range 60 {
				apply(t, moved, randomWrite(t, r))
			}
			changes, err := moved.Changes(1, moved.Rev())
			if err != nil {
				t.Fatal(err)
			}
			copied := openMemStore(t)
			apply(t, copied, func(w *WriteBatch) {
				for _, c := range changes {
					if err := w.SetKeyState(c); err != nil {
						t.Fatal(err)
					}
				}
			})
			if copied.Rev() != moved.Rev() {
				t.Fatalf("replayed revision %d, want %d", copied.Rev(), moved.Rev())
			}
			sameAnswers(t, "replayed", moved, copied, 1)

			// The same writes on both: the copied store now mixes both
			// kinds of records.
			for range 60 {
				w := randomWrite(t, r)
				apply(t, moved, w)
				apply(t, copied, w)
			}
			sameAnswers(t, "after more writes", moved, copied, 1)

			target := moved.Rev() - 20
			for _, s := range []*Store{moved, copied} {
				s.Start()
				var done <-chan struct{}
				apply(t, s, func(w *WriteBatch) {
					var err error
					if _, done, err = w.Compact(&pb.CompactionRequest{Revision: target}); err != nil {
						t.Fatal(err)
					}
				})
				<-done
			}
			sameAnswers(t, "after compaction", moved, copied, target)
			if m, c := countVersions(t, moved.e, nil), countVersions(t, copied.e, nil); m != c {
				t.Fatalf("after compaction: %d versions kept with moved records, %d with copied", m, c)
			}
			moved.Close()
			copied.Close()
		})
	}
}

func openMemStore(t *testing.T) *Store {
	t.Helper()
	_, s := openTestStore(t, vfs.NewMem(), "db")
	return s
}

// randomWrite is one request over keys k0..k5: a put (sometimes again to
// the same key), a delete of one key or a range, or a txn of two puts.
func randomWrite(t *testing.T, r *rand.Rand) func(w *WriteBatch) {
	key := func() string { return fmt.Sprintf("k%d", r.IntN(6)) }
	val := fmt.Sprintf("v%d", r.IntN(1000))
	switch n := r.IntN(10); {
	case n < 5:
		k := key()
		return func(w *WriteBatch) {
			if _, err := w.Put(&pb.PutRequest{Key: []byte(k), Value: []byte(val)}); err != nil {
				t.Fatal(err)
			}
		}
	case n < 7:
		k, end := key(), ""
		if n == 6 {
			end = k + "~"
		}
		return func(w *WriteBatch) {
			if _, err := w.DeleteRange(del(k, end).GetRequestDeleteRange()); err != nil {
				t.Fatal(err)
			}
		}
	default:
		a, b := key(), key()
		if a == b {
			b += "x"
		}
		return func(w *WriteBatch) {
			if _, err := w.Txn(&pb.TxnRequest{Success: []*pb.RequestOp{put(a, val), put(b, val)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// sameAnswers compares every read of a and b from revision from on.
func sameAnswers(t *testing.T, when string, a, b *Store, from int64) {
	t.Helper()
	for rev := from; rev <= a.Rev(); rev++ {
		ra, erra := a.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: rev})
		rb, errb := b.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: rev})
		if fmt.Sprint(erra) != fmt.Sprint(errb) || !proto.Equal(ra, rb) {
			t.Fatalf("%s: range at %d:\n%v (%v)\n%v (%v)", when, rev, ra, erra, rb, errb)
		}
		for k := range 7 {
			key := []byte(fmt.Sprintf("k%d", k))
			ga, erra := a.Range(&pb.RangeRequest{Key: key, Revision: rev})
			gb, errb := b.Range(&pb.RangeRequest{Key: key, Revision: rev})
			if fmt.Sprint(erra) != fmt.Sprint(errb) || !proto.Equal(ga, gb) {
				t.Fatalf("%s: get %s at %d:\n%v (%v)\n%v (%v)", when, key, rev, ga, erra, gb, errb)
			}
		}
		ha, _, _, erra := a.HashKV(rev)
		hb, _, _, errb := b.HashKV(rev)
		if erra != nil || errb != nil || ha != hb {
			t.Fatalf("%s: HashKV(%d) = %x (%v), %x (%v)", when, rev, ha, erra, hb, errb)
		}
	}
	var ka, kb bytes.Buffer
	if err := WriteKeySpaces(a.e, &ka); err != nil {
		t.Fatal(err)
	}
	if err := WriteKeySpaces(b.e, &kb); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ka.Bytes(), kb.Bytes()) {
		t.Fatalf("%s: WriteKeySpaces differ: %d and %d bytes", when, ka.Len(), kb.Len())
	}
	ea, _, erra := a.Events(from, 0, 0, true)
	eb, _, errb := b.Events(from, 0, 0, true)
	if erra != nil || errb != nil || len(ea) != len(eb) {
		t.Fatalf("%s: events: %d (%v), %d (%v)", when, len(ea), erra, len(eb), errb)
	}
	for i := range ea {
		if !proto.Equal(ea[i], eb[i]) {
			t.Fatalf("%s: event %d:\n%v\n%v", when, i, ea[i], eb[i])
		}
	}
}

// TestNewerLayoutRefused: a store that records a layout above this
// release's is refused at Open; a store without the record (an older
// release's) opens, and its first commit records the current layout.
func TestNewerLayoutRefused(t *testing.T) {
	fs := vfs.NewMem()
	e, s := openTestStore(t, fs, "db")
	if b, err := e.Get(metaLayout); err == nil {
		t.Fatalf("a store that has committed nothing records layout %x", b)
	}
	apply(t, s, mustPut(t, "a", "1"))
	b, err := e.Get(metaLayout)
	if err != nil || binary.BigEndian.Uint64(b) != layoutCurrent {
		t.Fatalf("layout after the first commit: %x, %v; want %d", b, err, layoutCurrent)
	}
	wb := e.NewBatch()
	if err := wb.Set(metaLayout, binary.BigEndian.AppendUint64(nil, layoutCurrent+1)); err != nil {
		t.Fatal(err)
	}
	if err := wb.Commit(e.AppliedIndex()); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(e, Options{}); err == nil || !strings.Contains(err.Error(), "newer strata release") {
		t.Fatalf("Open of a store of layout %d: %v, want a refusal naming a newer release", layoutCurrent+1, err)
	}
}
