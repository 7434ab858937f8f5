package apply

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/node"
)

// TestApplyUsesProposedRequest: an entry that holds exactly the bytes a
// request was registered with is applied from the registered request, not
// decoded; an entry whose bytes differ is decoded. The registered request
// here deliberately differs from its bytes, to tell the two apart: the
// proposer never registers such a pair (Waiters.RegisterRequest).
func TestApplyUsesProposedRequest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		entryData func(registered []byte) []byte
		wantValue string
	}{
		{"same bytes: the registered request", func(b []byte) []byte { return b }, "registered"},
		{"other bytes: decoded", func([]byte) []byte {
			b, _ := proto.Marshal(put(7, "k", "decoded"))
			return b
		}, "decoded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, store := openStore(t, vfs.NewMem())
			a, err := New(Config{Store: store})
			if err != nil {
				t.Fatal(err)
			}
			in := make(chan node.Committed, 1)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() { _ = a.Run(ctx, in) }()

			registered, err := proto.Marshal(put(7, "k", "encoded"))
			if err != nil {
				t.Fatal(err)
			}
			resc := a.cfg.Waiters.RegisterRequest(7, put(7, "k", "registered"), registered)
			in <- node.Committed{Entries: []*raftpb.Entry{{Index: proto.Uint64(1), Term: proto.Uint64(1),
				Type: raftpb.EntryNormal.Enum(), Data: tc.entryData(registered)}}}
			select {
			case res := <-resc:
				if res.Err != nil {
					t.Fatal(res.Err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no answer")
			}
			got, err := store.Range(&pb.RangeRequest{Key: []byte("k")})
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Kvs) != 1 || string(got.Kvs[0].Value) != tc.wantValue {
				t.Fatalf("k = %v, want value %q", got.Kvs, tc.wantValue)
			}
		})
	}
}

func TestEncodedRequestID(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  *pb.InternalRaftRequest
	}{
		{"header ID", put(42, "k", "v")},
		{"header ID after a large request", &pb.InternalRaftRequest{Header: &pb.RequestHeader{ID: 1 << 63, Username: "u", AuthRevision: 3},
			Txn: &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k"), Value: make([]byte, 5000)}}}}}}},
		{"ID only", &pb.InternalRaftRequest{ID: 9, Put: &pb.PutRequest{Key: []byte("k")}}},
		{"both: the header's", &pb.InternalRaftRequest{ID: 9, Header: &pb.RequestHeader{ID: 10}}},
		{"header without ID: the ID", &pb.InternalRaftRequest{ID: 9, Header: &pb.RequestHeader{Username: "u"}}},
		{"none", &pb.InternalRaftRequest{Put: &pb.PutRequest{Key: []byte("k")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkEncodedRequestID(t, mustMarshal(t, tc.req))
		})
	}
}

// FuzzEncodedRequestID holds encodedRequestID to requestID of the decoded
// request, for any bytes that decode.
func FuzzEncodedRequestID(f *testing.F) {
	for _, r := range []*pb.InternalRaftRequest{put(42, "k", "v"), {ID: 9}, {ID: 9, Header: &pb.RequestHeader{ID: 10}}} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Add([]byte{0xa2, 0x06, 0x02, 0x08})
	f.Fuzz(func(t *testing.T, data []byte) {
		checkEncodedRequestID(t, data)
	})
}

func checkEncodedRequestID(t *testing.T, data []byte) {
	t.Helper()
	var req pb.InternalRaftRequest
	if err := proto.Unmarshal(data, &req); err != nil {
		return // the applier reports the decode error; the ID does not matter
	}
	if got, want := encodedRequestID(data), requestID(&req); got != want {
		t.Fatalf("encodedRequestID(%x) = %d, requestID of the decoded request = %d", data, got, want)
	}
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
