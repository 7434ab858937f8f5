package pebble

import (
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// openGate is the engine's compaction scheduler: Pebble's own rule (run as
// many compactions as the DB allows without permission, which grows with its
// compaction debt), behind a gate that stays shut until Open has returned.
//
// Why: pebble.Open schedules the compactions the LSM is owed and then, before
// it returns, waits for every running compaction to finish (it scans for
// obsolete files with compactions stopped). After a bulk load and a kill -9,
// L0 holds a backlog, and the first compaction of it kept Open, and with it
// the member's restart, waiting 1.3-2.7 s of the 4.4 s a restart took at
// 300,000 keys (docs/bench/performance.md). With the gate shut, Open
// schedules nothing and returns at once; opening the gate hands the backlog
// to the compactions, which run while the member serves.
//
// Invariants:
//  1. Before open is called, TrySchedule grants nothing.
//  2. running never exceeds what the DB allows without permission at the
//     time of the grant (Pebble's ConcurrencyLimitScheduler's rule).
type openGate struct {
	db pebble.DBForCompaction
	// registered is set by Register, which pebble.Open calls before it may
	// still fail (and then never calls Unregister): the engine ends such a
	// gate with Unregister itself.
	registered bool

	mu      sync.Mutex
	opened  bool // guarded by mu
	running int  // compactions granted and not Done; guarded by mu
	stopped bool // guarded by mu
	// poke wakes the granter; stop ends it.
	poke chan struct{}
	stop chan struct{}
	done chan struct{}
}

var _ pebble.CompactionScheduler = (*openGate)(nil)

func newOpenGate() *openGate {
	return &openGate{poke: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// Register implements pebble.CompactionScheduler.
func (g *openGate) Register(_ int, db pebble.DBForCompaction) {
	g.db = db
	g.registered = true
	go g.granter()
}

// Unregister implements pebble.CompactionScheduler: it ends the granter and
// waits for a grant loop under way.
func (g *openGate) Unregister() {
	if !g.registered {
		return
	}
	g.registered = false
	close(g.stop)
	<-g.done
	g.mu.Lock()
	g.stopped = true
	g.mu.Unlock()
}

// open lets compactions run (invariant 1) and grants the waiting ones.
func (g *openGate) open() {
	g.mu.Lock()
	g.opened = true
	g.mu.Unlock()
	g.wake()
}

// TrySchedule implements pebble.CompactionScheduler.
func (g *openGate) TrySchedule() (bool, pebble.CompactionGrantHandle) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.opened || g.stopped || g.db.GetAllowedWithoutPermission() <= g.running {
		return false, nil
	}
	g.running++
	return true, g
}

// UpdateGetAllowedWithoutPermission implements pebble.CompactionScheduler.
func (g *openGate) UpdateGetAllowedWithoutPermission() { g.wake() }

// Started, MeasureCPU and CumulativeStats implement
// pebble.CompactionGrantHandle; the gate does not account for CPU.
func (g *openGate) Started() {}

// MeasureCPU implements pebble.CompactionGrantHandle.
func (g *openGate) MeasureCPU(pebble.CompactionGoroutineKind) {}

// CumulativeStats implements pebble.CompactionGrantHandle.
func (g *openGate) CumulativeStats(pebble.CompactionGrantHandleStats) {}

// Done implements pebble.CompactionGrantHandle: a compaction ended, so a
// waiting one may run.
func (g *openGate) Done() {
	g.mu.Lock()
	g.running--
	g.mu.Unlock()
	g.wake()
}

func (g *openGate) wake() {
	select {
	case g.poke <- struct{}{}:
	default:
	}
}

// granter grants waiting compactions when woken and every 100 ms, as
// Pebble's own scheduler does: a DB that was refused remembers its pick and
// asks no more, so the scheduler must come back to it.
func (g *openGate) granter() {
	defer close(g.done)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-tick.C:
		case <-g.poke:
		}
		g.grant()
	}
}

// grant schedules waiting compactions up to what the DB allows. It calls
// into the DB without holding mu: the DB's locks come before the
// scheduler's.
func (g *openGate) grant() {
	for {
		g.mu.Lock()
		if !g.opened || g.stopped || g.db.GetAllowedWithoutPermission() <= g.running {
			g.mu.Unlock()
			return
		}
		g.running++
		g.mu.Unlock()
		if waiting, _ := g.db.GetWaitingCompaction(); !waiting || !g.db.Schedule(g) {
			g.mu.Lock()
			g.running--
			g.mu.Unlock()
			return
		}
	}
}
