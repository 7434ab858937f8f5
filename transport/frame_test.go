package transport

import (
	"bytes"
	"errors"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func framesEqual(a, b *frame) bool {
	if a.ClusterID != b.ClusterID || a.From != b.From || a.To != b.To || a.Last != b.Last ||
		!bytes.Equal(a.Chunk, b.Chunk) || len(a.Msgs) != len(b.Msgs) {
		return false
	}
	for i := range a.Msgs {
		if !proto.Equal(a.Msgs[i], b.Msgs[i]) {
			return false
		}
	}
	return true
}

func TestFrameRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		f    frame
	}{
		{name: "empty", f: frame{}},
		{name: "hello", f: frame{ClusterID: 1<<63 + 5, From: 1, To: 2}},
		{name: "batch", f: frame{Msgs: []*raftpb.Message{msg(1, 2, 3), {}, snapMsg(1, 2, 9)}}},
		{name: "chunk", f: frame{Chunk: []byte("data")}},
		{name: "last", f: frame{Last: true}},
		{name: "snapshot hello", f: frame{ClusterID: 7, From: 1, To: 2, Msgs: []*raftpb.Message{snapMsg(1, 2, 9)}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := codec{}.Marshal(&tt.f)
			if err != nil {
				t.Fatal(err)
			}
			var got frame
			if err := (codec{}).Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if !framesEqual(&got, &tt.f) {
				t.Fatalf("round trip: got %+v, want %+v", got, tt.f)
			}
		})
	}
}

// TestFrameWireCompat checks the encoding against a protobuf encoder: a
// frame is the proto message FORMAT.md describes.
func TestFrameWireCompat(t *testing.T) {
	m := msg(1, 2, 3)
	mb, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	want = protowire.AppendTag(want, 1, protowire.VarintType)
	want = protowire.AppendVarint(want, 7)
	want = protowire.AppendTag(want, 4, protowire.BytesType)
	want = protowire.AppendBytes(want, mb)
	want = protowire.AppendTag(want, 5, protowire.BytesType)
	want = protowire.AppendBytes(want, []byte("x"))
	want = protowire.AppendTag(want, 6, protowire.VarintType)
	want = protowire.AppendVarint(want, 1)
	got, err := (&frame{ClusterID: 7, Msgs: []*raftpb.Message{m}, Chunk: []byte("x"), Last: true}).marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("encoding\n got %x\nwant %x", got, want)
	}
}

func TestFrameDecodeErrors(t *testing.T) {
	tag := func(num protowire.Number, typ protowire.Type) []byte { return protowire.AppendTag(nil, num, typ) }
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	tests := []struct {
		name    string
		in      []byte
		wantErr bool
		want    frame
	}{
		{name: "truncated tag", in: []byte{0x80}, wantErr: true},
		{name: "truncated varint", in: cat(tag(fieldFrom, protowire.VarintType), []byte{0xff}), wantErr: true},
		{name: "wrong wire type", in: cat(tag(fieldFrom, protowire.BytesType), protowire.AppendBytes(nil, []byte("x"))), wantErr: true},
		{name: "length beyond the end", in: cat(tag(fieldChunk, protowire.BytesType), protowire.AppendVarint(nil, 1<<40)), wantErr: true},
		{name: "raft message not protobuf", in: cat(tag(fieldMessage, protowire.BytesType), protowire.AppendBytes(nil, []byte{0xff, 0xff})), wantErr: true},
		{name: "field number zero", in: []byte{0x00}, wantErr: true},
		{
			name: "unknown field skipped",
			in:   cat(tag(99, protowire.BytesType), protowire.AppendBytes(nil, []byte("future")), tag(fieldTo, protowire.VarintType), protowire.AppendVarint(nil, 5)),
			want: frame{To: 5},
		},
		{
			name: "last is any non-zero varint",
			in:   cat(tag(fieldLast, protowire.VarintType), protowire.AppendVarint(nil, 2)),
			want: frame{Last: true},
		},
		{
			name: "a repeated chunk field replaces the earlier one, as in protobuf",
			in: cat(tag(fieldChunk, protowire.BytesType), protowire.AppendBytes(nil, []byte("old")),
				tag(fieldChunk, protowire.BytesType), protowire.AppendBytes(nil, []byte("new"))),
			want: frame{Chunk: []byte("new")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f frame
			err := f.unmarshal(tt.in)
			if tt.wantErr {
				if !errors.Is(err, errBadFrame) {
					t.Fatalf("unmarshal: %v, want errBadFrame", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !framesEqual(&f, &tt.want) {
				t.Fatalf("got %+v, want %+v", f, tt.want)
			}
		})
	}
}

func TestFrameDoesNotAlias(t *testing.T) {
	b, err := (&frame{Chunk: []byte("abc")}).marshal()
	if err != nil {
		t.Fatal(err)
	}
	var f frame
	if err := f.unmarshal(b); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 0
	}
	if string(f.Chunk) != "abc" {
		t.Fatalf("chunk changed with the input buffer: %q", f.Chunk)
	}
}

func FuzzFrame(f *testing.F) {
	for _, fr := range []frame{
		{},
		{ClusterID: 1, From: 2, To: 3},
		{Msgs: []*raftpb.Message{msg(1, 2, 3), snapMsg(1, 2, 4)}},
		{Chunk: []byte("chunk"), Last: true},
	} {
		b, err := fr.marshal()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var fr frame
		if err := fr.unmarshal(in); err != nil {
			return
		}
		// Whatever decodes re-encodes to something that decodes the same.
		b, err := fr.marshal()
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		var again frame
		if err := again.unmarshal(b); err != nil {
			t.Fatalf("decode re-encoded frame: %v", err)
		}
		if !framesEqual(&fr, &again) {
			t.Fatalf("round trip changed the frame: %+v -> %+v", fr, again)
		}
	})
}
