package member

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	pebbleengine "github.com/strata-kv/strata/engine/pebble"
)

// A member whose engine applied entries but holds no raft conf state (nor
// member list) still starts, leads and serves: raft learns the membership
// from the log's membership entries again (node.raftAppliedIndex) and the
// applier writes it back. Before, raft started with an empty
// configuration that nothing would ever fill: "unpromotable and can not
// campaign", no leader, and every linearizable read timed out.
func TestRestartWithoutConfStateInEngine(t *testing.T) {
	fs := vfs.NewMem()
	m := startOn(t, fs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 5 {
		if _, err := m.Propose(ctx, &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte(fmt.Sprint("k", i)), Value: []byte("v")}}); err != nil {
			t.Fatal(err)
		}
	}
	id := m.MemberID()
	if err := m.Stop(); err != nil { // flushes the engine
		t.Fatal(err)
	}

	// Lose the conf state and the member list, nothing else.
	eng, err := pebbleengine.Open("/data/engine", pebbleengine.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	applied := eng.AppliedIndex()
	b := eng.NewBatch()
	for _, k := range []string{"muraft/confstate", "mucluster/members"} {
		if err := b.Delete([]byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(applied); err != nil {
		t.Fatal(err)
	}
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}

	m = startOn(t, fs) // fails unless the member becomes ready
	defer m.Stop()
	resp, err := m.Store().Range(&pb.RangeRequest{Key: []byte("k4")})
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("k4 after the restart: %v, %v", resp, err)
	}
	if cs := m.applier.ConfState(); cs == nil || len(cs.GetVoters()) != 1 || cs.GetVoters()[0] != id {
		t.Fatalf("conf state after the restart %v, want voters [%x]", cs, id)
	}
	if ms := m.Members(); len(ms) != 1 || ms[0].ID != id {
		t.Fatalf("members after the restart %v, want member %x", ms, id)
	}
	if a := m.applier.AppliedIndex(); a < applied {
		t.Fatalf("applied index %d after the restart, below the engine's %d", a, applied)
	}
}
