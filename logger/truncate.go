package logger

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/datadir"
)

// Truncate, seed 003's truncate(instance): a member asks the logger to drop
// the entries up to an index its durable state has passed; the logger trims
// only up to the lowest index asked by more than half of the cluster's
// voters, never before (docs/logger.md, "Truncate").
//
// Each voter's highest request is kept in truncations.json (written
// atomically before the answer), so a restart recomputes the same point;
// the learner goroutine does the truncation (raftlog.Log.Compact, which
// only it may call), up to the point and never past its commit index.

const truncationsFile = "truncations.json"

// Truncation is one member's request: drop the entries <= Index.
type Truncation struct {
	MemberID uint64 `json:"member_id"`
	Index    uint64 `json:"index"`
}

// truncationPoint returns the index up to which the log may be truncated:
// the highest index that more than half of the voters asked for, or at
// least (with voters 3 and requests 50, 40, 90: 50). 0: none yet.
func truncationPoint(requests map[uint64]uint64, voters []uint64) uint64 {
	if len(voters) == 0 {
		return 0
	}
	var asked []uint64
	for _, v := range voters {
		if idx, ok := requests[v]; ok {
			asked = append(asked, idx)
		}
	}
	quorum := len(voters)/2 + 1
	if len(asked) < quorum {
		return 0
	}
	slices.Sort(asked)
	slices.Reverse(asked)
	return asked[quorum-1]
}

func readTruncations(fs vfs.FS, dir string) (map[uint64]uint64, error) {
	out := map[uint64]uint64{}
	raw, err := readFile(fs, filepath.Join(dir, truncationsFile))
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	var byHex map[string]uint64
	if err := json.Unmarshal(raw, &byHex); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Join(dir, truncationsFile), err)
	}
	for k, v := range byHex {
		id, err := strconv.ParseUint(k, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: member ID %q: %w", filepath.Join(dir, truncationsFile), k, err)
		}
		out[id] = v
	}
	return out, nil
}

func writeTruncations(fs vfs.FS, dir string, requests map[uint64]uint64) error {
	byHex := make(map[string]uint64, len(requests))
	for id, idx := range requests {
		byHex[strconv.FormatUint(id, 16)] = idx
	}
	raw, err := json.MarshalIndent(byHex, "", "  ")
	if err != nil {
		return err
	}
	return datadir.WriteFileAtomic(fs, filepath.Join(dir, truncationsFile), append(raw, '\n'))
}

// voters returns the cluster's voters as the learner knows them, sorted.
func (l *learner) voters() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]uint64, 0, len(l.mu.voters))
	for v := range l.mu.voters {
		out = append(out, v)
	}
	slices.Sort(out)
	return out
}

func (l *learner) setVoter(id uint64, voter bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if voter {
		l.mu.voters[id] = true
	} else {
		delete(l.mu.voters, id)
	}
}

// requestTrim raises the truncation point and wakes the learner.
func (l *learner) requestTrim(point uint64) {
	for {
		old := l.trimTo.Load()
		if point <= old || l.trimTo.CompareAndSwap(old, point) {
			break
		}
	}
	select {
	case l.trimc <- struct{}{}:
	default:
	}
}

// trim truncates the log up to the truncation point, but not past the
// commit index (the entries must stay until they are committed and held)
// nor past the last committed entry raft handed over.
//
// REQUIRES: called from run (the only writer of the log).
func (l *learner) trim() error {
	target := min(l.trimTo.Load(), l.commit.Load(), l.delivered)
	if target <= l.trimmedTo {
		return nil
	}
	first, err := l.cfg.Log.FirstIndex()
	if err != nil {
		return nil
	}
	if target < first {
		// Compacted batches at or below the target go (log compaction
		// moved the snapshot point past it); Compact drops them before it
		// finds the target at or below the snapshot point.
		cr, ok := l.cfg.Log.(compactedLog)
		if !ok {
			return nil
		}
		if cf, _, n := cr.CompactedRange(); n == 0 || target < cf {
			return nil
		}
	}
	if err := l.cfg.Log.Compact(target, nil); errors.Is(err, raft.ErrCompacted) {
		// The batches at or below target are gone; a batch holding target
		// stays, with the entries after target it stands for.
	} else if err != nil {
		return fmt.Errorf("truncate the raft log of cluster %x up to %d: %w", l.cfg.Record.ClusterID, target, err)
	}
	l.trimmedTo = target
	l.truncations.Add(1)
	l.lg.Info("truncated the log at the voters' request", zap.Uint64("up-to", target))
	return nil
}
