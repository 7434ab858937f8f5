package mvcc

import (
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/encoding/protowire"
)

// appendKV appends kv's protobuf encoding to b: the bytes proto.Marshal
// writes for it (fields in number order, proto3 zero values left out, no
// unknown fields), without the reflection and the allocation of a
// marshal. Every put encodes its version once, and a profile of a bulk
// load put proto.Marshal at 3.6% of the server's CPU
// (docs/bench/performance.md, "Versions encoded by hand, requests decoded
// once").
// TestAppendKVMatchesMarshal and FuzzAppendKV hold it to proto.Marshal.
func appendKV(b []byte, kv *mvccpb.KeyValue) []byte {
	if len(kv.Key) > 0 {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, kv.Key)
	}
	b = appendInt64Field(b, 2, kv.CreateRevision)
	b = appendInt64Field(b, 3, kv.ModRevision)
	b = appendInt64Field(b, 4, kv.Version)
	if len(kv.Value) > 0 {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendBytes(b, kv.Value)
	}
	return appendInt64Field(b, 6, kv.Lease)
}

// appendInt64Field appends an int64 field unless it is zero; a negative
// value takes ten bytes, as in proto.Marshal.
func appendInt64Field(b []byte, num protowire.Number, v int64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, uint64(v))
}

// kvSize is the length of appendKV's encoding of kv.
func kvSize(kv *mvccpb.KeyValue) int {
	n := 0
	if len(kv.Key) > 0 {
		n += 1 + protowire.SizeBytes(len(kv.Key))
	}
	for _, v := range [...]int64{kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease} {
		if v != 0 {
			n += 1 + protowire.SizeVarint(uint64(v))
		}
	}
	if len(kv.Value) > 0 {
		n += 1 + protowire.SizeBytes(len(kv.Value))
	}
	return n
}
