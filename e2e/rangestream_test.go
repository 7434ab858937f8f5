package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/internal/testutil"
)

// rangeStream runs one RangeStream and returns what a client assembles
// from it (the chunks' keys in order, the final chunk's header, more and
// count, as clientv3.GetStreamToGetResponse does) and how many chunks came.
func rangeStream(ctx context.Context, kv pb.KVClient, r *pb.RangeRequest) (outcome, int) {
	stream, err := kv.RangeStream(ctx, proto.Clone(r).(*pb.RangeRequest))
	if err != nil {
		return outcome{err: err}, 0
	}
	all := &pb.RangeResponse{}
	chunks := 0
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return outcome{resp: all}, chunks
		}
		if err != nil {
			return outcome{err: err}, chunks
		}
		chunks++
		rr := resp.GetRangeResponse()
		all.Kvs = append(all.Kvs, rr.GetKvs()...)
		if rr.GetHeader() != nil {
			all.Header, all.More, all.Count = rr.Header, rr.More, rr.Count
		}
	}
}

// TestRangeStreamLikeEtcd: etcd 3.7's RangeStream (what Kubernetes' LIST
// uses) answers as etcd's does, request by request: the same keys, the
// header and count on the final chunk, the same refusals; a large range
// comes in several chunks, so that neither side holds it whole; and with
// auth on, a range the user may not read is refused (strata served it:
// the stream's request was not checked).
func TestRangeStreamLikeEtcd(t *testing.T) {
	const keys = 3000
	value := strings.Repeat("v", 1024)
	results := map[flavor][]outcome{}
	chunkCounts := map[flavor]int{}
	var names []string
	for _, f := range flavors {
		p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, f), Flags: []string{"--bcrypt-cost=4"}})
		cli := p.Client(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for i := range keys {
			if _, err := cli.Put(ctx, fmt.Sprintf("k%04d", i), value); err != nil {
				t.Fatal(err)
			}
		}
		mid, err := cli.Put(ctx, "k0007", "changed")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Delete(ctx, "k0008"); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Compact(ctx, 100); err != nil {
			t.Fatal(err)
		}
		kv := pb.NewKVClient(cli.ActiveConnection())
		cases := []struct {
			name string
			r    *pb.RangeRequest
		}{
			{"whole range", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l")}},
			{"limit 5", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), Limit: 5}},
			{"limit 2500", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), Limit: 2500}},
			{"count only", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), CountOnly: true}},
			{"keys only", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), KeysOnly: true, Limit: 50}},
			{"from key", &pb.RangeRequest{Key: []byte("k2990"), RangeEnd: []byte{0}}},
			{"at an older revision", &pb.RangeRequest{Key: []byte("k0000"), RangeEnd: []byte("k0020"), Revision: mid.Header.Revision - 1}},
			{"one key", &pb.RangeRequest{Key: []byte("k0007")}},
			{"missing key", &pb.RangeRequest{Key: []byte("k0008")}},
			{"serializable", &pb.RangeRequest{Key: []byte("k0100"), RangeEnd: []byte("k0200"), Serializable: true}},
			{"sorted descending", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), SortOrder: pb.RangeRequest_DESCEND}},
			{"sorted by value", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), SortTarget: pb.RangeRequest_VALUE, SortOrder: pb.RangeRequest_ASCEND}},
			{"revision filter", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), MinModRevision: 5}},
			{"compacted revision", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), Revision: 50}},
			{"future revision", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), Revision: 1 << 40}},
			{"empty key", &pb.RangeRequest{}},
		}
		names = names[:0]
		for _, c := range cases {
			o, chunks := rangeStream(ctx, kv, c.r)
			if o.resp != nil {
				normalizeHeaders(o.resp.ProtoReflect())
			}
			if c.name == "whole range" {
				chunkCounts[f] = chunks
			}
			names = append(names, c.name)
			results[f] = append(results[f], o)
		}

		// Auth: a range outside the user's permissions is refused.
		setupAuth(t, cli)
		alice, err := clientv3.New(clientv3.Config{Endpoints: []string{p.Endpoint()}, Username: "alice", Password: "apw",
			DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		defer alice.Close()
		akv := pb.NewKVClient(alice.ActiveConnection())
		if _, err := alice.Get(ctx, "foo/"); err != nil { // logs in
			t.Fatal(err)
		}
		names = append(names, "auth: outside the user's permissions", "auth: inside")
		for _, r := range []*pb.RangeRequest{{Key: []byte("k"), RangeEnd: []byte("l")}, {Key: []byte("foo/"), RangeEnd: []byte("foo0")}} {
			o, _ := rangeStream(ctx, akv, r)
			if o.resp != nil {
				normalizeHeaders(o.resp.ProtoReflect())
			}
			results[f] = append(results[f], o)
		}
	}
	for i, name := range names {
		if got, want := results[strata][i], results[etcd][i]; !sameOutcome(got, want) {
			t.Errorf("%s: strata and etcd differ:\n%s", name, lineDiff(summarize(want), summarize(got)))
		}
	}
	if got := results[strata][len(names)-2]; !errors.Is(rpctypes.Error(got.err), rpctypes.ErrPermissionDenied) {
		t.Errorf("auth: a range outside alice's permissions: %s", summarize(got))
	}
	// 3 MB of values: etcd sends them in many chunks, and so must strata.
	if chunkCounts[strata] < 2 || chunkCounts[etcd] < 2 {
		t.Errorf("whole range of %d KiB came in %d chunks from strata, %d from etcd; want several from both",
			keys, chunkCounts[strata], chunkCounts[etcd])
	}
}

// summarize prints an outcome short enough to read when it holds
// thousands of keys: the error, or the header, count, more and the keys
// with their revisions and value sizes.
func summarize(o outcome) string {
	r, ok := o.resp.(*pb.RangeResponse)
	if o.err != nil || !ok {
		return render(o)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "header %v count %d more %v, %d keys\n", r.GetHeader(), r.Count, r.More, len(r.Kvs))
	for i, kv := range r.Kvs {
		if i == 5 && len(r.Kvs) > 10 {
			fmt.Fprintf(&b, "...\n")
		}
		if i >= 5 && i < len(r.Kvs)-5 {
			continue
		}
		fmt.Fprintf(&b, "%q create %d mod %d version %d lease %d value %d bytes\n", kv.Key, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease, len(kv.Value))
	}
	return b.String()
}
