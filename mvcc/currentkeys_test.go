package mvcc

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/strata-kv/strata/engine"
	epebble "github.com/strata-kv/strata/engine/pebble"
)

// batchReadCounter counts the reads of current records (mc keys) through
// write batches: the reads the filter of current keys exists to skip.
type batchReadCounter struct {
	engine.Engine
	reads *atomic.Int64
}

func (e batchReadCounter) NewBatch() engine.Batch {
	return countedBatch{Batch: e.Engine.NewBatch(), reads: e.reads}
}

type countedBatch struct {
	engine.Batch
	reads *atomic.Int64
}

func (b countedBatch) Get(key []byte) ([]byte, error) {
	if bytes.HasPrefix(key, []byte(prefixCurrent)) {
		b.reads.Add(1)
	}
	return b.Batch.Get(key)
}

// openCountingStore opens a store on an in-memory Pebble engine whose
// batches count their reads of current records.
func openCountingStore(t *testing.T) (*Store, engine.Engine, *atomic.Int64) {
	t.Helper()
	e, err := epebble.Open("db", epebble.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	reads := &atomic.Int64{}
	s, err := Open(batchReadCounter{Engine: e, reads: reads}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s, e, reads
}

func (c *currentKeys) isValid() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.valid
}

func mustGet(t *testing.T, s *Store, key string) *mvccpb.KeyValue {
	t.Helper()
	resp, err := s.Range(&pb.RangeRequest{Key: []byte(key)})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 {
		t.Fatalf("range %q: %d keys, want 1", key, len(resp.Kvs))
	}
	return resp.Kvs[0]
}

// TestCurrentKeysSkipsReads walks a store through the filter's life: off
// before the build (every put reads), then on (a put of a key the store
// does not hold reads nothing), and checks that each put's version,
// create and mod revisions are etcd's either way.
func TestCurrentKeysSkipsReads(t *testing.T) {
	s, _, reads := openCountingStore(t)
	// rev 2 a, 3 b, 4 d, 5 delete d.
	apply(t, s, mustPut(t, "a", "1"), mustPut(t, "b", "2"), mustPut(t, "d", "3"),
		func(w *WriteBatch) {
			if _, err := w.DeleteRange(&pb.DeleteRangeRequest{Key: []byte("d")}); err != nil {
				t.Fatal(err)
			}
		})

	type step struct {
		name      string
		build     bool // build the filter before the step
		fn        func(w *WriteBatch)
		wantReads int64
		key       string
		want      *mvccpb.KeyValue // the key's version after the step
	}
	for _, st := range []step{
		{name: "filter off: a new key is read", fn: mustPut(t, "n1", "v"), wantReads: 1,
			key: "n1", want: kv("n1", "v", 6, 6, 1)},
		{name: "existing key is read", build: true, fn: mustPut(t, "a", "x"), wantReads: 1,
			key: "a", want: kv("a", "x", 2, 7, 2)},
		{name: "new key is not read", fn: mustPut(t, "n2", "v"), wantReads: 0,
			key: "n2", want: kv("n2", "v", 8, 8, 1)},
		{name: "key deleted before the build is not read", fn: mustPut(t, "d", "again"), wantReads: 0,
			key: "d", want: kv("d", "again", 9, 9, 1)},
		{name: "key put since the build is read", fn: mustPut(t, "n2", "w"), wantReads: 1,
			key: "n2", want: kv("n2", "w", 8, 10, 2)},
		{name: "second put in one batch reads the first", fn: func(w *WriteBatch) {
			mustPut(t, "n3", "1")(w)
			mustPut(t, "n3", "2")(w)
		}, wantReads: 1, key: "n3", want: kv("n3", "2", 11, 12, 2)},
		{name: "txn creating a new key reads nothing", fn: func(w *WriteBatch) {
			resp, err := w.Txn(&pb.TxnRequest{
				Compare: []*pb.Compare{{Key: []byte("n4"), Target: pb.Compare_CREATE,
					Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_CreateRevision{CreateRevision: 0}}},
				Success: []*pb.RequestOp{put("n4", "v")},
			})
			if err != nil || !resp.Succeeded {
				t.Fatalf("txn: %v, %v", resp, err)
			}
		}, wantReads: 0, key: "n4", want: kv("n4", "v", 13, 13, 1)},
	} {
		if st.build {
			if err := s.buildCurrentKeys(nil); err != nil {
				t.Fatal(err)
			}
			if !s.keys.isValid() {
				t.Fatal("filter not valid after a build")
			}
		}
		before := reads.Load()
		apply(t, s, st.fn)
		if got := reads.Load() - before; got != st.wantReads {
			t.Errorf("%s: %d reads of current records, want %d", st.name, got, st.wantReads)
		}
		equalResp(t, st.name, mustGet(t, s, st.key), st.want)
	}
}

// TestCurrentKeysBuildMeetsWrites writes between a build's start and its
// scan, through every writer of current records, and checks that the
// built filter holds every key that has one (invariant 1).
func TestCurrentKeysBuildMeetsWrites(t *testing.T) {
	s, _, _ := openCountingStore(t)
	var keys []string
	for i := range 300 {
		keys = append(keys, fmt.Sprintf("before/%d", i))
	}
	apply(t, s, func(w *WriteBatch) {
		for _, k := range keys {
			mustPut(t, k, "v")(w)
		}
	})

	epoch, snap := s.beginCurrentKeys()
	defer snap.Close()
	// Writes the snapshot does not see: puts, a replayed key state (one by
	// one, and in bulk), and a deletion.
	for i := range 100 {
		keys = append(keys, fmt.Sprintf("after/%d", i))
		apply(t, s, mustPut(t, keys[len(keys)-1], "v"))
	}
	prepare := func(key string) []PreparedKeyState {
		t.Helper()
		main := s.Rev() + 1
		p, err := s.PrepareKeyStates([]KeyChange{{Main: main, Key: []byte(key),
			KV: kv(key, "replayed", main, main, 1)}}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := prepare("replayed/one")
	w := s.Write(nil)
	if err := w.SetPreparedKeyState(&p[0]); err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(s.AppliedIndex() + 1); err != nil {
		t.Fatal(err)
	}
	p = prepare("replayed/bulk")
	if err := s.Write(nil).CommitWithKeyStates(s.AppliedIndex()+1, p, 1); err != nil {
		t.Fatal(err)
	}
	keys = append(keys, "replayed/one", "replayed/bulk")
	apply(t, s, func(w *WriteBatch) {
		if _, err := w.DeleteRange(&pb.DeleteRangeRequest{Key: []byte("before/7")}); err != nil {
			t.Fatal(err)
		}
	})

	built, err := s.scanCurrentKeys(epoch, snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !built || !s.keys.isValid() {
		t.Fatal("filter not valid after its scan")
	}
	for _, k := range keys {
		if !s.keys.mayHold([]byte(k)) {
			t.Errorf("filter misses %q", k)
		}
	}
	passed := 0
	for i := range 1000 {
		if s.keys.mayHold(fmt.Appendf(nil, "absent/%d", i)) {
			passed++
		}
	}
	if passed > 50 {
		t.Errorf("%d of 1000 absent keys pass the filter", passed)
	}
	// The replayed keys' next puts see their versions.
	apply(t, s, mustPut(t, "replayed/one", "x"), mustPut(t, "replayed/bulk", "x"))
	for _, k := range []string{"replayed/one", "replayed/bulk"} {
		if got := mustGet(t, s, k); got.Version != 2 {
			t.Errorf("%q after a put on its replayed state: version %d, want 2", k, got.Version)
		}
	}
}

// TestCurrentKeysReplace checks invariant 2: content installed by Replace
// is never hidden by a filter built before it, whether the build finished
// before the install or was under way during it.
func TestCurrentKeysReplace(t *testing.T) {
	s, e, reads := openCountingStore(t)
	apply(t, s, mustPut(t, "a", "1"))
	if err := s.buildCurrentKeys(nil); err != nil {
		t.Fatal(err)
	}
	inFlight, snap := s.beginCurrentKeys()
	defer snap.Close()

	// The installed content: another store's, holding "z" at version 3.
	other, otherEngine, _ := openCountingStore(t)
	apply(t, other, mustPut(t, "z", "1"), mustPut(t, "z", "2"), mustPut(t, "z", "3"))
	install := func() error {
		b := e.NewBatch()
		it := otherEngine.NewIter(nil, nil)
		for ok := it.First(); ok; ok = it.Next() {
			if bytes.HasPrefix(it.Key(), []byte(prefixCurrent)) || bytes.HasPrefix(it.Key(), []byte("mm")) {
				if err := b.Set(it.Key(), it.Value()); err != nil {
					return err
				}
			}
		}
		if err := it.Close(); err != nil {
			return err
		}
		return b.Commit(e.AppliedIndex() + 1)
	}
	if err := s.Replace(install); err != nil {
		t.Fatal(err)
	}
	built, err := s.scanCurrentKeys(inFlight, snap, nil)
	if err != nil {
		t.Fatal(err)
	}
	if built || s.keys.isValid() {
		t.Fatal("a build begun before Replace turned the filter on")
	}
	before := reads.Load()
	apply(t, s, mustPut(t, "z", "4"))
	if got := reads.Load() - before; got != 1 {
		t.Errorf("put of an installed key with the filter off: %d reads, want 1", got)
	}
	if got := mustGet(t, s, "z"); got.Version != 4 {
		t.Errorf("installed key after a put: version %d, want 4", got.Version)
	}
	if err := s.buildCurrentKeys(nil); err != nil {
		t.Fatal(err)
	}
	if !s.keys.isValid() || !s.keys.mayHold([]byte("z")) {
		t.Fatal("rebuilt filter off, or missing the installed key")
	}
	apply(t, s, mustPut(t, "z", "5"))
	if got := mustGet(t, s, "z"); got.Version != 5 {
		t.Errorf("installed key after the rebuild: version %d, want 5", got.Version)
	}
}

// TestCurrentKeysStartAndClose checks the goroutine StartKeyFilter runs:
// it builds the filter at the first put, rebuilds it after Replace, and
// stops with Close. Start alone builds nothing, nor does StartKeyFilter
// before a put.
func TestCurrentKeysStartAndClose(t *testing.T) {
	s, _, _ := openCountingStore(t)
	apply(t, s, mustPut(t, "a", "1"))
	s.Start()
	s.StartKeyFilter()
	time.Sleep(20 * time.Millisecond)
	if s.keys.isValid() {
		t.Fatal("filter built before a put")
	}
	apply(t, s, mustPut(t, "b", "1"))
	waitValid := func(what string) {
		t.Helper()
		for range 2000 {
			if s.keys.isValid() {
				return
			}
			time.Sleep(time.Millisecond)
		}
		t.Fatalf("%s: filter not built within 2 s", what)
	}
	waitValid("after Start")
	if err := s.Replace(func() error { return nil }); err != nil {
		t.Fatal(err)
	}
	waitValid("after Replace")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
