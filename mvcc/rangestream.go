package mvcc

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

// RangeStream answers r as etcd's RangeStream does, in chunks: the keys
// of the range at r.Revision (0: now), read in key order from one
// consistent view and handed to send about chunkBytes of encoded keys at a
// time, so that neither the store nor send holds the whole range; the final
// chunk carries the header (the store's revision when the stream began),
// more (keys remain past r.Limit) and count (every key of the range). A
// count-only request, or one for a single key, is answered in one chunk.
//
// The range is read in one pass: past r.Limit the keys are only counted,
// never decoded. Sorting other than by key ascending and the revision
// filters are the caller's to refuse, as etcd's API layer refuses them;
// RangeStream ignores them. send is called on this goroutine.
func (s *Store) RangeStream(r *pb.RangeRequest, chunkBytes int, send func(*pb.RangeResponse) error) error {
	v, snap, err := s.snapshotView()
	if err != nil {
		return err
	}
	defer snap.Close()
	header := &pb.ResponseHeader{Revision: v.rev}
	if r.CountOnly || len(r.RangeEnd) == 0 {
		resp, err := v.executeRange(r)
		if err != nil {
			return err
		}
		return send(&pb.RangeResponse{Header: header, Kvs: resp.Kvs, More: resp.More, Count: resp.Count})
	}
	atRev := r.Revision
	switch {
	case atRev > v.rev:
		return ErrFutureRev
	case atRev <= 0:
		atRev = v.rev
	case atRev < v.compactRev:
		return ErrCompacted
	}
	var (
		chunk      []*mvccpb.KeyValue
		chunkSize  int
		count, out int64
	)
	visit := func(decode func() (*mvccpb.KeyValue, error)) error {
		count++
		if r.Limit > 0 && out >= r.Limit {
			return nil // past the limit: counted only
		}
		kv, err := decode()
		if err != nil {
			return err
		}
		if r.KeysOnly {
			// etcd answers keys_only from its in-memory index, which has
			// no lease (executeRange's fast path).
			kv.Value, kv.Lease = nil, 0
		}
		chunk = append(chunk, kv)
		out++
		if chunkSize += proto.Size(kv); chunkSize >= chunkBytes {
			if err := send(&pb.RangeResponse{Kvs: chunk}); err != nil {
				return err
			}
			chunk, chunkSize = nil, 0
		}
		return nil
	}
	end := gteRange(r.RangeEnd)
	switch {
	case len(end) > 0 && string(end) <= string(r.Key):
		// An empty range: nothing to visit.
	case atRev == v.rev:
		err = v.visitCurrent(r.Key, end, visit)
	default:
		err = v.visitHistory(r.Key, end, atRev, visit)
	}
	if err != nil {
		return err
	}
	return send(&pb.RangeResponse{Header: header, Kvs: chunk, More: r.Limit > 0 && count > r.Limit, Count: count})
}
