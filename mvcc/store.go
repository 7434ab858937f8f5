package mvcc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/engine"
)

// Errors with etcd's meanings; the server maps them to rpctypes codes.
var (
	// ErrCompacted: the requested revision is below the compact revision.
	ErrCompacted = errors.New("mvcc: required revision has been compacted")
	// ErrFutureRev: the requested revision is above the current revision.
	ErrFutureRev = errors.New("mvcc: required revision is a future revision")
	// ErrLeaseNotFound: a Put names a lease that does not exist.
	ErrLeaseNotFound = errors.New("lease not found")
	// ErrKeyNotFound: a Put with ignore_value or ignore_lease names a key
	// that does not exist (etcd's "etcdserver: key not found").
	ErrKeyNotFound = errors.New("etcdserver: key not found")
	// ErrKeyTooLarge: a key whose engine entries are longer than the
	// engine's key limit (Store.CheckKey). etcd has no such limit (it keys
	// bbolt by revision); the server answers it with InvalidArgument.
	ErrKeyTooLarge = errors.New("etcdserver: key is too large")
)

// Leases says which leases exist (lease.Lessor): a Put may attach a key
// only to one of them.
type Leases interface {
	Exists(id int64) bool
}

// Options configure a Store.
type Options struct {
	// Logger; nil means zap.NewNop().
	Logger *zap.Logger
	// CompactChunk is how many revision-index entries one step of physical
	// revision compaction visits (one engine batch, holding the write lock).
	// 0 means 1000. etcd's --compaction-batch-limit.
	CompactChunk int
	// CompactPause is how long physical revision compaction waits between
	// two steps, leaving the write lock to the applier (etcd's
	// --compaction-sleep-interval); 0: no wait.
	CompactPause time.Duration
}

// Store is etcd's MVCC key space on an engine.Engine.
//
// Concurrency: Write and the WriteBatch it returns are used by one goroutine
// (the applier). Range, Rev, CompactRev, Meta, HashKV and LeaseKeys are safe
// from any goroutine. Start runs one background goroutine (physical revision
// compaction) until Close.
//
// Lock order: wmu, then mu.
type Store struct {
	e    engine.Engine
	opts Options
	lg   *zap.Logger

	// wmu is held by an open WriteBatch from Write to Commit/Abort, and by
	// each step of physical compaction, so that the two never commit engine
	// batches concurrently (the applied index must not go backwards).
	wmu sync.Mutex

	rev        atomic.Int64 // committed current revision
	compactRev atomic.Int64 // committed compact revision (-1: none)
	// changes is odd while the engine's content and rev, compactRev may
	// disagree: from before a commit of a WriteBatch (or Replace's install)
	// until rev and compactRev hold what it committed, and for good after
	// one failed. Each change adds 2, so a reader that loads the same even
	// value before and after reading rev, compactRev and making a snapshot
	// knows that the three agree (snapshotView). Physical compaction's
	// batches do not count: they remove only versions below compactRev,
	// which no view reads.
	changes atomic.Uint64

	mu struct {
		sync.Mutex
		job     compactJob      // physical compaction progress (guarded by mu; written under wmu too)
		waiters []compactWaiter // closed when job reaches their target
	}
	kick    chan struct{} // wakes the compaction goroutine
	stop    chan struct{} // closed by Close; made by Start
	stopped chan struct{} // closed when the goroutine exits
	started bool          // Start and Close are called from one goroutine
	// layoutRecorded: the engine records layoutCurrent (mm"layout"); until
	// it does, the next commit records it.
	layoutRecorded atomic.Bool

	// keys is the filter of current keys (currentkeys.go), built by the
	// goroutine StartKeyFilter starts; rebuildKeys wakes it after a
	// Replace, and keysStopped is closed when it exits.
	keys        *currentKeys
	rebuildKeys chan struct{}
	keysStopped chan struct{}
}

type compactWaiter struct {
	rev  int64
	done chan struct{}
}

// Open opens the store on e. It reads a fixed handful of engine keys and
// never scans the key space. A pending physical compaction resumes after
// Start.
func Open(e engine.Engine, opts Options) (*Store, error) {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.CompactChunk <= 0 {
		opts.CompactChunk = 1000
	}
	s := &Store{e: e, opts: opts, lg: opts.Logger, kick: make(chan struct{}, 1),
		keys: newCurrentKeys(), rebuildKeys: make(chan struct{}, 1)}
	st := state{rev: 1, compactRev: -1}
	b, err := e.Get(metaState)
	switch {
	case errors.Is(err, engine.ErrNotFound):
	case err != nil:
		return nil, fmt.Errorf("open mvcc store: %w", err)
	default:
		if st, err = decodeState(b); err != nil {
			return nil, fmt.Errorf("open mvcc store: %w", err)
		}
	}
	s.rev.Store(st.rev)
	s.compactRev.Store(st.compactRev)
	if err := s.readLayout(); err != nil {
		return nil, fmt.Errorf("open mvcc store: %w", err)
	}
	b, err = e.Get(metaCompact)
	switch {
	case errors.Is(err, engine.ErrNotFound):
	case err != nil:
		return nil, fmt.Errorf("open mvcc store: %w", err)
	default:
		if s.mu.job, err = decodeCompactJob(b); err != nil {
			return nil, fmt.Errorf("open mvcc store: %w", err)
		}
	}
	return s, nil
}

// readLayout refuses a store written in a layout newer than this release's
// and notes whether the current one is recorded.
func (s *Store) readLayout() error {
	b, err := s.e.Get(metaLayout)
	switch {
	case errors.Is(err, engine.ErrNotFound):
		s.layoutRecorded.Store(false)
		return nil
	case err != nil:
		return fmt.Errorf("read store layout: %w", err)
	case len(b) != 8:
		return fmt.Errorf("%w: store layout of %d bytes", errCorrupt, len(b))
	}
	layout := binary.BigEndian.Uint64(b)
	if layout > layoutCurrent {
		return fmt.Errorf("store layout %d was written by a newer strata release; this release reads layouts up to %d", layout, layoutCurrent)
	}
	s.layoutRecorded.Store(layout == layoutCurrent)
	return nil
}

// CheckKey returns ErrKeyTooLarge when a Put of key would write an engine
// key above the engine's limit (engine.Engine.MaxKeySize), so that such a
// request is refused before it is proposed: once committed, a put the
// engine refuses could not be applied. A Put with a lease writes no longer
// key than one without.
func (s *Store) CheckKey(key []byte) error {
	if limit := s.e.MaxKeySize(); limit > 0 && engineKeyLen(key) > limit {
		return fmt.Errorf("%w: %d bytes make an engine key of %d bytes, above the engine's %d", ErrKeyTooLarge, len(key), engineKeyLen(key), limit)
	}
	return nil
}

// MaxKeySize returns the engine's key limit (0: none), for the other
// layouts in the same engine (auth's user and role names).
func (s *Store) MaxKeySize() int { return s.e.MaxKeySize() }

// Rev returns the current revision of committed state (1 for an empty store,
// as in etcd).
func (s *Store) Rev() int64 { return s.rev.Load() }

// CompactRev returns the compact revision, -1 before any compaction.
func (s *Store) CompactRev() int64 { return s.compactRev.Load() }

// AppliedIndex returns the raft index of the last committed apply batch.
func (s *Store) AppliedIndex() uint64 { return s.e.AppliedIndex() }

// snapshotView opens a snapshot and the revision state it holds.
//
// The state is that of the atomics when no change ran while they were read
// and the snapshot was made (Store.changes): reading mm"state" from the
// snapshot instead cost each Range a memtable seek, 6% of the server's CPU
// under YCSB B. A view must have the snapshot's own revision, not an
// earlier one: a Range at the view's revision reads the current records as
// they are. When a change did run, the snapshot's own record answers.
func (s *Store) snapshotView() (view, engine.Snapshot, error) {
	if before := s.changes.Load(); before%2 == 0 {
		rev, compactRev := s.rev.Load(), s.compactRev.Load()
		snap := s.e.NewSnapshot()
		if s.changes.Load() == before {
			return view{r: snap, rev: rev, compactRev: compactRev}, snap, nil
		}
		return viewOfSnapshot(snap)
	}
	return viewOfSnapshot(s.e.NewSnapshot())
}

// viewOfSnapshot makes the view of snap from the revision state it holds.
func viewOfSnapshot(snap engine.Snapshot) (view, engine.Snapshot, error) {
	st := state{rev: 1, compactRev: -1}
	b, err := snap.Get(metaState)
	if err == nil {
		st, err = decodeState(b)
	} else if errors.Is(err, engine.ErrNotFound) {
		err = nil
	}
	if err != nil {
		_ = snap.Close()
		return view{}, nil, fmt.Errorf("read revision state: %w", err)
	}
	return view{r: snap, rev: st.rev, compactRev: st.compactRev}, snap, nil
}

// Range reads from a consistent engine snapshot; safe from any goroutine
// concurrently with writes. resp.Header.Revision is the current revision.
func (s *Store) Range(r *pb.RangeRequest) (*pb.RangeResponse, error) {
	v, snap, err := s.snapshotView()
	if err != nil {
		return nil, err
	}
	defer snap.Close()
	return v.executeRange(r)
}

// Reader reads the engine the store writes, for the state kept beside
// MVCC's in the same engine batches (the auth store's records); it must
// not be used to read MVCC's own keys, whose layout is this package's.
func (s *Store) Reader() engine.Reader { return s.e }

// Meta returns the value SetMeta stored under name, or nil if none.
func (s *Store) Meta(name string) ([]byte, error) { return ReadMeta(s.e, name) }

// LeaseKeys returns the keys currently attached to lease id, in key order.
func (s *Store) LeaseKeys(id int64) ([][]byte, error) {
	return leaseKeys(s.e, id)
}

func leaseKeys(r engine.Reader, id int64) ([][]byte, error) {
	p := leasePrefix(id)
	upper := prefixEnd(prefixLease)
	if id != -1 { // -1 is the largest id as unsigned bytes
		upper = leasePrefix(id + 1)
	}
	it := r.NewIter(p, upper)
	var keys [][]byte
	for ok := it.First(); ok; ok = it.Next() {
		keys = append(keys, append([]byte(nil), it.Key()[len(p):]...))
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("keys of lease %x: %w", id, err)
	}
	return keys, nil
}

// HashKV returns etcd's hash of the key space at rev (0: current): a
// CRC-32C, in revision order, over every version with revision in
// (compactRev, rev], and over each version at or below compactRev that is
// its key's newest version at or below rev and not a deletion (etcd's
// kvindex.Keep(rev)). The bytes hashed are etcd's (its revision keys and
// marshalled KeyValues). Versions that physical compaction removes never
// count, so members agree whether or not their compaction has run.
//
// Unlike etcd, a key space with no live key at rev is not a special case
// (etcd then hashes every stored version at or below compactRev, which
// depends on whether its compaction has run).
func (s *Store) HashKV(rev int64) (hash uint32, hashRev int64, compactRev int64, err error) {
	v, snap, err := s.snapshotView()
	if err != nil {
		return 0, 0, 0, err
	}
	defer snap.Close()
	compactRev = v.compactRev
	if rev <= 0 {
		rev = v.rev
	}
	if rev > v.rev {
		return 0, 0, compactRev, ErrFutureRev
	}
	if rev < compactRev {
		return 0, 0, compactRev, ErrCompacted
	}
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	h.Write([]byte("key")) // etcd's bucket name starts its hash
	it := snap.NewIter([]byte(prefixRev), revKey(rev+1, 0))
	defer func() {
		if cerr := it.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("hash kv: %w", cerr)
		}
	}()
	var rk [18]byte
	for ok := it.First(); ok; ok = it.Next() {
		main, sub, perr := parseRevKey(it.Key())
		if perr != nil {
			return 0, 0, 0, perr
		}
		tomb, key, perr := parseRevValue(it.Value())
		if perr != nil {
			return 0, 0, 0, perr
		}
		if main <= compactRev {
			if tomb {
				continue
			}
			latest, err := latestAt(snap, key, rev)
			if err != nil {
				return 0, 0, 0, err
			}
			if latest != [2]int64{main, sub} {
				continue
			}
		}
		val, gerr := readVersionBytes(snap, key, main, sub)
		if gerr != nil {
			return 0, 0, 0, fmt.Errorf("hash kv: %w", gerr)
		}
		b := etcdRevBytes(rk[:0], main, sub, tomb)
		h.Write(b)
		h.Write(val)
	}
	return h.Sum32(), rev, compactRev, nil
}

// etcdRevBytes is etcd's bucket key for a revision: 8-byte main, '_', 8-byte
// sub, and a 't' for a tombstone.
func etcdRevBytes(dst []byte, main, sub int64, tomb bool) []byte {
	dst = appendUint64(dst, uint64(main))
	dst = append(dst, '_')
	dst = appendUint64(dst, uint64(sub))
	if tomb {
		dst = append(dst, 't')
	}
	return dst
}

func appendUint64(b []byte, v uint64) []byte {
	return append(b, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// latestAt returns the (main, sub) of key's newest version at or below rev,
// or {0, 0} if none: its moved current record if old enough, else its
// newest history entry at or below rev.
func latestAt(r engine.Reader, key []byte, rev int64) ([2]int64, error) {
	cur, err := (view{r: r}).current(key)
	if err != nil {
		return [2]int64{}, err
	}
	if cur != nil && cur.moved && cur.kv.ModRevision <= rev {
		return [2]int64{cur.kv.ModRevision, cur.sub}, nil
	}
	it := r.NewIter(historySeek(key, rev), historyKeyEnd(key))
	var out [2]int64
	if it.First() {
		var main, sub int64
		if _, main, sub, err = parseHistoryKey(it.Key()); err == nil {
			out = [2]int64{main, sub}
		}
	}
	if cerr := it.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("history of %q: %w", key, cerr)
	}
	return out, err
}
