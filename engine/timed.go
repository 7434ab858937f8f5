package engine

import "time"

// CommitObserver is told how long each batch commit took
// (etcd_disk_backend_commit_duration_seconds).
type CommitObserver interface {
	ObserveBackendCommit(time.Duration)
}

// WithCommitTimer returns e whose batches report the duration of every
// commit to o. Reads and everything else pass straight to e.
func WithCommitTimer(e Engine, o CommitObserver) Engine {
	return &timedEngine{Engine: e, observer: o}
}

type timedEngine struct {
	Engine
	observer CommitObserver
}

func (e *timedEngine) NewBatch() Batch {
	return &timedBatch{Batch: e.Engine.NewBatch(), observer: e.observer}
}

type timedBatch struct {
	Batch
	observer CommitObserver
}

func (b *timedBatch) Commit(appliedIndex uint64) error {
	start := time.Now()
	err := b.Batch.Commit(appliedIndex)
	b.observer.ObserveBackendCommit(time.Since(start))
	return err
}

func (b *timedBatch) CommitWith(appliedIndex uint64, tails []WriteOnlyBatch) error {
	start := time.Now()
	err := b.Batch.CommitWith(appliedIndex, tails)
	b.observer.ObserveBackendCommit(time.Since(start))
	return err
}
