package pebble

import (
	"sync"
	"time"

	"go.uber.org/zap"
)

// A flush that fails fails again: Pebble retries it at once, in a loop
// without backoff, reporting every attempt as a background error, and a
// memtable that cannot be flushed never is, so a caller waiting for it
// (Flush, Close) would wait for good. The engine takes the first failed
// flush as the end of its durability: from then on Flush returns that
// error at once, and the member stops (node: a failed flush is fatal), as
// etcd stops when its backend cannot commit. The raft log holds every
// entry the engine could not make durable, and replays it after a
// restart on a working disk.

// failFlush records a memtable flush's failure (Pebble's FlushEnd).
func (e *Engine) failFlush(err error) {
	e.flushFailOnce.Do(func() {
		e.flushErr = err
		close(e.flushFailed)
		e.opts.Logger.Error("engine: a memtable flush failed; the engine stops making state durable", zap.Error(err))
	})
}

// failed returns the recorded flush failure, if any.
func (e *Engine) failed() error {
	select {
	case <-e.flushFailed:
		return e.flushErr
	default:
		return nil
	}
}

// isEmptyFlush reports Pebble's answer for a flush that wrote no table
// (errEmptyTable, which it does not export): not a failure.
func isEmptyFlush(err error) bool { return err != nil && err.Error() == "pebble: empty table" }

// backgroundLogEvery is how often a repeated background error is logged.
const backgroundLogEvery = 10 * time.Second

// backgroundLog logs Pebble's background errors, at most once per
// backgroundLogEvery with the count of those not logged: a failing disk
// makes Pebble report one per retry, thousands a second.
type backgroundLog struct {
	logger *zap.Logger

	mu         sync.Mutex
	last       time.Time
	suppressed int
}

func (l *backgroundLog) log(err error) {
	l.mu.Lock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < backgroundLogEvery {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	n := l.suppressed
	l.last, l.suppressed = now, 0
	l.mu.Unlock()
	if l.logger == nil {
		return
	}
	l.logger.Error("engine: background error", zap.Error(err), zap.Int("not-logged-since-last", n))
}
