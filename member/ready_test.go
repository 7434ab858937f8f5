package member

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestRestartAnswersNoOlderState: after a crash, a member's engine is at
// its last flush and raft replays the log's entries after it. A member
// that answered clients during that replay served an older state than the
// one it had acknowledged -- Status and serializable reads with a revision
// below a compaction already acknowledged (issue 10 finding 10). As etcd
// does, a member serves clients only once it has a leader and has applied
// what the cluster had committed when it asked.
func TestRestartAnswersNoOlderState(t *testing.T) {
	fs := vfs.NewCrashableMem()
	noFlush := func(cfg *Config) {
		cfg.SnapshotCount = 1 << 30
		// Small segments: a sync on CrashableMem copies the whole file.
		cfg.LogCompaction.SegmentSize = 256 << 10
	}
	m := startInMemory(t, fs, "ready", noFlush)
	// Generous: -race on a loaded machine is slow, and the test's point is
	// the revision answered, not the time.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// Acknowledged writes, none flushed: all in the log only.
	var mu sync.Mutex
	var acked int64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 250 {
				res, err := m.Propose(ctx, &pb.InternalRaftRequest{Put: &pb.PutRequest{
					Key: []byte(fmt.Sprintf("k%d-%d", w, i)), Value: make([]byte, 100)}})
				if err != nil || res.Err != nil {
					t.Errorf("put: %v %v", err, res.Err)
					return
				}
				mu.Lock()
				acked = max(acked, res.Response.(*pb.PutResponse).Header.Revision)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	clone := fs.CrashClone(vfs.CrashCloneCfg{})
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}

	cfg := m.cfg
	cfg.FS = clone
	m2, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m2.Stop() }()
	conn, err := grpc.NewClient(m2.api.Listeners[0].Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	maint := pb.NewMaintenanceClient(conn)
	kv := pb.NewKVClient(conn)
	// The first answers after the restart.
	st, err := maint.Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("status after restart: %v", err)
	}
	if rev := st.GetHeader().GetRevision(); rev < acked {
		t.Fatalf("status after restart answered revision %d, below the acknowledged %d", rev, acked)
	}
	resp, err := kv.Range(ctx, &pb.RangeRequest{Key: []byte("k0-249"), Serializable: true})
	if err != nil {
		t.Fatal(err)
	}
	if rev := resp.GetHeader().GetRevision(); rev < acked || len(resp.Kvs) != 1 {
		t.Fatalf("serializable read after restart answered revision %d with %d keys, acknowledged %d", rev, len(resp.Kvs), acked)
	}
}
