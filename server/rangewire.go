package server

import (
	"context"
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the codec wireCodec wraps, before this package's init
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/mvcc"
)

// Range responses sent as the store encoded them
//
// A plain range read (a Kubernetes LIST) is answered by the KV service's
// gRPC Range handler from mvcc.Store.RangeEncoded, and by RangeStream from
// mvcc.Store.RangeStreamEncoded: the response's kvs field as the stored
// KeyValue bytes, copied once, instead of KeyValue structs that gRPC then
// marshals into a second copy (mvcc/rangeencoded.go says why). The handlers send a wireRangeResponse, which wireCodec, the
// process's "proto" codec, sends as it is; every other message goes to
// grpc-go's own proto codec. KV.Range, which in-process callers use (the
// v3lock and v3election services, tests), still returns a RangeResponse.

// rangeChunkBytes is the size of the buffers a range's keys are encoded
// into: large enough that a LIST of 10^5 keys of a KiB takes about a
// hundred, small enough that the last one wastes little.
const rangeChunkBytes = 1 << 20

// rangeBuffers is the pool the chunks come from and go back to: gRPC's
// own, which keeps buffers of rangeChunkBytes.
var rangeBuffers = mem.DefaultBufferPool()

// wireRangeResponse is a RangeResponse in its wire encoding, in pieces, or
// a RangeStreamResponse holding one.
type wireRangeResponse struct {
	// stream, when set, is the RangeStreamResponse's field 1 (tag and
	// length) that holds the RangeResponse.
	stream []byte
	header []byte    // field 1, the ResponseHeader, with its tag and length
	kvs    []*[]byte // field 2, repeated (mvcc.EncodedRange.Kvs), buffers of rangeBuffers
	tail   []byte    // fields 3 (more) and 4 (count), when not zero
	count  int64
}

// newWireRangeResponse completes enc with the header h (nil: none, a
// RangeStream chunk before the last).
func newWireRangeResponse(h *pb.ResponseHeader, enc *mvcc.EncodedRange) (*wireRangeResponse, error) {
	w := &wireRangeResponse{kvs: enc.Kvs, count: enc.Count}
	if h != nil {
		hb, err := proto.Marshal(h)
		if err != nil {
			return nil, fmt.Errorf("encode range response header: %w", err)
		}
		w.header = protowire.AppendTag(nil, 1, protowire.BytesType)
		w.header = protowire.AppendBytes(w.header, hb)
	}
	if enc.More {
		w.tail = protowire.AppendTag(w.tail, 3, protowire.VarintType)
		w.tail = protowire.AppendVarint(w.tail, 1)
	}
	if enc.Count != 0 {
		w.tail = protowire.AppendTag(w.tail, 4, protowire.VarintType)
		w.tail = protowire.AppendVarint(w.tail, uint64(enc.Count))
	}
	return w, nil
}

// newWireRangeStreamResponse is newWireRangeResponse inside a
// RangeStreamResponse.
func newWireRangeStreamResponse(h *pb.ResponseHeader, enc *mvcc.EncodedRange) (*wireRangeResponse, error) {
	w, err := newWireRangeResponse(h, enc)
	if err != nil {
		return nil, err
	}
	inner := w.size()
	w.stream = protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.BytesType), uint64(inner))
	return w, nil
}

// size returns the length of the encoded response.
func (w *wireRangeResponse) size() int {
	n := len(w.stream) + len(w.header) + len(w.tail)
	for _, c := range w.kvs {
		n += len(*c)
	}
	return n
}

// buffers returns the response's pieces, in order, for gRPC to send; gRPC
// frees each once it is written, which returns the chunks of the keys to
// rangeBuffers.
func (w *wireRangeResponse) buffers() mem.BufferSlice {
	out := make(mem.BufferSlice, 0, len(w.kvs)+3)
	if len(w.stream) > 0 {
		out = append(out, mem.SliceBuffer(w.stream))
	}
	if len(w.header) > 0 {
		out = append(out, mem.SliceBuffer(w.header))
	}
	for _, c := range w.kvs {
		out = append(out, mem.NewBuffer(c, rangeBuffers))
	}
	if len(w.tail) > 0 {
		out = append(out, mem.SliceBuffer(w.tail))
	}
	return out
}

// wireCodec is grpc-go's proto codec, except that it sends a
// wireRangeResponse's pieces as they are. It is registered in place of the
// proto codec for the whole process, so it sees what every gRPC client and
// server of strata sends; only the KV service's Range and RangeStream
// handlers make a wireRangeResponse.
type wireCodec struct{ proto encoding.CodecV2 }

func init() {
	encoding.RegisterCodecV2(wireCodec{proto: encoding.GetCodecV2("proto")})
}

// Marshal implements encoding.CodecV2.
func (c wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	if w, ok := v.(*wireRangeResponse); ok {
		return w.buffers(), nil
	}
	return c.proto.Marshal(v)
}

// Unmarshal implements encoding.CodecV2.
func (c wireCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

// Name implements encoding.CodecV2: the codec replaces "proto".
func (wireCodec) Name() string { return "proto" }

// registerKV registers kv as the KV service of s, with a Range handler that
// answers plain ranges in wire encoding (rangeWire).
func registerKV(s *grpc.Server, kv *KV) {
	desc := pb.KV_ServiceDesc
	desc.Methods = append([]grpc.MethodDesc(nil), desc.Methods...)
	for i := range desc.Methods {
		if desc.Methods[i].MethodName == "Range" {
			desc.Methods[i].Handler = rangeHandler
		}
	}
	s.RegisterService(&desc, kv)
}

// rangeHandler is the generated KV Range handler with KV.rangeWire in
// place of KV.Range.
func rangeHandler(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
	in := new(pb.RangeRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	kv := srv.(*KV)
	if interceptor == nil {
		return kv.rangeWire(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: pb.KV_Range_FullMethodName}
	return interceptor(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		return kv.rangeWire(ctx, req.(*pb.RangeRequest))
	})
}

// rangeWire is Range answering a plain range with a wireRangeResponse, and
// any other with a RangeResponse.
func (s *KV) rangeWire(ctx context.Context, r *pb.RangeRequest) (any, error) {
	if err := s.beforeRange(ctx, r); err != nil {
		return nil, err
	}
	enc, ok, err := s.b.Store().RangeEncoded(r, rangeBuffers, rangeChunkBytes)
	if err != nil {
		return nil, toGRPCError(err)
	}
	if !ok {
		return s.readRange(r)
	}
	h := &pb.ResponseHeader{Revision: enc.Revision}
	fillHeader(s.b, &h, enc.Revision)
	return newWireRangeResponse(h, enc)
}
