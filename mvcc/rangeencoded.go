package mvcc

import (
	"fmt"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/encoding/protowire"
)

// Ranges answered in their wire encoding
//
// A Kubernetes LIST is a Range over every key under a prefix, often 10^4 to
// 10^5 values of a KiB or more, answered in one RangeResponse. Decoding
// each stored KeyValue into a struct (a copy of its key and value), then
// marshalling the response (a second copy) and holding both until the
// response is sent put the peak memory of such a LIST at three times the
// answer (docs/bench/REPORT.md, LIST). Yet an mc record holds the
// KeyValue in exactly the encoding the response carries. So a plain
// range read at the current revision is answered as the response's kvs
// field, the stored KeyValue bytes each behind their tag and length,
// copied once, into chunks from a pool; the server adds the header and the
// other fields, and returns each chunk to the pool once it is sent, so
// that one LIST after another reuses the same memory instead of leaving
// garbage for the collector.

// BufferPool supplies the chunks RangeEncoded encodes into; it has the
// shape of grpc's mem.BufferPool.
type BufferPool interface {
	// Get returns a buffer of length at least n.
	Get(n int) *[]byte
	// Put returns a buffer Get gave, or a prefix of it.
	Put(*[]byte)
}

// EncodedRange is a RangeResponse's kvs field in its wire encoding, with
// the other fields of the response still to be encoded by the caller.
type EncodedRange struct {
	// Kvs is field 2 of a RangeResponse, repeated: per key, in key order,
	// the field's tag, the length and the KeyValue as stored. It is split
	// in chunks of about the chunk size RangeEncoded was given; a chunk
	// ends at a key's end. Each is a buffer of the pool RangeEncoded was
	// given, which the caller owns.
	Kvs []*[]byte
	// Revision is the store's revision the range was read at.
	Revision int64
	// Count is the number of keys in the range; More is true when keys
	// remain past the request's limit.
	Count int64
	More  bool
}

// kvsField is the tag of RangeResponse.kvs (field 2, length-delimited).
var kvsField = protowire.AppendTag(nil, 2, protowire.BytesType)

// RangeEncoded answers r as Range does, in wire encoding, when r is a
// plain read of a range at the current revision: a range end, no revision,
// key order (no sort, or by key ascending), no revision filters, keys and
// values (not keys_only nor count_only). For any other request it returns
// ok false and reads nothing; the caller then calls Range. Chunks of
// chunkBytes (a single larger key gets a chunk of its own) come from pool;
// on error they are back in it.
//
// Safe from any goroutine, as Range.
func (s *Store) RangeEncoded(r *pb.RangeRequest, pool BufferPool, chunkBytes int) (_ *EncodedRange, ok bool, err error) {
	// Key order only: with no sort order a sort target other than the key
	// still sorts, ascending (sortKVs).
	keyOrder := r.SortTarget == pb.RangeRequest_KEY && r.SortOrder != pb.RangeRequest_DESCEND
	if !encodable(r) || !keyOrder || hasRevisionFilters(r) {
		return nil, false, nil
	}
	out, err := s.encodeRange(r, pool, chunkBytes, nil)
	return out, err == nil, err
}

// RangeStreamEncoded is RangeStream in wire encoding, for the requests
// RangeEncoded answers (the sort order and revision filters are the
// caller's to refuse, as for RangeStream): send gets each chunk of about
// chunkBytes as an EncodedRange holding one buffer of pool, which it then
// owns, and last the final chunk, which also holds the revision, count and
// more (final true). A request it does not answer returns ok false, having
// sent nothing.
func (s *Store) RangeStreamEncoded(r *pb.RangeRequest, pool BufferPool, chunkBytes int, send func(chunk *EncodedRange, final bool) error) (ok bool, err error) {
	if !encodable(r) {
		return false, nil
	}
	out, err := s.encodeRange(r, pool, chunkBytes, func(chunk *[]byte) error {
		return send(&EncodedRange{Kvs: []*[]byte{chunk}}, false)
	})
	if err != nil {
		return true, err
	}
	return true, send(out, true)
}

// encodable: r reads a range of keys and values at the current revision.
func encodable(r *pb.RangeRequest) bool {
	return len(r.RangeEnd) > 0 && r.Revision == 0 && !r.KeysOnly && !r.CountOnly
}

// encodeRange encodes the keys of r's range at the current revision into
// chunks of pool. A chunk that is full is handed to full if not nil (which
// then owns it), else kept in the result; r.Limit keys at most are
// encoded, and every key is counted.
func (s *Store) encodeRange(r *pb.RangeRequest, pool BufferPool, chunkBytes int, full func(chunk *[]byte) error) (_ *EncodedRange, err error) {
	v, snap, err := s.snapshotView()
	if err != nil {
		return nil, err
	}
	defer snap.Close()
	out := &EncodedRange{Revision: v.rev}
	defer func() {
		if err != nil {
			for _, c := range out.Kvs {
				pool.Put(c)
			}
		}
	}()
	key, end := r.Key, gteRange(r.RangeEnd)
	if len(end) > 0 && string(end) <= string(key) {
		return out, nil
	}
	var sent int64
	// Invariant: the last chunk of out.Kvs, if any, has room up to its
	// capacity, which no append exceeds (the pool owns what lies past it).
	err = v.visitCurrentStored(key, end, func(kv []byte) error {
		out.Count++
		if r.Limit > 0 && sent >= r.Limit {
			return nil // past the limit: counted only
		}
		need := len(kvsField) + protowire.SizeBytes(len(kv))
		if n := len(out.Kvs); n == 0 || len(*out.Kvs[n-1])+need > cap(*out.Kvs[n-1]) {
			if n > 0 && full != nil {
				c := out.Kvs[n-1]
				out.Kvs = out.Kvs[:n-1]
				if err := full(c); err != nil {
					return err
				}
			}
			c := pool.Get(max(chunkBytes, need))
			*c = (*c)[:0]
			out.Kvs = append(out.Kvs, c)
		}
		c := out.Kvs[len(out.Kvs)-1]
		*c = protowire.AppendBytes(append(*c, kvsField...), kv)
		sent++
		return nil
	})
	if err != nil {
		return nil, err
	}
	out.More = r.Limit > 0 && out.Count > r.Limit
	return out, nil
}

// visitCurrentStored is visitCurrent handing fn each live key's KeyValue
// as stored (valid until fn returns), checked to be well-formed protobuf
// but not decoded.
func (v view) visitCurrentStored(key, end []byte, fn func(kv []byte) error) error {
	upper := prefixEnd(prefixCurrent)
	if len(end) > 0 {
		upper = currentKey(end)
	}
	it := v.r.NewIter(currentKey(key), upper)
	for ok := it.First(); ok; ok = it.Next() {
		kv, err := storedKV(it.Value())
		if err == nil {
			err = fn(kv)
		}
		if err != nil {
			_ = it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("range [%q, %q): %w", key, end, err)
	}
	return nil
}

// storedKV returns the KeyValue encoding inside an mc record, moved or
// copied (doc.go, "Where each version lives"), after checking that it
// parses as protobuf fields.
func storedKV(record []byte) ([]byte, error) {
	kv := record
	if len(kv) > 0 && kv[0] == currentMoved {
		_, n := protowire.ConsumeVarint(kv[1:])
		if n < 0 {
			return nil, fmt.Errorf("%w: current record: bad sub-revision", errCorrupt)
		}
		kv = kv[1+n:]
	}
	for rest := kv; len(rest) > 0; {
		_, _, n := protowire.ConsumeField(rest)
		if n < 0 {
			return nil, fmt.Errorf("%w: key value: %v", errCorrupt, protowire.ParseError(n))
		}
		rest = rest[n:]
	}
	return kv, nil
}
