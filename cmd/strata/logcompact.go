package main

import (
	"flag"
	"fmt"

	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/member"
)

// logCompactionFlags are the flags of log compaction and recovery from
// compacted batches (logcompact.Config; seed 000).
type logCompactionFlags struct {
	enabled     bool
	history     string
	strategy    string
	segmentSize int64
	batch       uint64
}

func (c *logCompactionFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.enabled, "log-compaction", false, "strata: rewrite applied raft log segments as compacted batch files in the background.")
	fs.StringVar(&c.history, "history", "", "strata: 'latest' lets log compaction drop every superseded write, not only those at or below the compact revision; after a restart or an incremental snapshot, reads at the revisions it dropped are refused as compacted (for clients that never read old revisions).")
	fs.Int64Var(&c.segmentSize, "log-segment-size", 0, "strata: size of a raft log segment in bytes, the unit of log compaction unless --log-compaction-batch is set (0: 16 MiB).")
	fs.Uint64Var(&c.batch, "log-compaction-batch", 0, "strata: with --log-compaction, compact every N applied raft entries into one batch file instead of whole sealed segments (0: whole segments).")
	fs.StringVar(&c.strategy, "recovery-strategy", logcompact.RecoveryNaive, "strata: how start-up replays compacted batches: 'naive' (oldest first, batch by batch) or 'descending' (newest first, the minimal set in one batch).")
}

func (c *logCompactionFlags) apply(cfg *member.Config) error {
	lc, err := c.config()
	if err != nil {
		return err
	}
	cfg.LogCompaction = lc
	return nil
}

// config checks the flags and returns their logcompact.Config (members and
// loggers take the same flags).
func (c *logCompactionFlags) config() (logcompact.Config, error) {
	if c.history != "" && c.history != "latest" {
		return logcompact.Config{}, fmt.Errorf("--history: %q is not 'latest'", c.history)
	}
	if c.segmentSize < 0 {
		return logcompact.Config{}, fmt.Errorf("--log-segment-size: %d is negative", c.segmentSize)
	}
	if c.batch > 0 && !c.enabled {
		return logcompact.Config{}, fmt.Errorf("--log-compaction-batch %d: needs --log-compaction", c.batch)
	}
	if c.strategy != logcompact.RecoveryNaive && c.strategy != logcompact.RecoveryDescending {
		return logcompact.Config{}, fmt.Errorf("--recovery-strategy: %q is neither %q nor %q", c.strategy, logcompact.RecoveryNaive, logcompact.RecoveryDescending)
	}
	return logcompact.Config{
		Enabled:          c.enabled,
		HistoryLatest:    c.history == "latest",
		RecoveryStrategy: c.strategy,
		SegmentSize:      c.segmentSize,
		BatchEntries:     c.batch,
	}, nil
}
