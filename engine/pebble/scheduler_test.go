package pebble

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// fakeDB is a DBForCompaction with a queue of waiting compactions.
type fakeDB struct {
	mu        sync.Mutex
	allowed   int
	waiting   int
	scheduled int
}

func (d *fakeDB) GetAllowedWithoutPermission() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.allowed
}

func (d *fakeDB) GetWaitingCompaction() (bool, pebble.WaitingCompaction) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waiting > 0, pebble.WaitingCompaction{}
}

func (d *fakeDB) Schedule(pebble.CompactionGrantHandle) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.waiting == 0 {
		return false
	}
	d.waiting--
	d.scheduled++
	return true
}

func (d *fakeDB) counts() (waiting, scheduled int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waiting, d.scheduled
}

// TestOpenGate: nothing is granted before open (invariant 1); open grants
// the waiting compactions up to what the DB allows (invariant 2), and a Done
// lets the next one run.
func TestOpenGate(t *testing.T) {
	db := &fakeDB{allowed: 2, waiting: 3}
	g := newOpenGate()
	g.Register(2, db)
	defer g.Unregister()
	if ok, _ := g.TrySchedule(); ok {
		t.Fatal("TrySchedule granted before open")
	}
	time.Sleep(250 * time.Millisecond) // two of the granter's ticks
	if _, scheduled := db.counts(); scheduled != 0 {
		t.Fatalf("%d compactions scheduled before open", scheduled)
	}
	g.open()
	waitFor(t, func() bool { _, s := db.counts(); return s == 2 })
	if ok, _ := g.TrySchedule(); ok {
		t.Fatal("TrySchedule granted a third compaction with two allowed")
	}
	g.Done()
	waitFor(t, func() bool { w, s := db.counts(); return s == 3 && w == 0 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCompactionsRunBehindTheGate: an engine whose L0 fills with flushed
// tables compacts them (the gate opened when Open returned), and a reopen
// with an L0 backlog finds every key.
func TestCompactionsRunBehindTheGate(t *testing.T) {
	fs := vfs.NewMem()
	e := openMem(t, fs, Options{})
	const tables = 20
	for i := range tables {
		b := e.NewBatch()
		for k := range 100 {
			_ = b.Set(fmt.Appendf(nil, "k%03d-%03d", k, i), []byte("v"))
		}
		if err := b.Commit(uint64(i + 1)); err != nil {
			t.Fatal(err)
		}
		if err := e.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { return e.db.Metrics().Compact.Count > 0 })
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = openMem(t, fs, Options{})
	defer e.Close()
	if got := len(scan(t, e)); got != tables*100 {
		t.Fatalf("%d keys after reopen, want %d", got, tables*100)
	}
}
