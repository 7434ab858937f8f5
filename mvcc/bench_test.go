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

// BenchmarkApplyPutLoaded applies puts, 100 per batch, to a store that
// already holds loadedKeys keys compacted into Pebble's bottom level, the
// shape of a server after a bulk load: "new" puts keys the store has never
// held (a load, a Kubernetes create), "existing" overwrites loaded keys at
// random (YCSB's updates). Each put reads its key's previous version first,
// unless the filter of current keys, built after the load, has never seen
// the key.
func BenchmarkApplyPutLoaded(b *testing.B) {
	const loadedKeys = 300_000
	e, s := benchStore(b)
	val := make([]byte, 256)
	key := func(i uint64) []byte { return binary.BigEndian.AppendUint64([]byte("k"), i*2) }
	index := uint64(0)
	for start := uint64(0); start < loadedKeys; start += 1000 {
		w := s.Write(nil)
		for i := start; i < start+1000; i++ {
			if _, err := w.Put(&pb.PutRequest{Key: key(i), Value: val}); err != nil {
				b.Fatal(err)
			}
		}
		index++
		if err := w.Commit(index); err != nil {
			b.Fatal(err)
		}
	}
	if err := e.CompactAll(); err != nil {
		b.Fatal(err)
	}
	// As a member does after its start-up replay (currentkeys.go).
	if err := s.buildCurrentKeys(nil); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		key  func(r *rand.Rand) []byte
		zipf bool // key is drawn from a Zipf distribution over the loaded keys
	}{
		// Odd numbers were never loaded.
		{name: "new", key: func(r *rand.Rand) []byte { return binary.BigEndian.AppendUint64([]byte("k"), r.Uint64()|1) }},
		{name: "existing", key: func(r *rand.Rand) []byte { return key(r.Uint64N(loadedKeys)) }},
		// Zipfian updates, as YCSB's A and AW make (Go's Zipf needs s > 1:
		// 1.01 against YCSB's 0.99): hot keys written again and again,
		// whose versions sit in the memtables and in flushed tables too.
		{name: "zipfian", zipf: true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			if bc.zipf {
				z := rand.NewZipf(rng, 1.01, 1, loadedKeys-1)
				bc.key = func(*rand.Rand) []byte { return key(z.Uint64()) }
			}
			const perBatch = 100
			b.ReportAllocs()
			for b.Loop() {
				w := s.Write(nil)
				for range perBatch {
					if _, err := w.Put(&pb.PutRequest{Key: bc.key(rng), Value: val}); err != nil {
						b.Fatal(err)
					}
				}
				index++
				if err := w.Commit(index); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N*perBatch)/b.Elapsed().Seconds(), "puts/s")
		})
	}
}
