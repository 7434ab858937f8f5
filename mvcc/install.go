package mvcc

import (
	"errors"
	"fmt"

	"github.com/strata-kv/strata/engine"
)

// Replace runs install, which replaces the engine's whole content (a raft
// snapshot), while no write batch and no physical compaction step runs, then
// reloads what the store caches from the engine: the current and compact
// revisions and the physical compaction job. Readers see the old state until
// install returns and the new one after. The filter of current keys is off
// from before install until it is built again from the new content.
func (s *Store) Replace(install func() error) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	// Odd until rev and compactRev are the new content's; after a failure
	// it stays odd, and readers take the state from their snapshots.
	s.changes.Add(1)
	s.keys.reset()
	if err := install(); err != nil {
		return err
	}
	st := state{rev: 1, compactRev: -1}
	b, err := s.e.Get(metaState)
	switch {
	case errors.Is(err, engine.ErrNotFound):
	case err != nil:
		return fmt.Errorf("reload mvcc state: %w", err)
	default:
		if st, err = decodeState(b); err != nil {
			return fmt.Errorf("reload mvcc state: %w", err)
		}
	}
	var job compactJob
	b, err = s.e.Get(metaCompact)
	switch {
	case errors.Is(err, engine.ErrNotFound):
	case err != nil:
		return fmt.Errorf("reload mvcc compaction job: %w", err)
	default:
		if job, err = decodeCompactJob(b); err != nil {
			return fmt.Errorf("reload mvcc compaction job: %w", err)
		}
	}
	if err := s.readLayout(); err != nil {
		return fmt.Errorf("reload mvcc state: %w", err)
	}
	s.rev.Store(st.rev)
	s.compactRev.Store(st.compactRev)
	s.changes.Add(1)
	s.mu.Lock()
	s.mu.job = job
	s.mu.Unlock()
	s.wakeCompactor()
	select {
	case s.rebuildKeys <- struct{}{}:
	default:
	}
	return nil
}
