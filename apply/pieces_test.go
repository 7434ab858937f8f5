package apply

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/node"
)

// sized is an entry at index with n bytes of data.
func sized(index uint64, n int) *raftpb.Entry {
	return &raftpb.Entry{Index: proto.Uint64(index), Data: make([]byte, n)}
}

// indexes lists each run's entry indexes, batch by batch: "1,2|3" is a run
// of two batches, the first holding entries 1 and 2.
func indexes(runs [][]node.Committed) []string {
	var out []string
	for _, run := range runs {
		var bs []string
		for _, c := range run {
			var is []string
			for _, e := range c.Entries {
				is = append(is, fmt.Sprint(e.GetIndex()))
			}
			bs = append(bs, strings.Join(is, ","))
		}
		out = append(out, strings.Join(bs, "|"))
	}
	return out
}

func TestPieces(t *testing.T) {
	cs := map[uint64]*raftpb.ConfState{2: {Voters: []uint64{1}}}
	for _, tc := range []struct {
		name    string
		batches []node.Committed
		want    []string
	}{
		{
			name:    "under the bound: one run, as given",
			batches: []node.Committed{{Entries: []*raftpb.Entry{sized(1, 30), sized(2, 30)}}, {Entries: []*raftpb.Entry{sized(3, 39)}}},
			want:    []string{"1,2|3"},
		},
		{
			name:    "one large batch is cut after the entry that reaches the bound",
			batches: []node.Committed{{Entries: []*raftpb.Entry{sized(1, 60), sized(2, 40), sized(3, 10), sized(4, 100), sized(5, 1)}}},
			want:    []string{"1,2", "3,4", "5"},
		},
		{
			name:    "a cut inside the second batch",
			batches: []node.Committed{{Entries: []*raftpb.Entry{sized(1, 60)}}, {Entries: []*raftpb.Entry{sized(2, 50), sized(3, 10)}}},
			want:    []string{"1|2", "3"},
		},
		{
			name:    "a cut at a batch's end leaves no empty batch",
			batches: []node.Committed{{Entries: []*raftpb.Entry{sized(1, 100)}}, {Entries: []*raftpb.Entry{sized(2, 1)}}},
			want:    []string{"1", "2"},
		},
		{
			name:    "empty entries (a leader's) ride along",
			batches: []node.Committed{{Entries: []*raftpb.Entry{sized(1, 0), sized(2, 120), sized(3, 0)}, ConfStates: cs}},
			want:    []string{"1,2", "3"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := pieces(tc.batches, 100)
			if got := indexes(runs); strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("runs %q, want %q", got, tc.want)
			}
			for _, run := range runs {
				for _, c := range run {
					if len(c.Entries) == 0 {
						t.Fatalf("a run holds a batch without entries")
					}
					if c.ConfStates == nil && tc.batches[0].ConfStates != nil {
						t.Fatalf("a piece lost its batch's conf states")
					}
				}
			}
		})
	}
}

// A committed batch larger than maxBatchBytes (a start-up replay hands the
// applier many) is applied in several engine batches, each committed and
// reported in order, and every waiting client is answered.
func TestApplyLargeBatchInPieces(t *testing.T) {
	_, store := openStore(t, vfs.NewMem())
	commits := &commitLog{}
	a, err := New(Config{Store: store, Progress: commits})
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	value := strings.Repeat("v", maxBatchBytes/3)
	var entries []*raftpb.Entry
	var waits []<-chan Result
	for i := uint64(1); i <= n; i++ {
		entries = append(entries, normal(t, i, put(100+i, fmt.Sprintf("k%d", i), value)))
		waits = append(waits, a.cfg.Waiters.Register(100+i))
	}
	in := make(chan node.Committed, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, in) }()
	in <- node.Committed{Entries: entries}
	for i, w := range waits {
		select {
		case res := <-w:
			if res.Err != nil {
				t.Fatalf("put %d: %v", i+1, res.Err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("put %d: no answer", i+1)
		}
	}
	// Progress is reported after the answers: wait for the last report.
	got := commits.indexes()
	for deadline := time.Now().Add(5 * time.Second); len(got) == 0 || got[len(got)-1] != n; got = commits.indexes() {
		if time.Now().After(deadline) {
			t.Fatalf("commits at %v, want the last at %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
	if len(got) < 2 {
		t.Fatalf("commits at %v: the batch of %d bytes was applied in one engine batch", got, entryBytes(entries))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	resp, err := store.Range(&pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l")})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != n || resp.Header.Revision != n+1 {
		t.Fatalf("%d keys at revision %d, want %d at %d", len(resp.Kvs), resp.Header.Revision, n, n+1)
	}
}

// commitLog records every applied index the applier reports, one per
// engine batch committed.
type commitLog struct {
	mu      sync.Mutex
	applied []uint64
}

func (c *commitLog) Applied(index uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.applied = append(c.applied, index)
}

func (c *commitLog) indexes() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]uint64(nil), c.applied...)
}
