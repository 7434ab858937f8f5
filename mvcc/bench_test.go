package mvcc

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	epebble "github.com/strata-kv/strata/engine/pebble"
)

func benchStore(b *testing.B) (*epebble.Engine, *Store) {
	b.Helper()
	e, err := epebble.Open(filepath.Join(b.TempDir(), "db"), epebble.Options{})
	if err != nil {
		b.Fatal(err)
	}
	s, err := Open(e, Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e, s
}

// BenchmarkApplyPut applies puts of 8-byte keys and 256-byte values, 100 per
// batch, on real disk: wal=off is production (no engine WAL, no sync);
// wal=on is the double-logging baseline (Pebble's WAL, a sync per batch).
func BenchmarkApplyPut(b *testing.B) {
	for _, wal := range []bool{false, true} {
		b.Run(fmt.Sprintf("wal=%v", map[bool]string{false: "off", true: "on"}[wal]), func(b *testing.B) {
			benchApplyPut(b, wal)
		})
	}
}

func benchApplyPut(b *testing.B, wal bool) {
	e, err := epebble.Open(filepath.Join(b.TempDir(), "db"), epebble.Options{EnableWAL: wal})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	s, err := Open(e, Options{})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	val := make([]byte, 256)
	const perBatch = 100
	b.ReportAllocs()
	b.SetBytes(int64(perBatch * (8 + len(val))))
	index := uint64(0)
	for b.Loop() {
		w := s.Write(nil)
		for range perBatch {
			key := binary.BigEndian.AppendUint64(nil, rng.Uint64N(1<<20))
			if _, err := w.Put(&pb.PutRequest{Key: key, Value: val}); err != nil {
				b.Fatal(err)
			}
		}
		index++
		if err := w.Commit(index); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*perBatch)/b.Elapsed().Seconds(), "puts/s")
}

// BenchmarkRange reads from 10,000 keys with 3 versions each: a single key,
// 100 keys at the current revision, and 100 keys at an older revision.
func BenchmarkRange(b *testing.B) {
	e, s := benchStore(b)
	val := make([]byte, 256)
	const n = 10000
	for round := range 3 {
		w := s.Write(nil)
		for i := range n {
			if _, err := w.Put(&pb.PutRequest{Key: fmt.Appendf(nil, "key%06d", i), Value: val}); err != nil {
				b.Fatal(err)
			}
		}
		if err := w.Commit(uint64(round + 1)); err != nil {
			b.Fatal(err)
		}
	}
	if err := e.Flush(); err != nil {
		b.Fatal(err)
	}
	old := s.Rev() - n - n/2
	rng := rand.New(rand.NewPCG(1, 2))
	for _, bc := range []struct {
		name  string
		rev   int64
		width int
	}{
		{name: "point", width: 0},
		{name: "100keys/current", width: 100},
		{name: "100keys/old", rev: old, width: 100},
		{name: "point/old", rev: old, width: 0},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				i := rng.IntN(n - bc.width)
				req := &pb.RangeRequest{Key: fmt.Appendf(nil, "key%06d", i), Revision: bc.rev}
				if bc.width > 0 {
					req.RangeEnd = fmt.Appendf(nil, "key%06d", i+bc.width)
				}
				resp, err := s.Range(req)
				if err != nil {
					b.Fatal(err)
				}
				if want := max(bc.width, 1); len(resp.Kvs) != want {
					b.Fatalf("got %d keys, want %d", len(resp.Kvs), want)
				}
			}
		})
	}
}
