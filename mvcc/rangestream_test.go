package mvcc

import (
	"fmt"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"
)

// TestRangeStream: the chunks of a RangeStream put together answer what
// Range answers (keys, count, more, header), every chunk but the last stays
// near the chunk size, and only the last carries the header.
func TestRangeStream(t *testing.T) {
	s := rangeFixture(t) // revision 7: a, b, d live; c deleted at 7
	value := strings.Repeat("x", 100)
	var fns []func(w *WriteBatch)
	for i := range 300 {
		fns = append(fns, mustPut(t, fmt.Sprintf("k%03d", i), value))
	}
	apply(t, s, fns...)
	const chunkBytes = 2048
	tests := []struct {
		name string
		r    *pb.RangeRequest
	}{
		{"everything", &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}}},
		{"prefix", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l")}},
		{"limit inside a chunk", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), Limit: 3}},
		{"limit across chunks", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), Limit: 150}},
		{"limit equal to the keys", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), Limit: 300}},
		{"keys only", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), KeysOnly: true}},
		{"count only", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l"), CountOnly: true}},
		{"at an older revision", &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("e"), Revision: 6}},
		{"one key", &pb.RangeRequest{Key: []byte("b")}},
		{"missing key", &pb.RangeRequest{Key: []byte("c")}},
		{"empty range", &pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("a")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := s.Range(proto.Clone(tt.r).(*pb.RangeRequest))
			if err != nil {
				t.Fatal(err)
			}
			got := &pb.RangeResponse{}
			chunks, headers := 0, 0
			err = s.RangeStream(tt.r, chunkBytes, func(resp *pb.RangeResponse) error {
				chunks++
				size := 0
				for i, kv := range resp.Kvs {
					if size >= chunkBytes {
						t.Fatalf("chunk %d: key %d starts past the chunk size (%d bytes before it)", chunks, i, size)
					}
					size += proto.Size(kv)
				}
				got.Kvs = append(got.Kvs, resp.Kvs...)
				if resp.Header != nil {
					headers++
					got.Header, got.More, got.Count = resp.Header, resp.More, resp.Count
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if headers != 1 || got.Header == nil {
				t.Fatalf("%d chunks carried a header, want the last one only", headers)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("chunks put together:\n%v\nRange:\n%v", got, want)
			}
		})
	}
	var chunks int
	if err := s.RangeStream(&pb.RangeRequest{Key: []byte("k"), RangeEnd: []byte("l")}, chunkBytes, func(*pb.RangeResponse) error { chunks++; return nil }); err != nil || chunks < 10 {
		t.Fatalf("300 keys of 100 bytes in chunks of %d bytes: %d chunks, %v", chunkBytes, chunks, err)
	}
	for _, r := range []struct {
		rev  int64
		want error
	}{{1 << 40, ErrFutureRev}} {
		err := s.RangeStream(&pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("z"), Revision: r.rev}, chunkBytes, func(*pb.RangeResponse) error { return nil })
		if err != r.want {
			t.Errorf("revision %d: %v, want %v", r.rev, err, r.want)
		}
	}
}
