package member

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/logger"
	"github.com/strata-kv/strata/node"
	"github.com/strata-kv/strata/transport"
)

// loggerFirst is the member's transport.Snapshotter under
// --catch-up-logger: before it takes a raft snapshot's data, it asks the
// logger for the committed entries from this member's commit index to the
// snapshot's index and, if the logger holds them all, hands them to raft
// (node.AppendCommitted) and refuses the snapshot, so that the leader sends
// the entries after it from its log (docs/logger.md, "A running member
// behind"). If the logger does not hold them, or cannot be reached, the
// snapshot is taken as without the flag.
type loggerFirst struct {
	transport.Snapshotter
	node      *node.Node
	endpoint  string
	tls       *tls.Config
	clusterID uint64
	logger    *zap.Logger

	mu     sync.Mutex
	client *logger.Client // dialled at the first snapshot; guarded by mu
}

// catchUpChunkBytes bounds the entries held in memory between the logger's
// stream and one AppendCommitted.
const catchUpChunkBytes = 4 << 20

// catchUpTimeout bounds a whole catch-up before the snapshot is taken
// instead.
const catchUpTimeout = 30 * time.Second

// catchUpStatusTimeout bounds the wait for the logger to hold the
// snapshot's index (awaitLogger).
const catchUpStatusTimeout = 3 * time.Second

// errChunkFull ends one Recover stream once a chunk is full.
var errChunkFull = errors.New("chunk full")

// Receive catches up from the logger to the snapshot's index, refusing
// the snapshot if it did, else takes the snapshot.
func (s *loggerFirst) Receive(m *raftpb.Message, r io.Reader) error {
	index := m.GetSnapshot().GetMetadata().GetIndex()
	ctx, cancel := context.WithTimeout(context.Background(), catchUpTimeout)
	defer cancel()
	entries, last, err := s.catchUp(ctx, index)
	if err != nil || last < index {
		s.logger.Info("taking the leader's snapshot: the logger did not cover it", zap.String("logger", s.endpoint),
			zap.Uint64("snapshot-index", index), zap.Uint64("caught-up-to", last), zap.Error(err))
		return s.Snapshotter.Receive(m, r)
	}
	s.logger.Info("caught up from the logger instead of the leader's snapshot", zap.String("logger", s.endpoint),
		zap.Uint64("snapshot-index", index), zap.Uint64("entries", entries), zap.Uint64("last-index", last))
	return fmt.Errorf("member caught up to index %d from the logger at %s instead of the snapshot at %d", last, s.endpoint, index)
}

// catchUp appends the logger's committed entries until this member's log
// reaches index, chunk by chunk; it returns how many it appended and the
// last index appended.
func (s *loggerFirst) catchUp(ctx context.Context, index uint64) (appended, last uint64, err error) {
	c, err := s.dial()
	if err != nil {
		return 0, 0, err
	}
	if err := s.awaitLogger(ctx, c, index); err != nil {
		return 0, 0, err
	}
	for {
		from, err := s.node.FollowingFrom(ctx)
		if err != nil {
			return appended, last, err
		}
		if from.Commit >= index {
			return appended, from.Commit, nil
		}
		var chunk []*raftpb.Entry
		size := 0
		err = c.Recover(ctx, s.clusterID, from.Commit+1, index, func(es []*raftpb.Entry) error {
			for _, e := range es {
				chunk = append(chunk, e)
				size += len(e.GetData())
			}
			if size >= catchUpChunkBytes {
				return errChunkFull
			}
			return nil
		})
		if err != nil && !errors.Is(err, errChunkFull) {
			return appended, last, err
		}
		if len(chunk) == 0 {
			return appended, last, fmt.Errorf("the logger sent no entries after %d", from.Commit)
		}
		n, err := s.node.AppendCommitted(ctx, from, chunk)
		if err != nil {
			return appended, last, err
		}
		if n == 0 {
			return appended, last, errors.New("the member stopped following the leader it started the catch-up with")
		}
		appended += n - from.Commit
		last = n
	}
}

// awaitLogger waits, at most catchUpStatusTimeout, until the logger holds
// the cluster's log committed up to index. A logger is a learner the
// leader replicates to beside the voters, so it is often a few entries
// behind the snapshot the leader just took; one that does not answer at
// once (down, cut off) must not hold the snapshot back long, as the
// leader's stream waits meanwhile.
func (s *loggerFirst) awaitLogger(ctx context.Context, c *logger.Client, index uint64) error {
	ctx, cancel := context.WithTimeout(ctx, catchUpStatusTimeout)
	defer cancel()
	for {
		sts, err := c.Status(ctx, s.clusterID)
		if err != nil {
			return err
		}
		if len(sts) == 1 && sts[0].CommitIndex >= index {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the logger holds committed entries up to %v, not the snapshot's %d", commitIndexes(sts), index)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *loggerFirst) dial() (*logger.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != nil {
		return s.client, nil
	}
	c, err := logger.DialTLS(s.endpoint, s.tls)
	if err != nil {
		return nil, err
	}
	s.client = c
	return c, nil
}

// close closes the logger client, if one was dialled.
func (s *loggerFirst) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client != nil {
		_ = s.client.Close()
		s.client = nil
	}
}

func commitIndexes(sts []*logger.ClusterStatus) []uint64 {
	var out []uint64
	for _, st := range sts {
		out = append(out, st.CommitIndex)
	}
	return out
}
