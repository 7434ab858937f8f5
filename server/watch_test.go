package server

import (
	"bytes"
	"fmt"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/watch"
)

func TestCreateRequest(t *testing.T) {
	tests := []struct {
		name string
		in   *pb.WatchCreateRequest
		want watch.Request
	}{
		{"empty key is the smallest key", &pb.WatchCreateRequest{},
			watch.Request{Key: []byte{0}}},
		{"one key", &pb.WatchCreateRequest{Key: []byte("a")},
			watch.Request{Key: []byte("a")}},
		{"range", &pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: []byte("b")},
			watch.Request{Key: []byte("a"), End: []byte("b")}},
		{"from key", &pb.WatchCreateRequest{Key: []byte("a"), RangeEnd: []byte{0}},
			watch.Request{Key: []byte("a"), End: []byte{}}},
		{"options", &pb.WatchCreateRequest{
			Key: []byte("a"), StartRevision: 7, WatchId: 3, PrevKv: true, ProgressNotify: true, Fragment: true,
			Filters: []pb.WatchCreateRequest_FilterType{pb.WatchCreateRequest_NOPUT, pb.WatchCreateRequest_NODELETE},
		}, watch.Request{Key: []byte("a"), StartRev: 7, WatchID: 3, PrevKV: true, ProgressNotify: true,
			Fragment: true, NoPut: true, NoDelete: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := createRequest(tc.in)
			if (got.End == nil) != (tc.want.End == nil) || !bytes.Equal(got.End, tc.want.End) {
				t.Fatalf("end %q (nil %v), want %q (nil %v)", got.End, got.End == nil, tc.want.End, tc.want.End == nil)
			}
			got.End, tc.want.End = nil, nil
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestFragments(t *testing.T) {
	ev := func(size int) *mvccpb.Event {
		return &mvccpb.Event{Kv: &mvccpb.KeyValue{Key: []byte("k"), Value: bytes.Repeat([]byte("v"), size)}}
	}
	resp := func(sizes ...int) *pb.WatchResponse {
		r := &pb.WatchResponse{Header: &pb.ResponseHeader{Revision: 9}, WatchId: 4}
		for _, s := range sizes {
			r.Events = append(r.Events, ev(s))
		}
		return r
	}
	tests := []struct {
		name  string
		resp  *pb.WatchResponse
		limit int
		want  []int // events per part
	}{
		{"no limit", resp(100, 100, 100), 0, []int{3}},
		{"under the limit", resp(10, 10), 1000, []int{2}},
		{"one big event is never split", resp(5000), 1000, []int{1}},
		{"split", resp(400, 400, 400, 400, 400), 1000, []int{2, 2, 1}},
		{"each event alone", resp(2000, 2000, 2000), 1000, []int{1, 1, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parts := fragments(tc.resp, tc.limit)
			var got []int
			total := 0
			for i, p := range parts {
				got = append(got, len(p.Events))
				total += len(p.Events)
				if p.Fragment != (i < len(parts)-1) {
					t.Errorf("part %d: fragment %v", i, p.Fragment)
				}
				if p.WatchId != 4 || p.Header.GetRevision() != 9 {
					t.Errorf("part %d: watch ID %d, header %v", i, p.WatchId, p.Header)
				}
				if len(parts) > 1 && len(p.Events) > 1 && proto.Size(p) >= tc.limit {
					t.Errorf("part %d: %d bytes, limit %d", i, proto.Size(p), tc.limit)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || total != len(tc.resp.Events) {
				t.Fatalf("parts %v, want %v", got, tc.want)
			}
		})
	}
}
