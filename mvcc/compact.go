package mvcc

import (
	"fmt"
	"math"
	"time"

	"go.uber.org/zap"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/internal/failpoint"
)

// Start starts the background goroutine that performs physical revision
// compaction, resuming one left unfinished before a restart.
func (s *Store) Start() {
	if s.started {
		return
	}
	s.started = true
	s.stop = make(chan struct{})
	s.stopped = make(chan struct{})
	go s.compactLoop()
	s.wakeCompactor()
}

// Close stops the background goroutines (Start's, StartKeyFilter's) and
// waits for them. It does not close the engine. Call it after the applier
// has stopped: a compaction step waits for an open WriteBatch to finish.
// Channels returned by Compact whose removal has not finished stay open;
// the work resumes after the next Open and Start.
func (s *Store) Close() error {
	if !s.started {
		return nil
	}
	s.started = false
	close(s.stop)
	<-s.stopped
	if s.keysStopped != nil {
		<-s.keysStopped
		s.keysStopped = nil
	}
	return nil
}

func (s *Store) wakeCompactor() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Store) compactLoop() {
	defer close(s.stopped)
	for {
		select {
		case <-s.stop:
			return
		case <-s.kick:
		}
		for {
			select {
			case <-s.stop:
				return
			default:
			}
			more, err := s.compactStep()
			if err != nil {
				// The job stays recorded; a restart retries it.
				s.lg.Error("physical revision compaction failed", zap.Error(err))
				break
			}
			if !more {
				break
			}
			if s.opts.CompactPause > 0 {
				select {
				case <-s.stop:
					return
				case <-time.After(s.opts.CompactPause):
				}
			}
		}
	}
}

// compactStep visits up to CompactChunk revision-index entries after the
// job's progress point and compacts the history of every key they name at
// the job's target, in one engine batch that also records the progress.
// It reports whether work remains.
//
// Why only keys named in the revision index since the last finished
// compaction: a key not written since then still has exactly the versions
// that compaction kept, and its newest version at or below the old target
// is still its newest at or below the new one.
func (s *Store) compactStep() (more bool, err error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	job := s.mu.job
	s.mu.Unlock()
	if !job.pending() {
		s.notifyCompacted(job)
		return false, nil
	}
	b := s.e.NewBatch()
	defer b.Close()

	it := b.NewIter(after(job.doneMain, job.doneSub), revKey(job.target+1, 0))
	var keys [][]byte
	seen := map[string]bool{}
	n := 0
	exhausted := true
	for ok := it.First(); ok; ok = it.Next() {
		if n == s.opts.CompactChunk {
			exhausted = false
			break
		}
		n++
		main, sub, perr := parseRevKey(it.Key())
		if perr != nil {
			_ = it.Close()
			return false, fmt.Errorf("compact to %d: %w", job.target, perr)
		}
		_, key, perr := parseRevValue(it.Value())
		if perr != nil {
			_ = it.Close()
			return false, fmt.Errorf("compact to %d: %w", job.target, perr)
		}
		job.doneMain, job.doneSub = main, sub
		if !seen[string(key)] {
			seen[string(key)] = true
			keys = append(keys, append([]byte(nil), key...))
		}
	}
	if err := it.Close(); err != nil {
		return false, fmt.Errorf("compact to %d: scan revisions: %w", job.target, err)
	}
	if exhausted {
		job.doneMain, job.doneSub = job.target, math.MaxInt64
	}
	for _, k := range keys {
		if err := compactKey(b, k, job.target); err != nil {
			return false, fmt.Errorf("compact to %d: %w", job.target, err)
		}
	}
	if err := b.Set(metaCompact, job.encode()); err != nil {
		return false, fmt.Errorf("compact to %d: %w", job.target, err)
	}
	failpoint.Hit("mvcc/before-compact-commit")
	// The write lock keeps the applier out, so the applied index is stable.
	if err := b.Commit(s.e.AppliedIndex()); err != nil {
		return false, fmt.Errorf("compact to %d: %w", job.target, err)
	}
	s.mu.Lock()
	// A Compact committed meanwhile is impossible (we hold wmu), so the job
	// target is unchanged and only the progress moved.
	s.mu.job = job
	s.mu.Unlock()
	s.notifyCompacted(job)
	return job.pending(), nil
}

// CompactDone returns a channel closed once physical compaction has
// covered rev (the store must be started, Start, for it to close).
func (s *Store) CompactDone(rev int64) <-chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	s.mu.waiters = append(s.mu.waiters, compactWaiter{rev: rev, done: ch})
	job := s.mu.job
	s.mu.Unlock()
	s.notifyCompacted(job)
	return ch
}

// notifyCompacted closes the channels of compactions that job has covered.
func (s *Store) notifyCompacted(job compactJob) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := s.mu.waiters[:0]
	for _, w := range s.mu.waiters {
		if job.doneMain > w.rev || (job.doneMain == w.rev && job.doneSub == math.MaxInt64) {
			close(w.done)
			continue
		}
		kept = append(kept, w)
	}
	s.mu.waiters = kept
}

// compactKey removes key's versions that revision compaction at target
// supersedes: every version below its newest version at or below target,
// and that newest one too if it is a deletion older than target.
//
// A moved current record at or below target is that newest version, and
// it is not in history: every history entry at or below target goes.
func compactKey(b engine.Batch, key []byte, target int64) error {
	cur, err := (view{r: b}).current(key)
	if err != nil {
		return err
	}
	it := b.NewIter(historySeek(key, target), historyKeyEnd(key))
	type version struct{ main, sub int64 }
	var drop []version
	first := cur == nil || !cur.moved || cur.kv.ModRevision > target
	for ok := it.First(); ok; ok = it.Next() {
		_, main, sub, err := parseHistoryKey(it.Key())
		if err != nil {
			_ = it.Close()
			return fmt.Errorf("history of %q: %w", key, err)
		}
		if first {
			first = false
			kv, err := decodeKV(it.Value())
			if err != nil {
				_ = it.Close()
				return fmt.Errorf("history of %q: %w", key, err)
			}
			if kv.ModRevision != 0 || main == target {
				// The newest version at target is kept; a deletion only
				// if it happened at target itself, so that a watch from
				// the compact revision still sees it (as etcd keeps it).
				// The next compaction rescans revision target to drop it.
				continue
			}
		}
		drop = append(drop, version{main, sub})
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("history of %q: %w", key, err)
	}
	for _, v := range drop {
		if err := b.Delete(historyKey(key, v.main, v.sub)); err != nil {
			return fmt.Errorf("drop %q at %d: %w", key, v.main, err)
		}
		if err := b.Delete(revKey(v.main, v.sub)); err != nil {
			return fmt.Errorf("drop %q at %d: %w", key, v.main, err)
		}
	}
	return nil
}
