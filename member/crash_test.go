package member

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/strata-kv/strata/raftlog"
	"github.com/strata-kv/strata/server"
)

// startOn starts a one-member cluster whose every file lives on fs.
func startOn(t *testing.T, fs vfs.FS) *Member {
	t.Helper()
	return startInMemory(t, fs, "crash", func(cfg *Config) {
		// Small, so that engine flushes and log compactions happen
		// during the test and crashes land around them too.
		cfg.SnapshotCount = 50
	})
}

// startInMemory starts a one-member cluster named name whose every file
// lives on fs (a power-cut test's file system), with short raft timings,
// after adjust has changed its configuration, and waits until it serves.
func startInMemory(t *testing.T, fs vfs.FS, name string, adjust func(*Config)) *Member {
	t.Helper()
	cfg := Config{
		Name:                    name,
		DataDir:                 "/data",
		FS:                      fs,
		ListenClientURLs:        []string{"http://127.0.0.1:0"},
		AdvertiseClientURLs:     []string{"http://127.0.0.1:0"},
		ListenPeerURLs:          []string{"http://127.0.0.1:0"},
		AdvertisePeerURLs:       []string{"http://127.0.0.1:2380"},
		InitialCluster:          map[string][]string{name: {"http://127.0.0.1:2380"}},
		InitialClusterState:     "new",
		InitialClusterToken:     name + "-test",
		AutoCompactionMode:      "periodic",
		AutoCompactionRetention: "0",
		Client:                  server.ClientOptions{Limits: server.Limits{MaxRequestBytes: 1 << 20, MaxTxnOps: 128}},
		CatchUpEntries:          10,
		HeartbeatInterval:       10 * time.Millisecond,
		ElectionTimeout:         100 * time.Millisecond,
	}
	adjust(&cfg)
	m, err := Start(cfg)
	if err != nil {
		t.Fatalf("start member: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := m.WaitReady(ctx); err != nil {
		t.Fatalf("member not ready: %v", err)
	}
	return m
}

type acked struct {
	value string
	rev   int64
}

// TestPowerCutLosesNoAcknowledgedWrite runs a member on a file system that
// can be "power-cut": CrashClone keeps only what was synced (plus, in some
// rounds, a random part of what was not). Writers put keys concurrently; at
// a random instant the file system is cloned, and a member started on the
// clone must hold every put acknowledged before the instant, with the
// revision it was acknowledged with, and a revision that never went back.
// This is the test kill -9 cannot be: the page cache does not survive it.
func TestPowerCutLosesNoAcknowledgedWrite(t *testing.T) {
	fs := vfs.NewCrashableMem()
	rng := rand.New(rand.NewPCG(1, 2))
	var lastRev int64
	for round := 0; round < 4; round++ {
		m := startOn(t, fs)
		if rev := m.Store().Rev(); rev < lastRev {
			t.Fatalf("round %d: revision went back from %d to %d", round, lastRev, rev)
		}
		var mu sync.Mutex
		acks := map[string]acked{}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					key := fmt.Sprintf("w%d/k%d", w, i%40)
					val := fmt.Sprintf("r%d-%d", round, i)
					res, err := m.Propose(ctx, &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(key), Value: []byte(val)}})
					if err != nil || res.Err != nil {
						continue
					}
					mu.Lock()
					acks[key] = acked{value: val, rev: res.Response.(*pb.PutResponse).Header.Revision}
					mu.Unlock()
				}
			}()
		}
		time.Sleep(time.Duration(50+rng.IntN(200)) * time.Millisecond)
		// On a loaded machine (or under -race) the writers may not have
		// been acknowledged yet: let a few acknowledgements in first.
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			n := len(acks)
			mu.Unlock()
			if n >= 5 {
				break
			}
		}
		// The instant of the power cut: what was acknowledged until now
		// must survive.
		mu.Lock()
		want := make(map[string]acked, len(acks))
		for k, v := range acks {
			want[k] = v
		}
		cfg := vfs.CrashCloneCfg{}
		if round%2 == 1 {
			cfg = vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rng}
		}
		clone := fs.CrashClone(cfg)
		mu.Unlock()
		cancel()
		wg.Wait()
		if err := m.Stop(); err != nil {
			t.Fatalf("stop: %v", err)
		}
		if len(want) == 0 {
			t.Fatalf("round %d: nothing acknowledged before the crash", round)
		}

		fs = clone
		m = startOn(t, fs)
		for key, a := range want {
			resp, err := m.Store().Range(&pb.RangeRequest{Key: []byte(key), Revision: a.rev})
			if err != nil {
				last, _ := m.log.LastIndex()
				first, _ := m.log.FirstIndex()
				segs, ierr := raftlog.Inspect(fs, []string{"/data/log"})
				ls, _ := fs.List("/data/log")
				t.Fatalf("round %d: read %s at %d: %v (log [%d, %d], applied %d, revision %d) segments %+v %v files %v", round, key, a.rev, err, first, last, m.applier.AppliedIndex(), m.Store().Rev(), segs, ierr, ls)
			}
			if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != a.value || resp.Kvs[0].ModRevision != a.rev {
				t.Fatalf("round %d: %s at revision %d = %v, want %q written at %d", round, key, a.rev, resp.Kvs, a.value, a.rev)
			}
		}
		lastRev = m.Store().Rev()
		t.Logf("round %d: %d keys acknowledged before the cut, all present; revision %d", round, len(want), lastRev)
		if err := m.Stop(); err != nil {
			t.Fatalf("stop after check: %v", err)
		}
	}
}
