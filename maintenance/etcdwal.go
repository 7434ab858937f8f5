package maintenance

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/engines"
	"github.com/strata-kv/strata/etcddb"
	"github.com/strata-kv/strata/lease"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/node"
	"github.com/strata-kv/strata/snapshot"
)

// An etcd member's data directory: the database etcd commits in batches,
// and the WAL that holds every entry the member acknowledged.
func etcdDBPath(dir string) string  { return filepath.Join(dir, "member", "snap", "db") }
func etcdWALPath(dir string) string { return filepath.Join(dir, "member", "wal") }

// checkEtcdDataDir refuses a directory that is not an etcd member's data
// directory before anything is written.
func checkEtcdDataDir(dir string) error {
	if _, err := os.Stat(etcdDBPath(dir)); err != nil {
		return fmt.Errorf("%s is a directory but not an etcd data directory (want member/snap/db and member/wal): %w", dir, err)
	}
	if _, err := os.Stat(etcdWALPath(dir)); err != nil {
		return fmt.Errorf("etcd data directory %s: %w (%v); to restore its database alone, give member/snap/db itself, which loses the writes only its WAL holds",
			dir, etcddb.ErrWALFileNotFound, err)
	}
	return nil
}

// replayChunk bounds the entries the replay hands the applier at once
// (one engine batch).
const replayChunk = 1000

// restoreEtcdDataDir builds eng's content from an etcd member's data
// directory, cfg.Backup: its database, then the committed entries of its
// WAL after the database's consistent index, applied by strata's applier
// as a member applies committed entries (etcd's InternalRaftRequest is
// strata's entry format), so the revisions are those etcd gave. Both
// happen in a staging engine inside the new data directory, committed at
// etcd's indexes; its content then goes into eng through restoreFilter,
// as a strata backup's does (applied index 0, no old membership), and
// the staging engine is removed.
func restoreEtcdDataDir(cfg RestoreConfig, eng engine.Transferable) (applied, records uint64, replay *WALReplay, err error) {
	stageDir := filepath.Join(cfg.DataDir, "etcd-import")
	stage, err := engines.Open(engines.Default, stageDir, engines.Options{FS: cfg.FS, Logger: cfg.Logger.Named("etcd-import")})
	if err != nil {
		return 0, 0, nil, fmt.Errorf("open staging engine: %w", err)
	}
	defer func() {
		if stage != nil {
			_ = stage.Close()
		}
		_ = cfg.FS.RemoveAll(stageDir)
	}()
	var confState *raftpb.ConfState
	ci, _, err := restoreEtcd(cfg, etcdDBPath(cfg.Backup), stage, func(c *etcddb.Contents) uint64 {
		confState = c.ConfState
		return c.ConsistentIndex
	})
	if err != nil {
		return 0, 0, nil, err
	}
	wal, err := etcddb.ReadWAL(etcdWALPath(cfg.Backup), ci)
	if err != nil {
		return 0, 0, nil, err
	}
	commit := wal.HardState.GetCommit()
	replay = &WALReplay{Files: len(wal.Files), ConsistentIndex: ci, Commit: commit, LastIndex: wal.LastIndex, Torn: wal.Torn,
		OneMember: soleVoter(confState, ci, wal)}
	entries := wal.Entries
	if !replay.OneMember {
		for len(entries) > 0 && entries[len(entries)-1].GetIndex() > commit {
			entries = entries[:len(entries)-1]
			replay.PastCommit++
		}
	}
	applied = ci
	if len(entries) > 0 {
		if applied, err = replayEtcdWAL(cfg, stage, ci, entries); err != nil {
			return 0, 0, nil, err
		}
		replay.Entries = applied - ci
	}
	_, records, err = restoreRecords(cfg, eng, exportSource(stage, applied))
	if err != nil {
		return 0, 0, nil, err
	}
	err = stage.Close()
	stage = nil
	if err != nil {
		return 0, 0, nil, fmt.Errorf("close staging engine: %w", err)
	}
	return applied, records, replay, nil
}

// replayEtcdWAL applies entries (after+1 on, in order) to the store on
// eng, which holds applied index after, with an applier that has a lessor
// and the auth store, as backup's point-in-time restore replays an
// archived log. Membership changes apply to nothing a restore keeps (the
// new cluster's membership is its own), and their context is etcd's JSON,
// so they are applied as empty entries. It returns the last index applied.
func replayEtcdWAL(cfg RestoreConfig, eng engine.Transferable, after uint64, entries []*raftpb.Entry) (uint64, error) {
	store, err := mvcc.Open(eng, mvcc.Options{Logger: cfg.Logger.Named("mvcc")})
	if err != nil {
		return 0, fmt.Errorf("open staging store: %w", err)
	}
	store.Start()
	defer store.Close()
	// Lease TTLs do not change keys or revisions; etcd's default timings
	// are as good as any.
	lessor := lease.New(lease.Config{MinTTL: lease.MinTTL(100*time.Millisecond, time.Second), Logger: cfg.Logger.Named("lease")})
	if err := lessor.Load(store); err != nil {
		return 0, err
	}
	authStore, err := auth.Open(auth.Flags{}, eng, cfg.Logger.Named("auth"))
	if err != nil {
		return 0, err
	}
	app, err := apply.New(apply.Config{Store: store, Lessor: lessor, Auth: authStore, Logger: cfg.Logger.Named("apply")})
	if err != nil {
		return 0, err
	}
	if app.AppliedIndex() != after {
		return 0, fmt.Errorf("staging store holds applied index %d, want the database's consistent index %d", app.AppliedIndex(), after)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := make(chan node.Committed)
	runErr := make(chan error, 1)
	go func() { runErr <- app.Run(ctx, in) }()
	stop := func() error {
		cancel()
		if err := <-runErr; err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
	last := after
	for start := 0; start < len(entries); start += replayChunk {
		chunk := make([]*raftpb.Entry, 0, replayChunk)
		for _, e := range entries[start:min(start+replayChunk, len(entries))] {
			if e.GetIndex() != last+1 {
				_ = stop()
				return 0, fmt.Errorf("etcd WAL: %w: entry %d follows entry %d", etcddb.ErrWALSliceOutOfRange, e.GetIndex(), last)
			}
			if t := e.GetType(); t == raftpb.EntryConfChange || t == raftpb.EntryConfChangeV2 {
				e = &raftpb.Entry{Term: e.Term, Index: e.Index, Type: raftpb.EntryNormal.Enum()}
			}
			chunk = append(chunk, e)
			last = e.GetIndex()
		}
		select {
		case in <- node.Committed{Entries: chunk}:
		case err := <-runErr:
			cancel()
			return 0, fmt.Errorf("replay etcd WAL: %w", err)
		}
		if err := app.WaitApplied(ctx, last); err != nil {
			_ = stop()
			return 0, fmt.Errorf("replay etcd WAL up to entry %d: %w", last, err)
		}
	}
	if err := stop(); err != nil {
		return 0, fmt.Errorf("replay etcd WAL: %w", err)
	}
	if err := eng.Flush(); err != nil {
		return 0, fmt.Errorf("flush staging engine: %w", err)
	}
	return last, nil
}

// exportSource gives Restore every key of eng, which must hold applied
// index applied.
func exportSource(eng engine.Transferable, applied uint64) RestoreSource {
	return func(sink snapshot.Sink) (uint64, uint64, error) {
		v, err := eng.NewExportView()
		if err != nil {
			return 0, 0, err
		}
		defer v.Close()
		if v.AppliedIndex() != applied {
			return 0, 0, fmt.Errorf("staging engine holds applied index %d, want %d", v.AppliedIndex(), applied)
		}
		var n uint64
		if err := v.ForEach(func(key, value []byte) error {
			n++
			return sink.Add(key, value)
		}); err != nil {
			return 0, 0, err
		}
		return applied, n, nil
	}
}

// soleVoter reports whether the member that wrote wal was its cluster's
// only voter at the end of its log: then every entry in its log is
// committed (a one-member cluster's leader commits what it has persisted,
// and etcd commits its whole log when it restarts). The voters are the
// database's conf state cs (at index after), changed by the membership
// entries after it; with no conf state in the database (etcd had not yet
// committed one), those of the whole WAL from index 1. A joint
// configuration, or a conf state that cannot be known, answers no: the
// entries past the commit index are then left out.
func soleVoter(cs *raftpb.ConfState, after uint64, wal *etcddb.WAL) bool {
	voters := map[uint64]bool{}
	switch {
	case cs != nil:
		if len(cs.GetVotersOutgoing()) != 0 {
			return false
		}
		for _, v := range cs.GetVoters() {
			voters[v] = true
		}
	case after != 0 || wal.FirstIndex != 1:
		return false
	}
	for _, e := range wal.Entries {
		var changes []*raftpb.ConfChangeSingle
		switch e.GetType() {
		case raftpb.EntryConfChange:
			var cc raftpb.ConfChange
			if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
				return false
			}
			changes = cc.AsV2().GetChanges()
		case raftpb.EntryConfChangeV2:
			var cc raftpb.ConfChangeV2
			if err := proto.Unmarshal(e.GetData(), &cc); err != nil || len(cc.GetChanges()) > 1 {
				return false
			}
			changes = cc.GetChanges()
		default:
			continue
		}
		for _, ch := range changes {
			switch ch.GetType() {
			case raftpb.ConfChangeAddNode:
				voters[ch.GetNodeId()] = true
			case raftpb.ConfChangeAddLearnerNode, raftpb.ConfChangeRemoveNode:
				delete(voters, ch.GetNodeId())
			}
		}
	}
	return len(voters) == 1 && voters[wal.NodeID]
}
