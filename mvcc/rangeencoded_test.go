package mvcc

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// TestRangeEncodedAgreesWithRange: a range answered in wire encoding
// decodes to exactly the response Range gives, on a store of moved
// records and on one of copied records (a replay of compacted batches),
// for every limit and chunk size; requests it does not answer get ok false.
func TestRangeEncodedAgreesWithRange(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 9))
	moved := openMemStore(t)
	for range 80 {
		apply(t, moved, randomWrite(t, r))
	}
	// Values large enough that small chunk sizes split the answer.
	apply(t, moved, func(w *WriteBatch) {
		for i := range 4 {
			if _, err := w.Put(&pb.PutRequest{Key: []byte(fmt.Sprintf("k%d", i)), Value: bytes.Repeat([]byte{'x'}, 300)}); err != nil {
				t.Fatal(err)
			}
		}
	})
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

	answered := []*pb.RangeRequest{
		{Key: []byte{0}, RangeEnd: []byte{0}},
		{Key: []byte("k"), RangeEnd: []byte("l")},
		{Key: []byte("k2"), RangeEnd: []byte("k4")},
		{Key: []byte("k9"), RangeEnd: []byte("l")},  // no key there
		{Key: []byte("k4"), RangeEnd: []byte("k2")}, // end before key
		{Key: []byte("k1"), RangeEnd: []byte{0}},    // every key from k1
		{Key: []byte("k"), RangeEnd: []byte("l"), Limit: 1},
		{Key: []byte("k"), RangeEnd: []byte("l"), Limit: 3},
		{Key: []byte("k"), RangeEnd: []byte("l"), Limit: 100},
		{Key: []byte("k"), RangeEnd: []byte("l"), SortTarget: pb.RangeRequest_KEY, SortOrder: pb.RangeRequest_ASCEND},
		{Key: []byte("k"), RangeEnd: []byte("l"), Serializable: true},
	}
	for _, s := range []struct {
		name  string
		store *Store
	}{{"moved", moved}, {"copied", copied}} {
		for i, req := range answered {
			for _, chunkBytes := range []int{1, 100, 700, 1 << 20} {
				want, err := s.store.Range(req)
				if err != nil {
					t.Fatal(err)
				}
				pool := &countingPool{}
				enc, ok, err := s.store.RangeEncoded(req, pool, chunkBytes)
				if err != nil || !ok {
					t.Fatalf("%s: request %d (%v): ok %v, err %v", s.name, i, req, ok, err)
				}
				var got pb.RangeResponse
				if pool.got != len(enc.Kvs) {
					t.Fatalf("%s: request %d: %d chunks from %d buffers of the pool", s.name, i, len(enc.Kvs), pool.got)
				}
				for _, p := range enc.Kvs {
					c := *p
					if _, _, n := protowire.ConsumeField(c); len(c) > chunkBytes && n != len(c) {
						t.Fatalf("%s: request %d: chunk of %d bytes holds several keys, past %d", s.name, i, len(c), chunkBytes)
					}
					if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(c, &got); err != nil {
						t.Fatal(err)
					}
				}
				got.Header = &pb.ResponseHeader{Revision: enc.Revision}
				got.Count, got.More = enc.Count, enc.More
				if !proto.Equal(&got, want) {
					t.Fatalf("%s: request %d (%v), chunks of %d:\n got %v\nwant %v", s.name, i, req, chunkBytes, &got, want)
				}
			}
		}
	}

	notAnswered := []*pb.RangeRequest{
		{Key: []byte("k1")}, // a single key
		{Key: []byte("k"), RangeEnd: []byte("l"), Revision: moved.Rev()},
		{Key: []byte("k"), RangeEnd: []byte("l"), KeysOnly: true},
		{Key: []byte("k"), RangeEnd: []byte("l"), CountOnly: true},
		{Key: []byte("k"), RangeEnd: []byte("l"), SortOrder: pb.RangeRequest_DESCEND},
		{Key: []byte("k"), RangeEnd: []byte("l"), SortTarget: pb.RangeRequest_VALUE}, // sorts ascending
		{Key: []byte("k"), RangeEnd: []byte("l"), SortTarget: pb.RangeRequest_MOD, SortOrder: pb.RangeRequest_ASCEND},
		{Key: []byte("k"), RangeEnd: []byte("l"), MinModRevision: 2},
		{Key: []byte("k"), RangeEnd: []byte("l"), MaxCreateRevision: 9},
	}
	for i, req := range notAnswered {
		if enc, ok, err := moved.RangeEncoded(req, &countingPool{}, 1<<20); ok || err != nil || enc != nil {
			t.Fatalf("request %d (%v): answered %v, %v, %v; want ok false", i, req, enc, ok, err)
		}
	}
}

// countingPool is a BufferPool that counts what it hands out and gets back.
type countingPool struct{ got, put int }

func (p *countingPool) Get(n int) *[]byte {
	p.got++
	b := make([]byte, n)
	return &b
}

func (p *countingPool) Put(*[]byte) { p.put++ }

// TestStoredKVRejectsCorruptRecords: a current record that does not parse
// is an error, not bytes handed to a client.
func TestStoredKVRejectsCorruptRecords(t *testing.T) {
	good, err := proto.Marshal(&pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l")})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		record []byte
		want   []byte // nil: errCorrupt
	}{
		{"copied", good, good},
		{"moved", append([]byte{currentMoved, 3}, good...), good},
		{"moved, long sub-revision", append([]byte{currentMoved, 0x80, 0x01}, good...), good},
		{"empty", []byte{}, []byte{}},
		{"moved, sub-revision cut", []byte{currentMoved, 0x80}, nil},
		{"field cut short", good[:len(good)-1], nil},
		{"bad wire type", []byte{0x0f, 0x01}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := storedKV(tc.record)
			if tc.want == nil {
				if !errors.Is(err, errCorrupt) {
					t.Fatalf("storedKV = %x, %v; want errCorrupt", got, err)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("storedKV = %x, %v; want %x", got, err, tc.want)
			}
		})
	}
}

// TestRangeEncodedCorruptRecord: a record that does not parse fails the
// range with errCorrupt, and every chunk taken goes back to the pool.
func TestRangeEncodedCorruptRecord(t *testing.T) {
	e, s := openTestStore(t, vfs.NewMem(), "db")
	apply(t, s, func(w *WriteBatch) {
		for i := range 50 {
			if _, err := w.Put(&pb.PutRequest{Key: []byte(fmt.Sprintf("k%02d", i)), Value: bytes.Repeat([]byte{'v'}, 100)}); err != nil {
				t.Fatal(err)
			}
		}
	})
	wb := e.NewBatch()
	if err := wb.Set(currentKey([]byte("k99")), []byte{0x0f, 0x01}); err != nil {
		t.Fatal(err)
	}
	if err := wb.Commit(e.AppliedIndex()); err != nil {
		t.Fatal(err)
	}
	pool := &countingPool{}
	enc, ok, err := s.RangeEncoded(&pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l")}, pool, 512)
	if !errors.Is(err, errCorrupt) || enc != nil || ok {
		t.Fatalf("RangeEncoded over a corrupt record = %v, %v, %v; want errCorrupt", enc, ok, err)
	}
	if pool.got < 2 || pool.put != pool.got {
		t.Fatalf("%d chunks taken from the pool, %d given back; want several, all back", pool.got, pool.put)
	}
}

// TestRangeStreamEncoded: the chunks RangeStreamEncoded sends merge into
// Range's answer, each before the last within the chunk size, the last
// with the revision, count and more; a send that fails stops the stream
// with its error and leaves no chunk out of the pool or the sender's hands.
func TestRangeStreamEncoded(t *testing.T) {
	s := openMemStore(t)
	apply(t, s, func(w *WriteBatch) {
		for i := range 40 {
			if _, err := w.Put(&pb.PutRequest{Key: []byte(fmt.Sprintf("k%02d", i)), Value: bytes.Repeat([]byte{'v'}, 50+i)}); err != nil {
				t.Fatal(err)
			}
		}
	})
	for _, req := range []*pb.RangeRequest{
		{Key: []byte("k"), RangeEnd: []byte("l")},
		{Key: []byte("k"), RangeEnd: []byte("l"), Limit: 7},
		{Key: []byte("k3"), RangeEnd: []byte{0}},
		{Key: []byte("x"), RangeEnd: []byte("y")},
	} {
		for _, chunkBytes := range []int{1, 300, 1 << 20} {
			want, err := s.Range(req)
			if err != nil {
				t.Fatal(err)
			}
			pool := &countingPool{}
			var got pb.RangeResponse
			var chunks, finals int
			ok, err := s.RangeStreamEncoded(req, pool, chunkBytes, func(enc *EncodedRange, final bool) error {
				chunks++
				if final {
					finals++
					got.Header = &pb.ResponseHeader{Revision: enc.Revision}
					got.Count, got.More = enc.Count, enc.More
				} else if len(enc.Kvs) != 1 || enc.Count != 0 || enc.Revision != 0 {
					t.Fatalf("chunk %d before the last: %d buffers, count %d, revision %d", chunks, len(enc.Kvs), enc.Count, enc.Revision)
				}
				for _, p := range enc.Kvs {
					if _, _, n := protowire.ConsumeField(*p); len(*p) > chunkBytes && n != len(*p) {
						t.Fatalf("chunk of %d bytes holds several keys, past %d", len(*p), chunkBytes)
					}
					if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(*p, &got); err != nil {
						t.Fatal(err)
					}
				}
				return nil
			})
			if !ok || err != nil || finals != 1 {
				t.Fatalf("%v, chunks of %d: ok %v, err %v, %d final chunks", req, chunkBytes, ok, err, finals)
			}
			if !proto.Equal(&got, want) {
				t.Fatalf("%v, chunks of %d:\n got %v\nwant %v", req, chunkBytes, &got, want)
			}
		}
	}

	pool := &countingPool{}
	sendErr := errors.New("client gone")
	handed := 0
	_, err := s.RangeStreamEncoded(&pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l")}, pool, 200, func(enc *EncodedRange, final bool) error {
		handed += len(enc.Kvs)
		if handed == 3 {
			return sendErr
		}
		return nil
	})
	if !errors.Is(err, sendErr) || handed != 3 || pool.got != handed+pool.put {
		t.Fatalf("stream whose third send fails: err %v, %d chunks handed over, %d taken, %d given back", err, handed, pool.got, pool.put)
	}

	for _, req := range []*pb.RangeRequest{
		{Key: []byte("k1")},
		{Key: []byte("k"), RangeEnd: []byte("l"), Revision: 2},
		{Key: []byte("k"), RangeEnd: []byte("l"), KeysOnly: true},
		{Key: []byte("k"), RangeEnd: []byte("l"), CountOnly: true},
	} {
		ok, err := s.RangeStreamEncoded(req, &countingPool{}, 1<<20, func(*EncodedRange, bool) error {
			t.Fatalf("%v: sent a chunk", req)
			return nil
		})
		if ok || err != nil {
			t.Fatalf("%v: ok %v, err %v; want ok false", req, ok, err)
		}
	}
}
