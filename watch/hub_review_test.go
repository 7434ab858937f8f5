package watch

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Tests of cases a review of the hub found (2026-11-30), each failing
// before its fix.

// scanHookSource runs hook once, in the middle of the hub's next engine
// read: what a client does while the hub reads without its lock.
type scanHookSource struct {
	Source
	hook func()
}

func (s *scanHookSource) Events(from, to int64, limit int, prevKV bool) ([]*mvccpb.Event, int64, error) {
	if f := s.hook; f != nil {
		s.hook = nil
		f()
	}
	return s.Source.Events(from, to, limit, prevKV)
}

// TestPrevKVWatcherJoiningDuringScan: a watcher asking for prev_kv that
// joins the synced group while the hub reads events nobody wanted prev_kv
// for must still get them with prev_kv (Kubernetes' watch cache treats a
// DELETE without it as an error). It got PrevKv nil.
func TestPrevKVWatcherJoiningDuringScan(t *testing.T) {
	e := newManualEnv(t, Options{})
	src := &scanHookSource{Source: e.store}
	h := New(src, Options{})
	t.Cleanup(h.Close)
	other := h.NewStream()
	other.Watch(Request{Key: []byte("zzz")}) // keeps the synced group non-empty, without prev_kv
	e.put("k", "11111")                      // rev 2
	e.del("k")                               // rev 3
	var s *Stream
	var id int64
	src.hook = func() {
		s = h.NewStream()
		id, _ = s.Watch(Request{Key: []byte("k"), StartRev: 3, PrevKV: true})
	}
	for {
		more, err := h.dispatch()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.catchUp(); err != nil {
			t.Fatal(err)
		}
		if !more {
			break
		}
	}
	next(t, s) // created
	if got := describe(eventsOf(t, s, id, 1)); got != "DELETE k@3 prev=11111; " {
		t.Fatalf("events of a prev_kv watcher created during the scan: %s, want the delete with its previous value", got)
	}
}

// TestWatchOnClosedStream: a create that reaches a stream after it closed
// (the gRPC receive loop racing the handler's Close) is refused; it stayed
// in the hub's groups forever, matched against every event.
func TestWatchOnClosedStream(t *testing.T) {
	e := newManualEnv(t, Options{})
	s := e.hub.NewStream()
	s.Close()
	if _, err := s.Watch(Request{Key: []byte("k")}); !errors.Is(err, ErrClosed) {
		t.Errorf("watch on a closed stream: %v, want ErrClosed", err)
	}
	if st := e.hub.Stats(); st.Synced != 0 || st.Unsynced != 0 {
		t.Fatalf("watchers left after a watch on a closed stream: %+v", st)
	}
}

// TestCompactionCancelKeepsQueuedEvents: events queued for a watcher
// before compaction cancels it still reach the client, before the
// compacted answer, as etcd sends them down the same channel; they were
// dropped. The canceled watch keeps its ID until the client cancels it,
// as in etcd: the ID is still in use, a cancel is answered, and the
// stream's progress requests are not held back by it.
func TestCompactionCancelKeepsQueuedEvents(t *testing.T) {
	e := newManualEnv(t, Options{QueueBytes: 10})
	s := e.hub.NewStream()
	id, _ := s.Watch(Request{Key: []byte("k"), WatchID: 7})
	e.put("k", "11111") // rev 2: queued
	e.settle()
	e.put("k", "22222") // rev 3: does not fit, the watcher falls behind
	e.settle()
	e.put("k", "3")
	e.put("k", "4")
	e.compact(5)
	e.settle()
	if r := next(t, s); !r.Created {
		t.Fatalf("first response %v, want created", r)
	}
	var got []string
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for len(got) < 2 {
		r, err := s.Next(ctx)
		if err != nil {
			break
		}
		got = append(got, fmt.Sprintf("canceled=%v compact=%d %s", r.Canceled, r.CompactRevision, describe(r.Events)))
		e.settle()
	}
	want := []string{"canceled=false compact=0 PUT k@2=11111; ", "canceled=true compact=5 "}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("responses after the compaction:\n got %q\nwant %q", got, want)
	}
	if _, err := s.Watch(Request{Key: []byte("j"), WatchID: id}); !errors.Is(err, ErrDuplicateID) {
		t.Errorf("reusing the compacted watch's ID: %v, want ErrDuplicateID", err)
	}
	next(t, s) // the refusal
	// A compacted watch is not synced: etcd's progressIfSync answers no
	// progress request for it, and neither does the hub.
	s.RequestProgress()
	none(t, e, s)
	if !s.Cancel(id) {
		t.Fatal("cancel of the compacted watch: unknown ID")
	}
	if r := next(t, s); !r.Canceled || r.WatchId != id {
		t.Fatalf("cancel of the compacted watch answered %v", r)
	}
}

// TestCatchUpNotHeldByFarWatcher: a watcher catching up from far behind
// does not hold back one that needs only the latest revisions: each pass
// was bounded by ScanLimit from the lowest next revision of all, so the
// near one waited for the far one to read the whole history.
func TestCatchUpNotHeldByFarWatcher(t *testing.T) {
	e := newManualEnv(t, Options{ScanLimit: 2})
	for i := range 20 {
		e.put("a", fmt.Sprint(i)) // revs 2..21
	}
	e.settle()
	far := e.hub.NewStream()
	far.Watch(Request{Key: []byte("nomatch"), StartRev: 2})
	near := e.hub.NewStream()
	near.Watch(Request{Key: []byte("a"), StartRev: 21})
	next(t, far)
	next(t, near)
	passes := 0
	for near.Queued() == 0 && passes < 20 {
		if _, err := e.hub.catchUp(); err != nil {
			t.Fatal(err)
		}
		passes++
	}
	if passes > 2 {
		t.Fatalf("the near watcher got its event after %d catch-up passes, want at most 2", passes)
	}
	// The far one still gets through the history.
	for e.hub.Stats().Unsynced > 0 && passes < 40 {
		if _, err := e.hub.catchUp(); err != nil {
			t.Fatal(err)
		}
		passes++
	}
	if st := e.hub.Stats(); st.Unsynced != 0 {
		t.Fatalf("after %d passes: %+v, want every watcher synced", passes, st)
	}
}
