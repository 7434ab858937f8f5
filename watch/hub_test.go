package watch

import (
	"bytes"
	"context"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.uber.org/zap/zaptest"

	epebble "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/mvcc"
)

// env is a store on an in-memory engine with a running hub; writes go
// through WriteBatch as the applier's do, and Notify the hub after each
// commit.
type env struct {
	t     *testing.T
	store *mvcc.Store
	hub   *Hub
	index uint64
}

func newEnv(t *testing.T, opts Options) *env {
	t.Helper()
	e := newManualEnv(t, opts)
	e.hub.Start()
	return e
}

// newManualEnv is newEnv without the hub goroutine: the test runs the
// hub's passes itself (settle, progressNotify), so the hub's revision
// lags the store's exactly as long as the test wants.
func newManualEnv(t *testing.T, opts Options) *env {
	t.Helper()
	e, err := epebble.Open("db", epebble.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	s, err := mvcc.Open(e, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	h := New(s, opts)
	t.Cleanup(func() {
		h.Close()
		_ = s.Close()
		_ = e.Close()
	})
	return &env{t: t, store: s, hub: h}
}

// settle runs the dispatch and catch-up passes until neither has more
// to do, as the hub goroutine does when notified; for a manual env.
func (e *env) settle() {
	e.t.Helper()
	for {
		moreSynced, err := e.hub.dispatch()
		if err != nil {
			e.t.Fatal(err)
		}
		moreUnsynced, err := e.hub.catchUp()
		if err != nil {
			e.t.Fatal(err)
		}
		if !moreSynced && !moreUnsynced {
			return
		}
	}
}

func (e *env) write(f func(w *mvcc.WriteBatch) error) {
	e.t.Helper()
	w := e.store.Write(nil)
	if err := f(w); err != nil {
		w.Abort()
		e.t.Fatal(err)
	}
	e.index++
	if err := w.Commit(e.index); err != nil {
		e.t.Fatal(err)
	}
	e.hub.Notify()
}

func (e *env) put(key, val string) {
	e.t.Helper()
	e.write(func(w *mvcc.WriteBatch) error {
		_, err := w.Put(&pb.PutRequest{Key: []byte(key), Value: []byte(val)})
		return err
	})
}

func (e *env) del(key string) {
	e.t.Helper()
	e.write(func(w *mvcc.WriteBatch) error {
		_, err := w.DeleteRange(&pb.DeleteRangeRequest{Key: []byte(key)})
		return err
	})
}

func (e *env) compact(rev int64) {
	e.t.Helper()
	e.write(func(w *mvcc.WriteBatch) error {
		_, _, err := w.Compact(&pb.CompactionRequest{Revision: rev})
		return err
	})
}

// next reads one response, failing the test after a bounded wait.
func next(t *testing.T, s *Stream) *pb.WatchResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("next response: %v", err)
	}
	return r.WatchResponse
}

// none checks that nothing more is queued once the hub has dispatched
// everything up to the store's revision.
func none(t *testing.T, e *env, s *Stream) {
	t.Helper()
	waitFor(t, func() bool { return e.hub.Rev() == e.store.Rev() && e.hub.Stats().Unsynced == 0 })
	if n := s.Queued(); n != 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, _ := s.Next(ctx)
		t.Fatalf("%d unexpected responses queued, first: %v", n, r.WatchResponse)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// eventsOf reads responses for watch id until n events arrived.
func eventsOf(t *testing.T, s *Stream, id int64, n int) []*mvccpb.Event {
	t.Helper()
	var evs []*mvccpb.Event
	for len(evs) < n {
		r := next(t, s)
		if r.WatchId != id || r.Created || r.Canceled {
			t.Fatalf("want events of watch %d, got %v", id, r)
		}
		evs = append(evs, r.Events...)
	}
	if len(evs) != n {
		t.Fatalf("want %d events, got %d", n, len(evs))
	}
	return evs
}

func describe(evs []*mvccpb.Event) string {
	var b bytes.Buffer
	for _, ev := range evs {
		fmt.Fprintf(&b, "%s %s@%d", ev.Type, ev.Kv.Key, ev.Kv.ModRevision)
		if ev.Type == mvccpb.PUT {
			fmt.Fprintf(&b, "=%s", ev.Kv.Value)
		}
		if ev.PrevKv != nil {
			fmt.Fprintf(&b, " prev=%s", ev.PrevKv.Value)
		}
		b.WriteString("; ")
	}
	return b.String()
}

func TestWatchRequests(t *testing.T) {
	// History: rev 2 a=1, 3 b=1, 4 a=2, 5 del a, 6 ab=1, 7 c=1.
	history := func(e *env) {
		e.put("a", "1")
		e.put("b", "1")
		e.put("a", "2")
		e.del("a")
		e.put("ab", "1")
		e.put("c", "1")
	}
	tests := []struct {
		name string
		req  Request
		want string
	}{
		{name: "key from start", req: Request{Key: []byte("a"), StartRev: 1},
			want: "PUT a@2=1; PUT a@4=2; DELETE a@5; "},
		{name: "key from middle", req: Request{Key: []byte("a"), StartRev: 4},
			want: "PUT a@4=2; DELETE a@5; "},
		{name: "prefix", req: Request{Key: []byte("a"), End: []byte("b"), StartRev: 2},
			want: "PUT a@2=1; PUT a@4=2; DELETE a@5; PUT ab@6=1; "},
		{name: "from key on", req: Request{Key: []byte("b"), End: []byte{}, StartRev: 2},
			want: "PUT b@3=1; PUT c@7=1; "},
		{name: "prev kv", req: Request{Key: []byte("a"), StartRev: 2, PrevKV: true},
			want: "PUT a@2=1; PUT a@4=2 prev=1; DELETE a@5 prev=2; "},
		{name: "no put", req: Request{Key: []byte("a"), End: []byte("b"), StartRev: 2, NoPut: true},
			want: "DELETE a@5; "},
		{name: "no delete", req: Request{Key: []byte("a"), StartRev: 2, NoDelete: true},
			want: "PUT a@2=1; PUT a@4=2; "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, live := range []bool{false, true} {
				// Past: the history exists before the watch (catch-up from
				// the engine). Live: the watch exists first (synced).
				e := newEnv(t, Options{})
				if !live {
					history(e)
				}
				s := e.hub.NewStream()
				id, err := s.Watch(tc.req)
				if err != nil {
					t.Fatal(err)
				}
				if r := next(t, s); !r.Created || r.WatchId != id {
					t.Fatalf("want created, got %v", r)
				}
				if live {
					history(e)
				}
				n := bytes.Count([]byte(tc.want), []byte(";"))
				if got := describe(eventsOf(t, s, id, n)); got != tc.want {
					t.Errorf("live=%v: events\n got %s\nwant %s", live, got, tc.want)
				}
				none(t, e, s)
			}
		})
	}
}

func TestWatchIDs(t *testing.T) {
	e := newEnv(t, Options{})
	s := e.hub.NewStream()
	for _, tc := range []struct {
		id      int64
		wantID  int64
		wantErr error
	}{
		{id: 0, wantID: 0},
		{id: 0, wantID: 1},
		{id: 7, wantID: 7},
		{id: 7, wantID: -1, wantErr: ErrDuplicateID},
		{id: 2, wantID: 2},
		{id: 0, wantID: 3}, // automatic IDs skip the ones in use
	} {
		got, err := s.Watch(Request{Key: []byte("k"), WatchID: tc.id})
		if got != tc.wantID || err != tc.wantErr {
			t.Fatalf("Watch(id %d) = %d, %v; want %d, %v", tc.id, got, err, tc.wantID, tc.wantErr)
		}
		r := next(t, s)
		if !r.Created || r.WatchId != tc.wantID || r.Canceled != (tc.wantErr != nil) {
			t.Fatalf("created response %v", r)
		}
		if tc.wantErr != nil && r.CancelReason != tc.wantErr.Error() {
			t.Fatalf("cancel reason %q", r.CancelReason)
		}
	}
	if _, err := s.Watch(Request{Key: []byte("b"), End: []byte("a")}); err != ErrEmptyRange {
		t.Fatalf("empty range: %v", err)
	}
	next(t, s)
	// Cancel: a canceled response, then nothing for that watch.
	if !s.Cancel(7) || s.Cancel(7) {
		t.Fatal("cancel 7 twice: want true then false")
	}
	if r := next(t, s); !r.Canceled || r.WatchId != 7 {
		t.Fatalf("canceled response %v", r)
	}
	if _, err := s.Watch(Request{Key: []byte("k"), WatchID: 7}); err != nil {
		t.Fatalf("a canceled ID is free again: %v", err)
	}
	next(t, s)
	e.put("k", "v")
	seen := map[int64]bool{}
	for range 5 { // watches 0, 1, 2, 3 and the new 7
		r := next(t, s)
		seen[r.WatchId] = true
		if len(r.Events) != 1 {
			t.Fatalf("want one event, got %v", r)
		}
	}
	if len(seen) != 5 {
		t.Fatalf("events for watches %v", seen)
	}
	none(t, e, s)
}

func TestWatchCompacted(t *testing.T) {
	e := newEnv(t, Options{})
	for i := range 6 {
		e.put("k", fmt.Sprint(i)) // revs 2..7
	}
	e.compact(5)
	s := e.hub.NewStream()
	id, _ := s.Watch(Request{Key: []byte("k"), StartRev: 3})
	next(t, s)
	r := next(t, s)
	if !r.Canceled || r.CompactRevision != 5 || r.WatchId != id {
		t.Fatalf("want canceled with compact revision 5, got %v", r)
	}
	// At the compact revision itself, etcd still answers.
	id, _ = s.Watch(Request{Key: []byte("k"), StartRev: 5})
	next(t, s)
	if got := describe(eventsOf(t, s, id, 3)); got != "PUT k@5=3; PUT k@6=4; PUT k@7=5; " {
		t.Fatalf("from the compact revision: %s", got)
	}
	none(t, e, s)
}

func TestProgress(t *testing.T) {
	e := newEnv(t, Options{ProgressInterval: 20 * time.Millisecond})
	e.put("x", "1")
	s := e.hub.NewStream()
	s.RequestProgress() // no watcher: etcd sends nothing (progressIfSync)
	none(t, e, s)
	id, _ := s.Watch(Request{Key: []byte("k"), ProgressNotify: true})
	next(t, s)
	e.put("y", "1")
	waitFor(t, func() bool { return e.hub.Rev() == 3 })
	r := next(t, s) // periodic, at the hub's revision
	if r.WatchId != id || len(r.Events) != 0 || r.Header.Revision != 3 {
		t.Fatalf("periodic progress %v", r)
	}
	s.Close()

	// A stream with a watcher catching up answers RequestProgress only
	// once it has caught up, after its events.
	e2 := newEnv(t, Options{QueueLen: 1})
	for i := range 5 {
		e2.put("k", fmt.Sprint(i)) // revs 2..6
	}
	s2 := e2.hub.NewStream()
	id2, _ := s2.Watch(Request{Key: []byte("k"), StartRev: 2})
	s2.RequestProgress()
	next(t, s2)
	n := 0
	for {
		r := next(t, s2)
		if r.WatchId == ProgressWatchID {
			if n != 5 || r.Header.Revision != 6 {
				t.Fatalf("progress after %d events at %d; want 5 at 6", n, r.Header.Revision)
			}
			break
		}
		if r.WatchId != id2 {
			t.Fatalf("unexpected %v", r)
		}
		n += len(r.Events)
	}
}

// TestSlowStreamModel runs random watchers on streams with tiny queues,
// some of which are not read while writes go on, and checks every
// watcher's events against a model: all matching events from its start
// revision, in order, no gaps, no repeats.
func TestSlowStreamModel(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	e := newEnv(t, Options{QueueLen: 2, ScanLimit: 7, Logger: zaptest.NewLogger(t)})
	keys := []string{"a", "ab", "b", "ba", "c"}
	var ws []*watchModel
	var streams []*Stream
	for range 4 {
		streams = append(streams, e.hub.NewStream())
	}
	writes := 0
	write := func() {
		writes++
		k := keys[rng.Intn(len(keys))]
		if rng.Intn(4) == 0 {
			e.del(k)
		} else {
			e.put(k, fmt.Sprint(writes))
		}
	}
	for round := range 40 {
		for range 5 {
			write()
		}
		s := streams[round%len(streams)]
		k := keys[rng.Intn(len(keys))]
		req := Request{Key: []byte(k), StartRev: int64(rng.Intn(int(e.store.Rev()) + 2)), PrevKV: rng.Intn(2) == 0}
		switch rng.Intn(3) {
		case 0:
			req.End = []byte(k + "\xff")
		case 1:
			req.End = []byte{}
		}
		id, err := s.Watch(req)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, &watchModel{s: s, id: id, req: req})
		// Streams 0 and 1 are read as we go, the others only at the end.
		for _, rs := range streams[:2] {
			for rs.Queued() > 0 {
				collect(t, rs, ws)
			}
		}
	}
	waitFor(t, func() bool { return e.hub.Rev() == e.store.Rev() })
	// Drain everything: the stalled streams catch up from the engine.
	deadline := time.Now().Add(20 * time.Second)
	for e.hub.Stats().Unsynced > 0 || anyQueued(streams) {
		if time.Now().After(deadline) {
			t.Fatalf("not drained: %+v", e.hub.Stats())
		}
		for _, s := range streams {
			for s.Queued() > 0 {
				collect(t, s, ws)
			}
		}
		time.Sleep(time.Millisecond)
	}
	all, _, err := e.store.Events(1, 0, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range ws {
		var want []*mvccpb.Event
		start := max(m.req.StartRev, 1)
		w := &watcher{key: m.req.Key, end: m.req.End}
		for _, ev := range all {
			if ev.Kv.ModRevision >= start && w.contains(ev.Kv.Key) {
				if !m.req.PrevKV {
					ev = &mvccpb.Event{Type: ev.Type, Kv: ev.Kv}
				}
				want = append(want, ev)
			}
		}
		if m.req.StartRev == 0 {
			continue // its start depends on when it was created; covered elsewhere
		}
		if got, exp := describe(m.got), describe(want); got != exp {
			t.Errorf("watcher %d %+v:\n got %s\nwant %s", i, m.req, got, exp)
		}
	}
}

func anyQueued(ss []*Stream) bool {
	for _, s := range ss {
		if s.Queued() > 0 {
			return true
		}
	}
	return false
}

// watchModel is one watcher of TestSlowStreamModel and what it received.
type watchModel struct {
	s   *Stream
	id  int64
	req Request
	got []*mvccpb.Event
}

func collect(t *testing.T, s *Stream, ws []*watchModel) {
	t.Helper()
	r := next(t, s)
	for _, m := range ws {
		if m.s == s && m.id == r.WatchId {
			m.got = append(m.got, r.Events...)
			return
		}
	}
}

func TestGroup(t *testing.T) {
	g := newGroup()
	ws := map[string]*watcher{
		"a":     {key: []byte("a")},
		"a2":    {key: []byte("a")},
		"b":     {key: []byte("b")},
		"[a,c)": {key: []byte("a"), end: []byte("c")},
		"[b,)":  {key: []byte("b"), end: []byte{}},
		"[c,d)": {key: []byte("c"), end: []byte("d")},
	}
	for _, w := range ws {
		g.add(w)
	}
	g.remove(ws["a"])
	g.remove(ws["[a,c)"])
	g.add(ws["[a,c)"])
	g.remove(ws["[c,d)"])
	tests := []struct {
		key  string
		want []string
	}{
		{"a", []string{"[a,c)", "a2"}},
		{"b", []string{"[a,c)", "[b,)", "b"}},
		{"bz", []string{"[a,c)", "[b,)"}},
		{"c", []string{"[b,)"}},
		{"", nil},
	}
	for _, tc := range tests {
		var got []string
		g.each([]byte(tc.key), func(w *watcher) {
			for name, x := range ws {
				if x == w {
					got = append(got, name)
				}
			}
		})
		sortStrings(got)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("key %q: got %v, want %v", tc.key, got, tc.want)
		}
	}
	if g.n != 4 {
		t.Fatalf("n = %d, want 4", g.n)
	}
}

func sortStrings(s []string) {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
}

// TestStalledStreamBounded: a stream nobody reads holds at most QueueLen
// event responses however many writes go on; its watcher falls back to
// unsynced and, once the stream is read, catches up from the engine with
// every event once, in order.
func TestStalledStreamBounded(t *testing.T) {
	const queue, writes = 8, 500
	e := newEnv(t, Options{QueueLen: queue, ScanLimit: 50})
	s := e.hub.NewStream()
	id, _ := s.Watch(Request{Key: []byte("k/"), End: []byte("k0"), PrevKV: true})
	next(t, s)
	other := e.hub.NewStream()
	oid, _ := other.Watch(Request{Key: []byte("k/"), End: []byte("k0")})
	next(t, other)
	got := 0
	for i := range writes {
		e.put(fmt.Sprintf("k/%d", i%10), fmt.Sprint(i))
		// The other stream is read as writes go on and keeps up.
		for other.Queued() > 0 {
			r := next(t, other)
			if r.WatchId != oid {
				t.Fatalf("unexpected %v", r)
			}
			got += len(r.Events)
		}
		if n := s.Queued(); n > queue {
			t.Fatalf("stalled stream holds %d responses, bound %d", n, queue)
		}
	}
	waitFor(t, func() bool { return e.hub.Rev() == e.store.Rev() })
	for got < writes {
		got += len(next(t, other).Events)
	}
	if st := e.hub.Stats(); st.Unsynced != 1 {
		t.Fatalf("stats %+v: want the stalled watcher unsynced", st)
	}
	evs := eventsOf(t, s, id, writes)
	for i, ev := range evs {
		if ev.Kv.ModRevision != int64(i+2) || (i >= 10 && ev.PrevKv == nil) {
			t.Fatalf("event %d: %s", i, describe(evs[i:i+1]))
		}
	}
	none(t, e, s)
}

// TestStalledStreamByteBound: with large values the byte bound, not the
// response count, limits what a stalled stream holds.
func TestStalledStreamByteBound(t *testing.T) {
	const valSize, bound = 10 << 10, 64 << 10
	e := newEnv(t, Options{QueueBytes: bound})
	s := e.hub.NewStream()
	id, _ := s.Watch(Request{Key: []byte("k")})
	next(t, s)
	val := string(bytes.Repeat([]byte("v"), valSize))
	for range 100 {
		e.put("k", val)
		waitFor(t, func() bool { return e.hub.Rev() == e.store.Rev() })
		s.qmu.Lock()
		b := s.bytes
		s.qmu.Unlock()
		if b > bound+valSize+1 {
			t.Fatalf("stalled stream holds %d bytes, bound %d", b, bound)
		}
	}
	if n := len(eventsOf(t, s, id, 100)); n != 100 {
		t.Fatalf("%d events after catch-up", n)
	}
	none(t, e, s)
}

// TestTotalQueueBound: many stalled streams together hold at most
// TotalQueueBytes (plus one response each); once one drains, the others
// go on.
func TestTotalQueueBound(t *testing.T) {
	const valSize, total, streams = 4 << 10, 32 << 10, 5
	e := newEnv(t, Options{TotalQueueBytes: total})
	var ss []*Stream
	for range streams {
		s := e.hub.NewStream()
		s.Watch(Request{Key: []byte("k")})
		next(t, s)
		ss = append(ss, s)
	}
	val := string(bytes.Repeat([]byte("v"), valSize))
	for range 40 {
		e.put("k", val)
		waitFor(t, func() bool { return e.hub.Rev() == e.store.Rev() })
		if q := e.hub.queued.Load(); q > total+streams*(valSize+1) {
			t.Fatalf("streams hold %d bytes together, bound %d", q, total)
		}
	}
	for _, s := range ss {
		if n := len(eventsOf(t, s, 0, 40)); n != 40 {
			t.Fatalf("%d events", n)
		}
	}
	if q := e.hub.queued.Load(); q != 0 {
		t.Fatalf("%d bytes still counted after every stream drained", q)
	}
}

// TestWatchNegativeStart: etcd refuses a negative start_revision as if it
// were compacted (a created-and-canceled response with watch ID -1, the
// store's revision in the header and etcd's compacted error as the reason,
// no compact_revision); only 0 means "from the next revision". Compacted
// or not, and whatever the range, the answer is the same and no watch is
// created.
func TestWatchNegativeStart(t *testing.T) {
	tests := []struct {
		name    string
		compact bool
		req     Request
	}{
		{name: "minus one", req: Request{Key: []byte("k"), StartRev: -1}},
		{name: "far below", req: Request{Key: []byte("k"), StartRev: -1 << 40}},
		{name: "prefix, chosen id", req: Request{Key: []byte("a"), End: []byte("b"), StartRev: -3, WatchID: 7}},
		{name: "after a compaction", compact: true, req: Request{Key: []byte("k"), StartRev: -1}},
		{name: "empty range too", req: Request{Key: []byte("b"), End: []byte("a"), StartRev: -1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Options{})
			e.put("k", "1")
			e.put("k", "2")
			if tc.compact {
				e.compact(2)
			}
			s := e.hub.NewStream()
			id, err := s.Watch(tc.req)
			if id != -1 || err != ErrNegativeStart {
				t.Fatalf("Watch(start %d) = %d, %v; want -1, %v", tc.req.StartRev, id, err, ErrNegativeStart)
			}
			r := next(t, s)
			want := &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: e.store.Rev()}, WatchId: -1,
				Created: true, Canceled: true, CancelReason: "etcdserver: mvcc: required revision has been compacted"}
			if r.String() != want.String() {
				t.Fatalf("response\n got %v\nwant %v", r, want)
			}
			if st := e.hub.Stats(); st.Synced+st.Unsynced != 0 {
				t.Fatalf("stats %+v: want no watcher", st)
			}
			// The stream goes on: the refused watch took no ID.
			if id, err := s.Watch(Request{Key: []byte("k")}); id != 0 || err != nil {
				t.Fatalf("next watch = %d, %v; want 0, nil", id, err)
			}
			next(t, s)
			e.put("k", "3")
			if got := describe(eventsOf(t, s, 0, 1)); got != "PUT k@4=3; " {
				t.Fatalf("events %s", got)
			}
			none(t, e, s)
		})
	}
}

// TestProgressNotBeforeStart: a progress notification, requested or
// periodic, never speaks for a watch at a revision below its start: a
// client resuming at revision N on a member still catching up (the
// store's revision below N) must not be told it has seen everything up
// to an older revision, which it would take as going back in time (and
// clientv3 would resume from there, getting events again). As etcd's
// progressIfSync, the answer waits until the revision reaches the start
// revision the client asked for; a start of 0 is the next revision and
// holds nothing back.
func TestProgressNotBeforeStart(t *testing.T) {
	tests := []struct {
		name     string
		start    int64
		periodic bool
		want     int64 // the revision of the first progress notification
	}{
		{name: "requested, next revision", start: 0, want: 1},
		{name: "requested, past start", start: 1, want: 1},
		{name: "requested, start at store revision plus one", start: 2, want: 2},
		{name: "requested, start ahead of a catching-up store", start: 5, want: 5},
		{name: "periodic, next revision", start: 0, periodic: true, want: 1},
		{name: "periodic, start at store revision plus one", start: 2, periodic: true, want: 2},
		{name: "periodic, start ahead of a catching-up store", start: 5, periodic: true, want: 5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newManualEnv(t, Options{})
			s := e.hub.NewStream()
			id, err := s.Watch(Request{Key: []byte("k"), StartRev: tc.start, ProgressNotify: tc.periodic})
			if err != nil {
				t.Fatal(err)
			}
			next(t, s)
			wantID := int64(ProgressWatchID)
			if tc.periodic {
				wantID = id
			} else {
				s.RequestProgress() // answered at once, or once it may be
			}
			for {
				e.settle()
				if tc.periodic {
					e.hub.progressNotify()
				}
				if e.hub.Rev() >= tc.want {
					break
				}
				if s.Queued() != 0 {
					t.Fatalf("at revision %d, below the start %d: %v", e.hub.Rev(), tc.start, next(t, s))
				}
				e.put("x", "1")
			}
			r := next(t, s)
			if r.WatchId != wantID || r.Header.Revision != tc.want || len(r.Events) != 0 || r.Created || r.Canceled {
				t.Fatalf("got %v; want a progress notification for watch %d at %d", r, wantID, tc.want)
			}
			if n := s.Queued(); n != 0 {
				t.Fatalf("%d more responses, first %v", n, next(t, s))
			}
		})
	}
}

// TestProgressNotBelowSent: a progress notification never carries a
// revision below that of a response already queued on its stream. Here
// a watch created while the hub lags the store gets a created response
// at the store's revision; another watch of the same stream, synced at
// the hub's lower revision, gets no periodic notification until the hub
// has caught up, and a RequestProgress waits as long.
func TestProgressNotBelowSent(t *testing.T) {
	e := newManualEnv(t, Options{})
	s := e.hub.NewStream()
	a, _ := s.Watch(Request{Key: []byte("a"), ProgressNotify: true})
	next(t, s)
	e.put("x", "1") // store at 2, the hub still at 1
	s.Watch(Request{Key: []byte("b")})
	if r := next(t, s); !r.Created || r.Header.Revision != 2 {
		t.Fatalf("created response %v; want one at the store's revision 2", r)
	}
	e.hub.progressNotify()
	s.RequestProgress()
	if s.Queued() != 0 {
		t.Fatalf("progress at the hub's revision %d after a response at 2: %v", e.hub.Rev(), next(t, s))
	}
	e.settle()
	e.hub.progressNotify()
	for _, wantID := range []int64{ProgressWatchID, a} {
		r := next(t, s)
		if r.WatchId != wantID || r.Header.Revision != 2 || len(r.Events) != 0 {
			t.Fatalf("got %v; want a progress notification for watch %d at 2", r, wantID)
		}
	}
	if n := s.Queued(); n != 0 {
		t.Fatalf("%d more responses, first %v", n, next(t, s))
	}
}

// A watcher sent events since the last periodic tick gets no progress
// notification at the next one, only at the one after, as etcd's sendLoop
// elides the notification after a key update.
func TestPeriodicProgressElidedAfterEvents(t *testing.T) {
	e := newEnv(t, Options{ProgressInterval: time.Hour}) // ticks by hand below
	s := e.hub.NewStream()
	id, _ := s.Watch(Request{Key: []byte("k"), ProgressNotify: true})
	next(t, s) // created
	e.put("k", "1")
	if got := describe(eventsOf(t, s, id, 1)); got != "PUT k@2=1; " {
		t.Fatalf("events %s", got)
	}
	e.hub.progressNotify()
	none(t, e, s)
	e.hub.progressNotify()
	if r := next(t, s); r.WatchId != id || len(r.Events) != 0 || r.Header.Revision != 2 {
		t.Fatalf("progress at the second tick: %v", r)
	}
}
