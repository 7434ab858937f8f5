package member

import (
	"context"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/raftlog"
)

// startCompacting starts a member with log compaction of whole segments
// (batch 0) or of runs of batch entries (--log-compaction-batch).
func startCompacting(t *testing.T, fs vfs.FS, strategy string, latest bool, logDirs []string, batch uint64) *Member {
	t.Helper()
	return startInMemory(t, fs, "lc", func(cfg *Config) {
		cfg.LogDirs = logDirs
		// The first segment holds the bootstrap conf change, which log
		// compaction leaves to the engine flush and Compact that this
		// count triggers; later segments are compacted.
		cfg.SnapshotCount = 300
		cfg.LogCompaction = logcompact.Config{Enabled: true, Interval: 10 * time.Millisecond,
			SegmentSize: 16 << 10, RecoveryStrategy: strategy, HistoryLatest: latest, BatchEntries: batch}
	})
}

// TestLogCompactionPowerCut writes with log compaction on, cuts the power
// (only synced data survives: the engine holds what its last flush did,
// the rest is in the log and its compacted batches), and restarts
// on the clone with each recovery strategy: every acknowledged put must be
// there with its revision, and both strategies must reach the same state
// (HashKV) as each other.
// With --history latest, superseded writes are dropped too. The unit of
// log compaction is a segment (batch 0) or a random number of entries.
func TestLogCompactionPowerCut(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	randomBatch := func() uint64 { return 20 + rng.Uint64N(130) }
	for _, tc := range []struct {
		latest bool
		dirs   []string
		batch  uint64
	}{
		{latest: false, dirs: []string{"/data/log"}},
		{latest: true, dirs: []string{"/data/log"}},
		{latest: false, dirs: []string{"/log0", "/log1"}},
		{latest: false, dirs: []string{"/data/log"}, batch: randomBatch()},
		{latest: true, dirs: []string{"/data/log"}, batch: randomBatch()},
		{latest: false, dirs: []string{"/log0", "/log1"}, batch: randomBatch()},
	} {
		t.Run(fmt.Sprintf("latest=%v/dirs=%d/batch=%d", tc.latest, len(tc.dirs), tc.batch), func(t *testing.T) {
			testLogCompactionPowerCut(t, tc.latest, tc.dirs, tc.batch)
		})
	}
}

func testLogCompactionPowerCut(t *testing.T, latest bool, dirs []string, batch uint64) {
	fs := vfs.NewCrashableMem()
	m := startCompacting(t, fs, logcompact.RecoveryNaive, latest, dirs, batch)
	var mu sync.Mutex
	acks := map[string]acked{}
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				key := fmt.Sprintf("w%d/k%d", w, i%25)
				val := fmt.Sprintf("v%d-%d", w, i)
				var req *pb.InternalRaftRequest
				if i%7 == 6 {
					req = &pb.InternalRaftRequest{DeleteRange: &pb.DeleteRangeRequest{Key: []byte(key)}}
				} else {
					req = &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(key), Value: []byte(val)}}
				}
				res, err := m.Propose(ctx, req)
				if err != nil || res.Err != nil {
					t.Errorf("propose: %v %v", err, res.Err)
					return
				}
				mu.Lock()
				if req.Put != nil {
					acks[key] = acked{value: val, rev: res.Response.(*pb.PutResponse).Header.Revision}
				} else {
					delete(acks, key)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// Let the compactor catch up with the applied index. Bounded, but
	// generously: a loaded machine took over 5 s to flush, truncate past
	// the bootstrap segment and compact the next.
	deadline := time.Now().Add(20 * time.Second)
	for {
		// Inspect reads files the member is writing and deleting: a
		// failure may be a torn read, so it only counts at the deadline.
		infos, err := raftlog.Inspect(fs, dirs)
		if err != nil && time.Now().After(deadline) {
			t.Fatal(err)
		}
		batches, commands, records := 0, uint64(0), 0
		for _, in := range infos {
			if in.Compacted {
				if batch > 0 && in.Commands != batch {
					t.Fatalf("batch file %s stands for %d commands, want %d", in.Name, in.Commands, batch)
				}
				batches++
				commands += in.Commands
				records += in.Records
			}
		}
		// With batches of N entries, wait until fewer than N applied
		// entries (beyond the catch-up entries kept for followers) are
		// left in the segments.
		first, _ := m.log.FirstIndex()
		caughtUp := batch == 0 || m.applier.AppliedIndex()+1-first < batch+m.cfg.CatchUpEntries
		if batches >= 1 && caughtUp {
			t.Logf("%d batch files stand for %d commands with %d records", batches, commands, records)
			break
		}
		if caughtUp && (batch > 0 || batches == 0) {
			// The node's log truncation dropped every batch file, or (with
			// whole segments as the unit) every segment before the
			// compactor's next pass reached it, once the engine flushed
			// past them; on a loaded machine that happens often. Write on
			// until there is one.
			key := fmt.Sprintf("more/k%d", time.Now().UnixNano()%50)
			res, err := m.Propose(ctx, &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(key), Value: []byte(key)}})
			if err != nil || res.Err != nil {
				t.Fatalf("propose: %v %v", err, res.Err)
			}
			acks[key] = acked{value: key, rev: res.Response.(*pb.PutResponse).Header.Revision}
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d batch files after the writes", batches)
		}
		time.Sleep(20 * time.Millisecond)
	}
	clone := fs.CrashClone(vfs.CrashCloneCfg{})
	clone2 := clone.CrashClone(vfs.CrashCloneCfg{})
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}

	var hashes []uint32
	for i, strategy := range []string{logcompact.RecoveryNaive, logcompact.RecoveryDescending} {
		fs := []*vfs.MemFS{clone, clone2}[i]
		m := startCompacting(t, fs, strategy, latest, dirs, batch)
		for key, a := range acks {
			resp, err := m.Store().Range(&pb.RangeRequest{Key: []byte(key)})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != a.value || resp.Kvs[0].ModRevision != a.rev {
				t.Fatalf("%s: key %s = %v, want %q at revision %d", strategy, key, resp.Kvs, a.value, a.rev)
			}
		}
		// With --history latest only the current state is kept exactly.
		h, _, _, err := m.Store().HashKV(0)
		if err != nil {
			t.Fatal(err)
		}
		all, err := m.Store().Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}})
		if err != nil {
			t.Fatal(err)
		}
		if latest {
			h = crc32.ChecksumIEEE([]byte(fmt.Sprint(all.Kvs, m.Store().Rev())))
		}
		hashes = append(hashes, h)
		if err := m.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	if hashes[0] != hashes[1] {
		t.Fatalf("state after naive recovery %x, after descending %x", hashes[0], hashes[1])
	}
}
