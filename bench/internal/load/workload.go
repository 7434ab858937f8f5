// Package load is the benchmark's one load generator: it drives any server
// that speaks the etcd v3 API through clientv3, so strata and etcd see exactly
// the same requests.
//
// A Workload makes Generators; a generator turns a per-client random source
// into a stream of operations (read, update, insert). Run opens Conns client
// connections, starts Clients goroutines spread over them, and lets them take
// operations until Total have been issued, timing each one into an HDR
// histogram (microseconds, 3 significant digits).
//
// The workloads:
//
//   - Put: etcd's `benchmark put`: 8-byte binary keys, 256-byte values by
//     default, sequential keys over a key space.
//   - Range: etcd's `benchmark range`: repeated reads of one key,
//     linearizable or serializable.
//   - YCSB A, B, C, D, plus AW (100% updates, uniform) and AWL (100% updates,
//     latest), over a preloaded key space (Load) with 100-byte values.
//   - List: every key under a prefix per request (LoadList), in one Range
//     response or through RangeStream: a Kubernetes LIST.
//
// Concurrency: generators are shared by all client goroutines of a run and
// are safe for concurrent use; each goroutine passes its own *rand.Rand.
package load

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
)

// OpKind is the kind of one operation.
type OpKind int

const (
	// OpRead is a Get of one key.
	OpRead OpKind = iota
	// OpUpdate is a Put to an existing key.
	OpUpdate
	// OpInsert is a Put to a new key.
	OpInsert
	// OpList is a Range of every key under ListPrefix (a Kubernetes LIST),
	// answered in one response.
	OpList
	// OpListStream is OpList through RangeStream (etcd 3.7), answered in
	// chunks.
	OpListStream
)

// Op is one request to issue.
type Op struct {
	Kind  OpKind
	Key   string
	Value []byte
}

// Generator yields the operations of a workload.
type Generator interface {
	// Next returns the next operation. Safe for concurrent use.
	Next(rng *rand.Rand) Op
}

// Workload describes a load and makes its generator.
type Workload interface {
	// Name is the report label, e.g. "put", "range-l", "ycsb-A-zipfian".
	Name() string
	// NewGenerator returns a fresh generator; records is the number of keys
	// preloaded with Load (0 if none).
	NewGenerator(records int64) Generator
	// Records is the number of keys that must be loaded before the run.
	Records() int64
}

// value returns a deterministic pseudo-random value of n bytes; values
// compress like random data, as in etcd's benchmark.
func value(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// PutWorkload is etcd's `benchmark put`.
type PutWorkload struct {
	// KeySize is the key length in bytes (8 in etcd's published runs).
	KeySize int
	// ValueSize is the value length in bytes (256 in etcd's published runs).
	ValueSize int
	// KeySpace is the number of distinct keys, written in sequence and
	// wrapping around. etcd's tool defaults to 1 (one key rewritten); the
	// benchmark defaults to the request count (every put a new key).
	KeySpace int64
}

// Name implements Workload.
func (w PutWorkload) Name() string { return "put" }

// Records implements Workload.
func (w PutWorkload) Records() int64 { return 0 }

// NewGenerator implements Workload.
func (w PutWorkload) NewGenerator(int64) Generator {
	return &putGen{w: w, val: value(w.ValueSize, 1)}
}

type putGen struct {
	w   PutWorkload
	val []byte
	seq atomic.Int64
}

func (g *putGen) Next(*rand.Rand) Op {
	i := g.seq.Add(1) - 1
	if g.w.KeySpace > 0 {
		i %= g.w.KeySpace
	}
	return Op{Kind: OpUpdate, Key: binaryKey(uint64(i), g.w.KeySize), Value: g.val}
}

// binaryKey encodes i big-endian into a key of size bytes (at least 1),
// so keys sort in sequence order like etcd's sequential keys.
func binaryKey(i uint64, size int) string {
	size = max(size, 1)
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], i)
	if size >= 8 {
		return strings.Repeat("\x00", size-8) + string(b[:])
	}
	return string(b[8-size:])
}

// RangeKey is the single key read by RangeWorkload; PreloadRange writes it.
const RangeKey = "strata-bench-range"

// RangeWorkload is etcd's `benchmark range` of one key.
type RangeWorkload struct {
	// Serializable selects local reads instead of linearizable ones.
	Serializable bool
}

// Name implements Workload.
func (w RangeWorkload) Name() string {
	if w.Serializable {
		return "range-s"
	}
	return "range-l"
}

// Records implements Workload.
func (w RangeWorkload) Records() int64 { return 0 }

// NewGenerator implements Workload.
func (w RangeWorkload) NewGenerator(int64) Generator { return rangeGen{} }

type rangeGen struct{}

func (rangeGen) Next(*rand.Rand) Op { return Op{Kind: OpRead, Key: RangeKey} }

// ListPrefix is the prefix of the keys LoadList writes and ListWorkload
// reads.
const ListPrefix = "strata-bench-list/"

// ListKey is the i-th key LoadList writes.
func ListKey(i int64) string { return fmt.Sprintf("%s%010d", ListPrefix, i) }

// ListWorkload reads every key under ListPrefix per request, as a
// Kubernetes LIST of one resource does.
type ListWorkload struct {
	// Keys is the number of keys LoadList preloaded.
	Keys int64
	// Stream reads with RangeStream instead of one Range response.
	Stream bool
}

// Name implements Workload.
func (w ListWorkload) Name() string {
	if w.Stream {
		return "list-stream"
	}
	return "list"
}

// Records implements Workload.
func (w ListWorkload) Records() int64 { return w.Keys }

// NewGenerator implements Workload.
func (w ListWorkload) NewGenerator(int64) Generator {
	kind := OpList
	if w.Stream {
		kind = OpListStream
	}
	return listGen{kind: kind}
}

type listGen struct{ kind OpKind }

func (g listGen) Next(*rand.Rand) Op { return Op{Kind: g.kind, Key: ListPrefix} }

// YCSB is one of the YCSB core workloads over a preloaded key space.
type YCSB struct {
	// Letter is "A", "B", "C", "D", "AW" or "AWL".
	Letter string
	// ReadProportion, UpdateProportion and InsertProportion sum to 1.
	ReadProportion, UpdateProportion, InsertProportion float64
	// Dist chooses the keys of reads and updates.
	Dist Distribution
	// RecordCount is the number of keys preloaded.
	RecordCount int64
	// ValueSize is the value length in bytes (100 by default).
	ValueSize int
}

// YCSBWorkload returns the standard mix for letter with its standard key
// distribution, unless dist is non-empty.
func YCSBWorkload(letter string, dist Distribution, records int64, valueSize int) (YCSB, error) {
	w := YCSB{Letter: strings.ToUpper(letter), RecordCount: records, ValueSize: valueSize}
	def := Zipfian
	switch w.Letter {
	case "A":
		w.ReadProportion, w.UpdateProportion = 0.5, 0.5
	case "B":
		w.ReadProportion, w.UpdateProportion = 0.95, 0.05
	case "C":
		w.ReadProportion = 1
	case "D":
		w.ReadProportion, w.InsertProportion = 0.95, 0.05
		def = Latest
	case "AW":
		w.UpdateProportion = 1
		def = Uniform
	case "AWL":
		w.UpdateProportion = 1
		def = Latest
	default:
		return YCSB{}, fmt.Errorf("unknown YCSB workload %q (want A, B, C, D, AW or AWL)", letter)
	}
	w.Dist = def
	if dist != "" {
		w.Dist = dist
	}
	return w, nil
}

// Name implements Workload.
func (w YCSB) Name() string { return fmt.Sprintf("ycsb-%s-%s", w.Letter, w.Dist) }

// Records implements Workload.
func (w YCSB) Records() int64 { return w.RecordCount }

// NewGenerator implements Workload.
func (w YCSB) NewGenerator(records int64) Generator {
	g := &ycsbGen{w: w, ch: newChooser(w.Dist, max(records, 1)), val: value(w.ValueSize, 2)}
	g.count.Store(max(records, 1))
	return g
}

type ycsbGen struct {
	w     YCSB
	ch    chooser
	val   []byte
	count atomic.Int64 // keys that exist (or are being inserted): 0..count-1
}

func (g *ycsbGen) Next(rng *rand.Rand) Op {
	u := rng.Float64()
	switch {
	case u < g.w.ReadProportion:
		return Op{Kind: OpRead, Key: YCSBKey(g.ch.choose(rng, g.count.Load()))}
	case u < g.w.ReadProportion+g.w.UpdateProportion:
		return Op{Kind: OpUpdate, Key: YCSBKey(g.ch.choose(rng, g.count.Load())), Value: g.val}
	default:
		i := g.count.Add(1) - 1
		return Op{Kind: OpInsert, Key: YCSBKey(i), Value: g.val}
	}
}

// YCSBKey is the name of record i: "user" and a hash of i, as YCSB's hashed
// insert order does, so inserts land all over the key space.
func YCSBKey(i int64) string {
	return fmt.Sprintf("user%020d", fnv64(uint64(i)))
}
