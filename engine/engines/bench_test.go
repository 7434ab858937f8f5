package engines

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/strata-kv/strata/engine"
)

// The engine-level comparison of docs/engines.md: the same batches of
// puts and the same range scans on each engine, below MVCC, raft and the
// network. Keys are 8 random bytes and values 256 random bytes, as in
// seed 001's put benchmark (etcd's `benchmark put --key-size=8
// --val-size=256`, whose values are random): Pebble compresses its
// tables, so values of zeros would flatter it.
//
//	go test -run '^$' -bench BenchmarkEngine -benchtime 20000x -count 3 ./engine/engines

const benchValue = 256

// values are 1024 random values, taken in turn.
var values = func() [][]byte {
	rng := rand.New(rand.NewPCG(5, 6))
	out := make([][]byte, 1024)
	for i := range out {
		out[i] = make([]byte, benchValue)
		for j := range out[i] {
			out[i][j] = byte(rng.Uint32())
		}
	}
	return out
}()

func benchOpen(b *testing.B, name string) engine.Transferable {
	b.Helper()
	e, err := Open(name, b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Close() })
	return e
}

// BenchmarkEnginePut: one op is one committed batch of `batch` puts of new
// random keys; the clock also covers the Flush that makes them all durable
// at the end. Reports puts/s and the engine's disk bytes per key after
// that flush and after a CompactAll (not timed).
func BenchmarkEnginePut(b *testing.B) {
	for _, name := range Names() {
		for _, batch := range []int{1, 100} {
			b.Run(fmt.Sprintf("engine=%s/batch=%d", name, batch), func(b *testing.B) {
				e := benchOpen(b, name)
				rng := rand.New(rand.NewPCG(1, 2))
				key := make([]byte, 8)
				b.ResetTimer()
				start := time.Now()
				for i := range b.N {
					wb := e.NewBatch()
					for j := range batch {
						binary.BigEndian.PutUint64(key, rng.Uint64())
						if err := wb.Set(key, values[(i*batch+j)%len(values)]); err != nil {
							b.Fatal(err)
						}
					}
					if err := wb.Commit(uint64(i + 1)); err != nil {
						b.Fatal(err)
					}
				}
				if err := e.Flush(); err != nil {
					b.Fatal(err)
				}
				elapsed := time.Since(start)
				b.StopTimer()
				b.ReportMetric(float64(b.N*batch)/elapsed.Seconds(), "puts/s")
				b.ReportMetric(float64(e.DiskSize())/float64(b.N*batch), "disk-B/key")
				if err := e.CompactAll(); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(e.DiskSize())/float64(b.N*batch), "compacted-B/key")
			})
		}
	}
}

// BenchmarkEngineRange: `keys` random keys are loaded in batches of 1000
// and flushed (state=flushed), or flushed and then compacted with
// CompactAll (state=compacted: an LSM tree's best case, a defragmented
// file for bbolt); one op then reads `scan` consecutive keys forwards
// from a random point through a new iterator on the engine.
func BenchmarkEngineRange(b *testing.B) {
	const keys = 200_000
	for _, name := range Names() {
		for _, state := range []string{"flushed", "compacted"} {
			for _, scan := range []int{1, 1000} {
				b.Run(fmt.Sprintf("engine=%s/keys=%d/state=%s/scan=%d", name, keys, state, scan), func(b *testing.B) {
					benchRange(b, name, keys, scan, state == "compacted")
				})
			}
		}
	}
}

func benchRange(b *testing.B, name string, keys, scan int, compact bool) {
	e := benchOpen(b, name)
	rng := rand.New(rand.NewPCG(3, 4))
	key := make([]byte, 8)
	for i := 0; i < keys; i += 1000 {
		wb := e.NewBatch()
		for j := range 1000 {
			binary.BigEndian.PutUint64(key, rng.Uint64())
			_ = wb.Set(key, values[j%len(values)])
		}
		if err := wb.Commit(uint64(i + 1)); err != nil {
			b.Fatal(err)
		}
	}
	if err := e.Flush(); err != nil {
		b.Fatal(err)
	}
	if compact {
		if err := e.CompactAll(); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	read := 0
	for range b.N {
		binary.BigEndian.PutUint64(key, rng.Uint64())
		it := e.NewIter(key, nil)
		n := 0
		for ok := it.First(); ok && n < scan; ok = it.Next() {
			read += len(it.Value())
			n++
		}
		if err := it.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if read == 0 {
		b.Fatal("scans read nothing")
	}
}

// BenchmarkEngineUpdate: updates of a hot set, where HybridLog's in-place
// updates should show (seed 004 found it fastest under a Zipfian choice of
// keys). 10 000 keys are loaded and flushed; one op is one committed batch
// of 100 updates of keys drawn from a Zipf distribution (s = 1.1) over
// them; the final Flush is timed. With reads=every-batch an iterator is
// opened and one key read after each commit, as strata's readers do
// between the applier's batches: on hybridlog that seals the mutable
// region, so the next batch appends instead of updating in place.
func BenchmarkEngineUpdate(b *testing.B) {
	const keys, batch = 10_000, 100
	for _, name := range Names() {
		for _, reads := range []string{"none", "every-batch"} {
			b.Run(fmt.Sprintf("engine=%s/reads=%s", name, reads), func(b *testing.B) {
				e := benchOpen(b, name)
				key := make([]byte, 8)
				for i := 0; i < keys; i += 1000 {
					wb := e.NewBatch()
					for j := range 1000 {
						binary.BigEndian.PutUint64(key, uint64(i+j))
						_ = wb.Set(key, values[j%len(values)])
					}
					if err := wb.Commit(uint64(i + 1)); err != nil {
						b.Fatal(err)
					}
				}
				if err := e.Flush(); err != nil {
					b.Fatal(err)
				}
				zipf := rand.NewZipf(rand.New(rand.NewPCG(7, 8)), 1.1, 1, keys-1)
				b.ResetTimer()
				start := time.Now()
				for i := range b.N {
					wb := e.NewBatch()
					for j := range batch {
						binary.BigEndian.PutUint64(key, zipf.Uint64())
						if err := wb.Set(key, values[(i*batch+j)%len(values)]); err != nil {
							b.Fatal(err)
						}
					}
					if err := wb.Commit(uint64(keys + i + 1)); err != nil {
						b.Fatal(err)
					}
					if reads == "every-batch" {
						it := e.NewIter(nil, nil)
						it.First()
						_ = it.Value()
						if err := it.Close(); err != nil {
							b.Fatal(err)
						}
					}
				}
				if err := e.Flush(); err != nil {
					b.Fatal(err)
				}
				elapsed := time.Since(start)
				b.StopTimer()
				b.ReportMetric(float64(b.N*batch)/elapsed.Seconds(), "updates/s")
				b.ReportMetric(float64(e.DiskSize())/float64(keys), "disk-B/key")
			})
		}
	}
}

// BenchmarkEngineHeap: the Go heap an engine holds for its keys. One op
// opens an engine, loads `keys` random keys (8 bytes, values of 256) in
// batches of 1000 and flushes; the heap in use after a collection, less
// the heap before the engine was opened, is reported per key. It counts
// the Go heap only: memory Pebble allocates outside it (its block cache)
// and bbolt's memory-mapped file are not in it, while appendlog's key
// directory and hybridlog's records and indexes are all in it. Run it
// with -benchtime 1x.
func BenchmarkEngineHeap(b *testing.B) {
	const keys = 200_000
	for _, name := range Names() {
		b.Run(fmt.Sprintf("engine=%s/keys=%d", name, keys), func(b *testing.B) {
			var total float64
			for range b.N {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				e, err := Open(name, b.TempDir(), Options{})
				if err != nil {
					b.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(3, 4))
				key := make([]byte, 8)
				for i := 0; i < keys; i += 1000 {
					wb := e.NewBatch()
					for j := range 1000 {
						binary.BigEndian.PutUint64(key, rng.Uint64())
						_ = wb.Set(key, values[j%len(values)])
					}
					if err := wb.Commit(uint64(i + 1)); err != nil {
						b.Fatal(err)
					}
				}
				if err := e.Flush(); err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				total += (float64(after.HeapAlloc) - float64(before.HeapAlloc)) / keys
				if err := e.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(total/float64(b.N), "heap-B/key")
		})
	}
}

// BenchmarkEngineReopen: the time to open an engine holding `keys` keys
// (8 random bytes, values of 256, loaded in batches of 1000, flushed and
// closed cleanly), until the first read answers: Pebble reads its
// manifest, bbolt its meta page, appendlog and hybridlog read each sealed
// data file's hint file (the keys and their locations) and replay the
// newest file into their key directory. For those two, open-scan-ms is the
// same directory opened again with its hint files removed, so that every
// data file is replayed: the engine before hint files, in the same run. The
// files were just written, so they are in the page cache: a cold start
// reads them from the disk too. Run it with -benchtime 1x.
func BenchmarkEngineReopen(b *testing.B) {
	const keys = 1_000_000
	for _, name := range Names() {
		b.Run(fmt.Sprintf("engine=%s/keys=%d", name, keys), func(b *testing.B) {
			var total, scanTotal time.Duration
			reopen := func(dir string, key []byte) time.Duration {
				start := time.Now()
				e, err := Open(name, dir, Options{})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := e.Get(key); err != nil {
					b.Fatal(err)
				}
				took := time.Since(start)
				if e.AppliedIndex() != keys-1000+1 {
					b.Fatalf("reopened at %d", e.AppliedIndex())
				}
				if err := e.Close(); err != nil {
					b.Fatal(err)
				}
				return took
			}
			for range b.N {
				dir := b.TempDir()
				e, err := Open(name, dir, Options{})
				if err != nil {
					b.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(3, 4))
				key := make([]byte, 8)
				for i := 0; i < keys; i += 1000 {
					wb := e.NewBatch()
					for j := range 1000 {
						binary.BigEndian.PutUint64(key, rng.Uint64())
						_ = wb.Set(key, values[j%len(values)])
					}
					if err := wb.Commit(uint64(i + 1)); err != nil {
						b.Fatal(err)
					}
				}
				if err := e.Close(); err != nil {
					b.Fatal(err)
				}
				total += reopen(dir, key)
				if name != AppendLog && name != HybridLog {
					continue
				}
				// The same files without their hints (the open above hinted
				// the file it replayed, and its Close wrote the hint).
				var hints int
				err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
					if err == nil && filepath.Ext(path) == ".hint" {
						hints++
						err = os.Remove(path)
					}
					return err
				})
				if err != nil || hints == 0 {
					b.Fatalf("removing %d hint files: %v", hints, err)
				}
				scanTotal += reopen(dir, key)
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "open-ms")
			if scanTotal > 0 {
				b.ReportMetric(float64(scanTotal.Milliseconds())/float64(b.N), "open-scan-ms")
			}
		})
	}
}

// BenchmarkEngineIncrementalBackup: what a backup taken after another
// must copy, by file (seed 004's incremental snapshots of immutable
// files). `keys` random keys are loaded in batches of 1000 and a
// checkpoint taken; then 1% of the keys get new values (in batches of
// 100) and a second checkpoint is taken. Reported: the second
// checkpoint's bytes (full-B) and the bytes of its files that the first
// does not hold with the same path and the same content (incr-B). 10^6
// keys make about 270 MB, several of appendlog's 64 MiB files: its unit of
// an incremental copy is a sealed file. Run it with -benchtime 1x.
func BenchmarkEngineIncrementalBackup(b *testing.B) {
	const keys = 1_000_000
	for _, name := range Names() {
		b.Run(fmt.Sprintf("engine=%s/keys=%d/changed=1%%", name, keys), func(b *testing.B) {
			var full, incr float64
			for range b.N {
				e, err := Open(name, b.TempDir(), Options{})
				if err != nil {
					b.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(3, 4))
				all := make([]uint64, 0, keys)
				key := make([]byte, 8)
				index := uint64(0)
				for i := 0; i < keys; i += 1000 {
					wb := e.NewBatch()
					for j := range 1000 {
						k := rng.Uint64()
						all = append(all, k)
						binary.BigEndian.PutUint64(key, k)
						_ = wb.Set(key, values[j%len(values)])
					}
					index++
					if err := wb.Commit(index); err != nil {
						b.Fatal(err)
					}
				}
				cp1 := filepath.Join(b.TempDir(), "cp1")
				if _, err := e.Checkpoint(cp1); err != nil {
					b.Fatal(err)
				}
				for i := 0; i < keys/100; i += 100 {
					wb := e.NewBatch()
					for j := range 100 {
						binary.BigEndian.PutUint64(key, all[rng.IntN(len(all))])
						_ = wb.Set(key, values[(i+j+7)%len(values)])
					}
					index++
					if err := wb.Commit(index); err != nil {
						b.Fatal(err)
					}
				}
				cp2 := filepath.Join(b.TempDir(), "cp2")
				if _, err := e.Checkpoint(cp2); err != nil {
					b.Fatal(err)
				}
				f, n := backupDelta(b, cp1, cp2)
				full += float64(f)
				incr += float64(n)
				if err := e.Close(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(full/float64(b.N), "full-B")
			b.ReportMetric(incr/float64(b.N), "incr-B")
		})
	}
}

// backupDelta returns the bytes of the files under cp2, and of those
// among them that cp1 does not hold with the same relative path and
// content.
func backupDelta(b *testing.B, cp1, cp2 string) (full, incr int64) {
	b.Helper()
	err := filepath.WalkDir(cp2, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(cp2, path)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		full += int64(len(data))
		old, err := os.ReadFile(filepath.Join(cp1, rel))
		if err != nil || !bytes.Equal(old, data) {
			incr += int64(len(data))
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return full, incr
}

// BenchmarkEngineStall: the longest and the 99.9th percentile commit
// while loading new keys in batches of 100 (the put benchmark's load):
// what a write stall costs the applier (bbolt and hybridlog wait for
// their flusher, appendlog syncs a file at each rotation, Pebble stalls on
// too many memtables or L0 files). No Flush is called.
func BenchmarkEngineStall(b *testing.B) {
	const batch = 100
	for _, name := range Names() {
		b.Run(fmt.Sprintf("engine=%s/batch=%d", name, batch), func(b *testing.B) {
			e := benchOpen(b, name)
			rng := rand.New(rand.NewPCG(1, 2))
			key := make([]byte, 8)
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				wb := e.NewBatch()
				for j := range batch {
					binary.BigEndian.PutUint64(key, rng.Uint64())
					if err := wb.Set(key, values[(i*batch+j)%len(values)]); err != nil {
						b.Fatal(err)
					}
				}
				start := time.Now()
				if err := wb.Commit(uint64(i + 1)); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-commit-µs")
			b.ReportMetric(float64(lat[len(lat)*999/1000].Microseconds()), "p99.9-commit-µs")
		})
	}
}
