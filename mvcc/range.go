package mvcc

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sort"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/engine"
)

// view reads the store as of one revision: a snapshot for Range, the
// apply batch (with its own writes) inside WriteBatch.
type view struct {
	r          engine.Reader
	rev        int64 // the current revision this view sees
	compactRev int64
	// keys, in a write batch's view only, answers current for keys that
	// have no current record without a read (currentkeys.go).
	keys *currentKeys
}

func decodeKV(b []byte) (*mvccpb.KeyValue, error) {
	kv := &mvccpb.KeyValue{}
	if err := proto.Unmarshal(b, kv); err != nil {
		return nil, fmt.Errorf("%w: key value: %v", errCorrupt, err)
	}
	return kv, nil
}

// get returns the current version of key, or nil if it does not exist.
func (v view) get(key []byte) (*mvccpb.KeyValue, error) {
	c, err := v.current(key)
	if c == nil || err != nil {
		return nil, err
	}
	return c.kv, nil
}

// current returns key's current record, or nil if the key does not exist.
func (v view) current(key []byte) (*current, error) {
	if v.keys != nil && !v.keys.mayHold(key) {
		return nil, nil
	}
	b, err := v.r.Get(currentKey(key))
	if errors.Is(err, engine.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read key %q: %w", key, err)
	}
	return decodeCurrent(b)
}

// currentRange returns the current records of the live keys in [key, end)
// (end nil: the single key; empty: every key >= key), in key order.
func (v view) currentRange(key, end []byte) ([]*current, error) {
	if end == nil {
		c, err := v.current(key)
		if c == nil || err != nil {
			return nil, err
		}
		return []*current{c}, nil
	}
	if len(end) > 0 && bytes.Compare(end, key) <= 0 {
		return nil, nil
	}
	upper := prefixEnd(prefixCurrent)
	if len(end) > 0 {
		upper = currentKey(end)
	}
	it := v.r.NewIter(currentKey(key), upper)
	var out []*current
	for ok := it.First(); ok; ok = it.Next() {
		c, err := decodeCurrent(append([]byte(nil), it.Value()...))
		if err != nil {
			_ = it.Close()
			return nil, err
		}
		out = append(out, c)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("range [%q, %q): %w", key, end, err)
	}
	return out, nil
}

// gteRange turns etcd's "\x00" range end (every key >= key) into an empty,
// non-nil end, as etcd's mkGteRange does. nil still means the single key.
func gteRange(end []byte) []byte {
	if len(end) == 1 && end[0] == 0 {
		return []byte{}
	}
	return end
}

// rangeKeys returns up to limit (0: all) keys of [key, end) at revision
// atRev (<= 0: the view's revision) and the count of all keys there. end is
// nil for the single key, empty for every key >= key.
func (v view) rangeKeys(key, end []byte, atRev, limit int64, countOnly bool) ([]*mvccpb.KeyValue, int64, error) {
	if atRev > v.rev {
		return nil, 0, ErrFutureRev
	}
	if atRev <= 0 {
		atRev = v.rev
	}
	if atRev < v.compactRev {
		return nil, 0, ErrCompacted
	}
	if len(end) > 0 && bytes.Compare(end, key) <= 0 {
		return nil, 0, nil
	}
	if end == nil {
		kv, err := v.getAt(key, atRev)
		if err != nil || kv == nil {
			return nil, 0, err
		}
		if countOnly {
			return nil, 1, nil
		}
		return []*mvccpb.KeyValue{kv}, 1, nil
	}
	if atRev == v.rev {
		return v.rangeCurrent(key, end, limit, countOnly)
	}
	return v.rangeHistory(key, end, atRev, limit, countOnly)
}

// getAt returns key's version at rev, or nil.
func (v view) getAt(key []byte, rev int64) (*mvccpb.KeyValue, error) {
	if rev == v.rev {
		return v.get(key)
	}
	return v.getAtHistory(key, rev)
}

// getAtHistory returns key's version at rev, an older revision than the
// view's, or nil. The current version answers if it is old enough: every
// other version is in history (doc.go, "Where each version lives").
func (v view) getAtHistory(key []byte, rev int64) (*mvccpb.KeyValue, error) {
	cur, err := v.current(key)
	if err != nil {
		return nil, err
	}
	if cur != nil && cur.kv.ModRevision <= rev {
		return cur.kv, nil
	}
	it := v.r.NewIter(historySeek(key, rev), historyKeyEnd(key))
	var kv *mvccpb.KeyValue
	if it.First() {
		kv, err = decodeKV(it.Value())
		if err == nil && kv.ModRevision == 0 {
			kv = nil // tombstone
		}
	}
	if cerr := it.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("read key %q at %d: %w", key, rev, cerr)
	}
	return kv, err
}

func (v view) rangeCurrent(key, end []byte, limit int64, countOnly bool) ([]*mvccpb.KeyValue, int64, error) {
	var kvs []*mvccpb.KeyValue
	var count int64
	err := v.visitCurrent(key, end, func(decode func() (*mvccpb.KeyValue, error)) error {
		count++
		if countOnly || (limit > 0 && int64(len(kvs)) >= limit) {
			return nil
		}
		kv, err := decode()
		if err == nil {
			kvs = append(kvs, kv)
		}
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	return kvs, count, nil
}

func (v view) rangeHistory(key, end []byte, rev, limit int64, countOnly bool) ([]*mvccpb.KeyValue, int64, error) {
	var kvs []*mvccpb.KeyValue
	var count int64
	err := v.visitHistory(key, end, rev, func(decode func() (*mvccpb.KeyValue, error)) error {
		count++
		if countOnly || (limit > 0 && int64(len(kvs)) >= limit) {
			return nil
		}
		kv, err := decode()
		if err == nil {
			kvs = append(kvs, kv)
		}
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	return kvs, count, nil
}

// visitCurrent calls fn for each live key in [key, end) (end empty: to
// the end of the key space), in key order, with a function that decodes
// its current version: a caller that only counts never decodes.
func (v view) visitCurrent(key, end []byte, fn func(decode func() (*mvccpb.KeyValue, error)) error) error {
	upper := prefixEnd(prefixCurrent)
	if len(end) > 0 {
		upper = currentKey(end)
	}
	it := v.r.NewIter(currentKey(key), upper)
	decode := func() (*mvccpb.KeyValue, error) {
		c, err := decodeCurrent(it.Value())
		if err != nil {
			return nil, err
		}
		return c.kv, nil
	}
	for ok := it.First(); ok; ok = it.Next() {
		if err := fn(decode); err != nil {
			_ = it.Close()
			return err
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("range [%q, %q): %w", key, end, err)
	}
	return nil
}

// visitHistory is visitCurrent at revision rev: for each key in [key, end)
// live at rev, its version at rev (already decoded: telling a live
// version from a deletion needs it). A key's versions are in history and,
// for a live key, in its current record, so it walks the two key spaces
// side by side, in key order: a current version at or below rev answers,
// otherwise the newest history entry at or below rev does.
func (v view) visitHistory(key, end []byte, rev int64, fn func(decode func() (*mvccpb.KeyValue, error)) error) (err error) {
	hUpper, cUpper := prefixEnd(prefixHistory), prefixEnd(prefixCurrent)
	if len(end) > 0 {
		hUpper, cUpper = historyPrefix(end), currentKey(end)
	}
	hist := v.r.NewIter(historyPrefix(key), hUpper)
	cur := v.r.NewIter(currentKey(key), cUpper)
	defer func() {
		closeErr := errors.Join(hist.Close(), cur.Close())
		if err == nil && closeErr != nil {
			err = fmt.Errorf("range [%q, %q) at %d: %w", key, end, rev, closeErr)
		}
	}()
	hok, cok := hist.First(), cur.First()
	for hok || cok {
		var hk, ck []byte
		if hok {
			if hk, _, _, err = parseHistoryKey(hist.Key()); err != nil {
				return err
			}
		}
		if cok {
			ck = cur.Key()[len(prefixCurrent):]
		}
		inHist, inCur := hok, cok
		if hok && cok {
			c := bytes.Compare(hk, ck)
			inHist, inCur = c <= 0, c >= 0
		}
		k := hk
		if !inHist {
			k = append([]byte(nil), ck...)
		}
		var kv *mvccpb.KeyValue
		if inCur {
			c, err := decodeCurrent(cur.Value())
			if err != nil {
				return err
			}
			if c.kv.ModRevision <= rev {
				kv = c.kv
			}
			cok = cur.Next()
		}
		if kv == nil && inHist && hist.SeekGE(historySeek(k, rev)) && bytes.HasPrefix(hist.Key(), historyPrefix(k)) {
			if kv, err = decodeKV(hist.Value()); err != nil {
				return err
			}
			if kv.ModRevision == 0 {
				kv = nil // deleted at rev
			}
		}
		if kv != nil {
			if err := fn(func() (*mvccpb.KeyValue, error) { return kv, nil }); err != nil {
				return err
			}
		}
		if inHist {
			hok = hist.SeekGE(historyKeyEnd(k))
		}
	}
	return nil
}

// checkRange is etcd's pre-check of a Range inside a Txn: a bad revision
// fails the whole Txn before anything is written.
func (v view) checkRange(r *pb.RangeRequest) error {
	switch {
	case r.Revision == 0:
		return nil
	case r.Revision > v.rev:
		return ErrFutureRev
	case r.Revision < v.compactRev:
		return ErrCompacted
	}
	return nil
}

// executeRange answers a RangeRequest the way etcd does: sorting and the
// revision filters apply to the whole range, before the limit; count is the
// number of keys in the range at the revision, before filters and limit.
func (v view) executeRange(r *pb.RangeRequest) (*pb.RangeResponse, error) {
	limit := r.Limit
	if !isDefaultOrdering(r.SortTarget, r.SortOrder) || hasRevisionFilters(r) {
		limit = 0
	}
	if limit > 0 && limit < math.MaxInt64 {
		limit++ // one more than asked tells whether there is more
	}
	kvs, count, err := v.rangeKeys(r.Key, gteRange(r.RangeEnd), r.Revision, limit, r.CountOnly)
	if err != nil {
		return nil, err
	}
	kvs = filterKVs(kvs, r)
	sortKVs(kvs, r)
	resp := &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: v.rev}, Count: count}
	if r.Limit > 0 && int64(len(kvs)) > r.Limit {
		kvs = kvs[:r.Limit]
		resp.More = true
	}
	if r.KeysOnly {
		// etcd answers keys_only from its in-memory index, which has no
		// lease, unless it must read values to sort by them.
		fast := r.SortTarget != pb.RangeRequest_VALUE
		for _, kv := range kvs {
			kv.Value = nil
			if fast {
				kv.Lease = 0
			}
		}
	}
	resp.Kvs = kvs
	return resp, nil
}

func isDefaultOrdering(target pb.RangeRequest_SortTarget, order pb.RangeRequest_SortOrder) bool {
	return order == pb.RangeRequest_NONE || (target == pb.RangeRequest_KEY && order == pb.RangeRequest_ASCEND)
}

func hasRevisionFilters(r *pb.RangeRequest) bool {
	return r.MinModRevision != 0 || r.MaxModRevision != 0 || r.MinCreateRevision != 0 || r.MaxCreateRevision != 0
}

func filterKVs(kvs []*mvccpb.KeyValue, r *pb.RangeRequest) []*mvccpb.KeyValue {
	if !hasRevisionFilters(r) {
		return kvs
	}
	out := kvs[:0]
	for _, kv := range kvs {
		switch {
		case r.MaxModRevision != 0 && kv.ModRevision > r.MaxModRevision:
		case r.MinModRevision != 0 && kv.ModRevision < r.MinModRevision:
		case r.MaxCreateRevision != 0 && kv.CreateRevision > r.MaxCreateRevision:
		case r.MinCreateRevision != 0 && kv.CreateRevision < r.MinCreateRevision:
		default:
			out = append(out, kv)
		}
	}
	return out
}

// sortKVs sorts as etcd does: a sort target with order NONE means
// ascending. It uses sort.Sort (and sort.Reverse) on the same input order
// as etcd, so that even the order of ties, which the algorithm leaves
// unspecified, comes out as etcd's.
func sortKVs(kvs []*mvccpb.KeyValue, r *pb.RangeRequest) {
	order := r.SortOrder
	if r.SortTarget != pb.RangeRequest_KEY && order == pb.RangeRequest_NONE {
		order = pb.RangeRequest_ASCEND
	}
	if isDefaultOrdering(r.SortTarget, order) {
		return
	}
	var sorter sort.Interface = kvSorter{kvs: kvs, target: r.SortTarget}
	if order == pb.RangeRequest_DESCEND {
		sorter = sort.Reverse(sorter)
	}
	sort.Sort(sorter)
}

type kvSorter struct {
	kvs    []*mvccpb.KeyValue
	target pb.RangeRequest_SortTarget
}

func (s kvSorter) Len() int      { return len(s.kvs) }
func (s kvSorter) Swap(i, j int) { s.kvs[i], s.kvs[j] = s.kvs[j], s.kvs[i] }
func (s kvSorter) Less(i, j int) bool {
	a, b := s.kvs[i], s.kvs[j]
	switch s.target {
	case pb.RangeRequest_VERSION:
		return a.Version < b.Version
	case pb.RangeRequest_CREATE:
		return a.CreateRevision < b.CreateRevision
	case pb.RangeRequest_MOD:
		return a.ModRevision < b.ModRevision
	case pb.RangeRequest_VALUE:
		return bytes.Compare(a.Value, b.Value) < 0
	default:
		return bytes.Compare(a.Key, b.Key) < 0
	}
}
