package mvcc

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/strata-kv/strata/engine"
	epebble "github.com/strata-kv/strata/engine/pebble"
)

func put(k, v string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(k), Value: []byte(v)}}}
}

func rng(k, end string) *pb.RequestOp {
	r := &pb.RangeRequest{Key: []byte(k)}
	if end != "" {
		r.RangeEnd = []byte(end)
	}
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: r}}
}

func del(k, end string) *pb.RequestOp {
	r := &pb.DeleteRangeRequest{Key: []byte(k)}
	if end != "" {
		r.RangeEnd = []byte(end)
	}
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: r}}
}

// apply commits each function as its own batch, with no lease existing.
func apply(t *testing.T, s *Store, fns ...func(w *WriteBatch)) {
	t.Helper()
	applyLeases(t, s, nil, fns...)
}

// applyLeases commits each function as its own batch, with the leases
// leases holds.
func applyLeases(t *testing.T, s *Store, leases Leases, fns ...func(w *WriteBatch)) {
	t.Helper()
	for _, fn := range fns {
		w := s.Write(leases)
		fn(w)
		if err := w.Commit(s.AppliedIndex() + 1); err != nil {
			t.Fatal(err)
		}
	}
}

func mustPut(t *testing.T, k, v string) func(w *WriteBatch) {
	return func(w *WriteBatch) {
		if _, err := w.Put(&pb.PutRequest{Key: []byte(k), Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
}

func kv(k, v string, create, mod, ver int64) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: []byte(k), Value: []byte(v), CreateRevision: create, ModRevision: mod, Version: ver}
}

// rangeFixture: rev 2 a=1, 3 b=22, 4 c=333, 5 a=4444, 6 d=5, 7 delete c.
func rangeFixture(t *testing.T) *Store {
	e, err := epebble.Open("db", epebble.Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	s, err := Open(e, Options{})
	if err != nil {
		t.Fatal(err)
	}
	apply(t, s, mustPut(t, "a", "1"), mustPut(t, "b", "22"), mustPut(t, "c", "333"), mustPut(t, "a", "4444"), mustPut(t, "d", "5"),
		func(w *WriteBatch) {
			if r, err := w.DeleteRange(&pb.DeleteRangeRequest{Key: []byte("c")}); err != nil || r.Deleted != 1 {
				t.Fatalf("delete c: %v %v", r, err)
			}
		})
	if s.Rev() != 7 {
		t.Fatalf("fixture revision %d, want 7", s.Rev())
	}
	return s
}

func TestRangeOptions(t *testing.T) {
	s := rangeFixture(t)
	a := kv("a", "4444", 2, 5, 2)
	b := kv("b", "22", 3, 3, 1)
	d := kv("d", "5", 6, 6, 1)
	tests := []struct {
		name  string
		req   *pb.RangeRequest
		kvs   []*mvccpb.KeyValue
		count int64
		more  bool
		err   error
		rev   int64 // nonzero: the store with l=x (lease 3) at revision 8
	}{
		{name: "single key", req: &pb.RangeRequest{Key: []byte("a")}, kvs: []*mvccpb.KeyValue{a}, count: 1},
		{name: "deleted key", req: &pb.RangeRequest{Key: []byte("c")}, count: 0},
		{name: "range", req: &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("c")}, kvs: []*mvccpb.KeyValue{a, b}, count: 2},
		{name: "prefix", req: &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("b")}, kvs: []*mvccpb.KeyValue{a}, count: 1},
		{name: "from key", req: &pb.RangeRequest{Key: []byte("b"), RangeEnd: []byte{0}}, kvs: []*mvccpb.KeyValue{b, d}, count: 2},
		{name: "all keys", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}}, kvs: []*mvccpb.KeyValue{a, b, d}, count: 3},
		{name: "end before key", req: &pb.RangeRequest{Key: []byte("c"), RangeEnd: []byte("a")}, count: 0},
		{name: "limit and more", req: &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("z"), Limit: 1}, kvs: []*mvccpb.KeyValue{a}, count: 3, more: true},
		{name: "limit equal to count", req: &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("z"), Limit: 3}, kvs: []*mvccpb.KeyValue{a, b, d}, count: 3},
		{name: "count only", req: &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("z"), CountOnly: true}, count: 3},
		{name: "keys only", req: &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("c"), KeysOnly: true},
			kvs: []*mvccpb.KeyValue{kv("a", "", 2, 5, 2), kv("b", "", 3, 3, 1)}, count: 2},
		{name: "keys only drops the lease too (etcd's index has none)", req: &pb.RangeRequest{Key: []byte("l"), KeysOnly: true},
			kvs: []*mvccpb.KeyValue{kv("l", "", 8, 8, 1)}, count: 1, rev: 8},
		{name: "keys only sorted by value keeps the lease", req: &pb.RangeRequest{Key: []byte("l"), KeysOnly: true, SortTarget: pb.RangeRequest_VALUE},
			kvs: []*mvccpb.KeyValue{{Key: []byte("l"), CreateRevision: 8, ModRevision: 8, Version: 1, Lease: 3}}, count: 1, rev: 8},
		{name: "at revision 4", req: &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("z"), Revision: 4},
			kvs: []*mvccpb.KeyValue{kv("a", "1", 2, 2, 1), b, kv("c", "333", 4, 4, 1)}, count: 3},
		{name: "at revision 4 with limit", req: &pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("z"), Revision: 4, Limit: 2},
			kvs: []*mvccpb.KeyValue{kv("a", "1", 2, 2, 1), b}, count: 3, more: true},
		{name: "single key at revision 6", req: &pb.RangeRequest{Key: []byte("c"), Revision: 6}, kvs: []*mvccpb.KeyValue{kv("c", "333", 4, 4, 1)}, count: 1},
		{name: "at revision 1", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: 1}, count: 0},
		{name: "count only at revision 6", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: 6, CountOnly: true}, count: 4},
		{name: "future revision", req: &pb.RangeRequest{Key: []byte("a"), Revision: 8}, err: ErrFutureRev},
		{name: "sort by value descending", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, SortTarget: pb.RangeRequest_VALUE, SortOrder: pb.RangeRequest_DESCEND},
			kvs: []*mvccpb.KeyValue{d, a, b}, count: 3},
		{name: "sort by key descending", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, SortOrder: pb.RangeRequest_DESCEND},
			kvs: []*mvccpb.KeyValue{d, b, a}, count: 3},
		{name: "sort target mod, order none means ascending", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, SortTarget: pb.RangeRequest_MOD},
			kvs: []*mvccpb.KeyValue{b, a, d}, count: 3},
		{name: "sort by create descending", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, SortTarget: pb.RangeRequest_CREATE, SortOrder: pb.RangeRequest_DESCEND},
			kvs: []*mvccpb.KeyValue{d, b, a}, count: 3},
		{name: "sort by version descending", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, SortTarget: pb.RangeRequest_VERSION, SortOrder: pb.RangeRequest_DESCEND},
			kvs: []*mvccpb.KeyValue{a, b, d}, count: 3},
		{name: "sort applies before limit", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, SortOrder: pb.RangeRequest_DESCEND, Limit: 1},
			kvs: []*mvccpb.KeyValue{d}, count: 3, more: true},
		{name: "min mod revision; count ignores filters", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, MinModRevision: 4},
			kvs: []*mvccpb.KeyValue{a, d}, count: 3},
		{name: "max mod revision", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, MaxModRevision: 4}, kvs: []*mvccpb.KeyValue{b}, count: 3},
		{name: "min create revision", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, MinCreateRevision: 3}, kvs: []*mvccpb.KeyValue{b, d}, count: 3},
		{name: "max create revision", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, MaxCreateRevision: 3}, kvs: []*mvccpb.KeyValue{a, b}, count: 3},
		{name: "filter applies before limit", req: &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, MinModRevision: 4, Limit: 1},
			kvs: []*mvccpb.KeyValue{a}, count: 3, more: true},
	}
	withLease := rangeFixture(t)
	applyLeases(t, withLease, leaseFunc(func(id int64) bool { return id == 3 }), func(w *WriteBatch) {
		if _, err := w.Put(&pb.PutRequest{Key: []byte("l"), Value: []byte("x"), Lease: 3}); err != nil {
			t.Fatal(err)
		}
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, hdr := s, int64(7)
			if tt.rev != 0 {
				st, hdr = withLease, tt.rev
			}
			resp, err := st.Range(tt.req)
			if !errors.Is(err, tt.err) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
			if err != nil {
				return
			}
			want := &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: hdr}, Kvs: tt.kvs, Count: tt.count, More: tt.more}
			equalResp(t, "range", resp, want)
		})
	}
}

func TestRangeAfterCompaction(t *testing.T) {
	s := rangeFixture(t)
	s.Start()
	defer s.Close()
	var done <-chan struct{}
	apply(t, s, func(w *WriteBatch) {
		var err error
		if _, done, err = w.Compact(&pb.CompactionRequest{Revision: 5}); err != nil {
			t.Fatal(err)
		}
		// Reads later in the same batch already see the compaction.
		if _, err := w.Txn(&pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("a"), Revision: 4}}}}}); !errors.Is(err, ErrCompacted) {
			t.Fatalf("txn range below compaction in the same batch: err = %v", err)
		}
	})
	<-done
	for _, tt := range []struct {
		rev  int64
		want []*mvccpb.KeyValue
		err  error
	}{
		{rev: 4, err: ErrCompacted},
		{rev: 5, want: []*mvccpb.KeyValue{kv("a", "4444", 2, 5, 2), kv("b", "22", 3, 3, 1), kv("c", "333", 4, 4, 1)}},
		{rev: 6, want: []*mvccpb.KeyValue{kv("a", "4444", 2, 5, 2), kv("b", "22", 3, 3, 1), kv("c", "333", 4, 4, 1), kv("d", "5", 6, 6, 1)}},
	} {
		resp, err := s.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: tt.rev})
		if !errors.Is(err, tt.err) {
			t.Fatalf("rev %d: err = %v, want %v", tt.rev, err, tt.err)
		}
		if err == nil {
			equalResp(t, fmt.Sprintf("range at %d", tt.rev), resp, &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: 7}, Kvs: tt.want, Count: int64(len(tt.want))})
		}
	}
	if s.CompactRev() != 5 {
		t.Fatalf("CompactRev = %d, want 5", s.CompactRev())
	}
}

func txnOf(cmp []*pb.Compare, success, failure []*pb.RequestOp) *pb.TxnRequest {
	return &pb.TxnRequest{Compare: cmp, Success: success, Failure: failure}
}

func TestTxn(t *testing.T) {
	leases := map[int64]bool{7: true}
	tests := []struct {
		name    string
		req     *pb.TxnRequest
		err     error
		rev     int64 // store revision after the request (fixture: 7)
		succ    bool
		respRev int64
	}{
		{name: "compare version true, put", rev: 8, succ: true, respRev: 8, req: txnOf(
			[]*pb.Compare{{Key: []byte("a"), Target: pb.Compare_VERSION, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Version{Version: 2}}},
			[]*pb.RequestOp{put("x", "1")}, nil)},
		{name: "compare false, failure branch reads only", rev: 7, respRev: 7, req: txnOf(
			[]*pb.Compare{{Key: []byte("a"), Target: pb.Compare_VALUE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Value{Value: []byte("nope")}}},
			[]*pb.RequestOp{put("x", "1")}, []*pb.RequestOp{rng("a", "")})},
		{name: "value compare on a missing key fails", rev: 7, respRev: 7, req: txnOf(
			[]*pb.Compare{{Key: []byte("zz"), Target: pb.Compare_VALUE, Result: pb.Compare_NOT_EQUAL, TargetUnion: &pb.Compare_Value{Value: []byte("x")}}},
			[]*pb.RequestOp{put("x", "1")}, nil)},
		{name: "create == 0 on a missing key holds", rev: 8, succ: true, respRev: 8, req: txnOf(
			[]*pb.Compare{{Key: []byte("zz"), Target: pb.Compare_CREATE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_CreateRevision{CreateRevision: 0}}},
			[]*pb.RequestOp{put("zz", "1")}, nil)},
		{name: "compare over a range: every key must match", rev: 7, respRev: 7, req: txnOf(
			[]*pb.Compare{{Key: []byte("a"), RangeEnd: []byte("z"), Target: pb.Compare_VERSION, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Version{Version: 1}}},
			[]*pb.RequestOp{put("x", "1")}, nil)},
		{name: "delete of nothing takes no revision", rev: 7, succ: true, respRev: 7, req: txnOf(nil, []*pb.RequestOp{del("nothing", "")}, nil)},
		{name: "missing lease fails the whole txn", err: ErrLeaseNotFound, rev: 7, req: txnOf(nil,
			[]*pb.RequestOp{put("x", "1"), {Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("y"), Lease: 9}}}}, nil)},
		{name: "existing lease", rev: 8, succ: true, respRev: 8, req: txnOf(nil,
			[]*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("y"), Lease: 7}}}}, nil)},
		{name: "future range revision fails the whole txn", err: ErrFutureRev, rev: 7, req: txnOf(nil,
			[]*pb.RequestOp{put("x", "1"), {Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("a"), Revision: 9}}}}, nil)},
		{name: "ignore_value on a missing key", err: ErrKeyNotFound, rev: 7, req: txnOf(nil,
			[]*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("zz"), IgnoreValue: true}}}}, nil)},
		{name: "nested txn", rev: 8, succ: true, respRev: 8, req: txnOf(nil, []*pb.RequestOp{put("x", "1"),
			{Request: &pb.RequestOp_RequestTxn{RequestTxn: txnOf(
				[]*pb.Compare{{Key: []byte("x"), Target: pb.Compare_CREATE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_CreateRevision{CreateRevision: 0}}},
				[]*pb.RequestOp{put("y", "2")}, []*pb.RequestOp{put("y", "3")})}}}, nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := rangeFixture(t)
			var resp *pb.TxnResponse
			var err error
			applyLeases(t, s, leaseFunc(func(id int64) bool { return leases[id] }), func(w *WriteBatch) { resp, err = w.Txn(tt.req) })
			if !errors.Is(err, tt.err) {
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
			if s.Rev() != tt.rev {
				t.Fatalf("revision after txn = %d, want %d", s.Rev(), tt.rev)
			}
			if err != nil {
				if r, _ := s.Range(&pb.RangeRequest{Key: []byte("x")}); r.Count != 0 {
					t.Fatalf("a failed txn wrote x")
				}
				return
			}
			if resp.Succeeded != tt.succ || resp.Header.Revision != tt.respRev {
				t.Fatalf("succeeded %v header revision %d, want %v %d", resp.Succeeded, resp.Header.Revision, tt.succ, tt.respRev)
			}
		})
	}
}

func TestNestedTxnSeesEarlierWritesAndComparesBefore(t *testing.T) {
	s := rangeFixture(t)
	// Compares, nested ones too, see the state before the transaction: x
	// does not exist yet when the nested compare is evaluated, although the
	// outer put of x executes first.
	req := txnOf(nil, []*pb.RequestOp{put("x", "1"),
		{Request: &pb.RequestOp_RequestTxn{RequestTxn: txnOf(
			[]*pb.Compare{{Key: []byte("x"), Target: pb.Compare_CREATE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_CreateRevision{CreateRevision: 0}}},
			[]*pb.RequestOp{put("y", "2"), rng("x", "")}, nil)}},
		del("a", "")}, nil)
	var resp *pb.TxnResponse
	apply(t, s, func(w *WriteBatch) {
		var err error
		if resp, err = w.Txn(req); err != nil {
			t.Fatal(err)
		}
	})
	nested := resp.Responses[1].GetResponseTxn()
	if !nested.Succeeded {
		t.Fatal("nested compare saw the outer put")
	}
	got := nested.Responses[1].GetResponseRange()
	want := &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: 8}, Kvs: []*mvccpb.KeyValue{kv("x", "1", 8, 8, 1)}, Count: 1}
	equalResp(t, "range inside nested txn", got, want)
	if d := resp.Responses[2].GetResponseDeleteRange(); d.Deleted != 1 || d.Header.Revision != 8 {
		t.Fatalf("delete in txn = %v", d)
	}
	// Sub-revisions: x@8.0, y@8.1, a's tombstone @8.2; one revision in all.
	if s.Rev() != 8 {
		t.Fatalf("revision %d, want 8", s.Rev())
	}
	h, err := s.Range(&pb.RangeRequest{Key: []byte("a"), Revision: 7})
	if err != nil || h.Count != 1 {
		t.Fatalf("a at 7: %v %v", h, err)
	}
}

func TestPutOptionsAndLeaseKeys(t *testing.T) {
	s := rangeFixture(t)
	leases := leaseFunc(func(id int64) bool { return id == 5 || id == 6 })
	applyLeases(t, s, leases, func(w *WriteBatch) {
		if _, err := w.Put(&pb.PutRequest{Key: []byte("a"), Value: []byte("v"), Lease: 5}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Put(&pb.PutRequest{Key: []byte("b"), Lease: 5, IgnoreValue: true}); err != nil {
			t.Fatal(err)
		}
		r, err := w.Put(&pb.PutRequest{Key: []byte("a"), Value: []byte("w"), IgnoreLease: true, PrevKv: true})
		if err != nil {
			t.Fatal(err)
		}
		equalResp(t, "prev kv", r.PrevKv, &mvccpb.KeyValue{Key: []byte("a"), Value: []byte("v"), CreateRevision: 2, ModRevision: 8, Version: 3, Lease: 5})
		if _, err := w.Put(&pb.PutRequest{Key: []byte("q"), Lease: 4}); !errors.Is(err, ErrLeaseNotFound) {
			t.Fatalf("put with missing lease: %v", err)
		}
		if _, err := w.Put(&pb.PutRequest{Key: []byte("q"), IgnoreLease: true}); !errors.Is(err, ErrKeyNotFound) {
			t.Fatalf("ignore_lease on missing key: %v", err)
		}
	})
	r, _ := s.Range(&pb.RangeRequest{Key: []byte("a"), RangeEnd: []byte("c")})
	equalResp(t, "after puts", r, &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: 10}, Count: 2, Kvs: []*mvccpb.KeyValue{
		{Key: []byte("a"), Value: []byte("w"), CreateRevision: 2, ModRevision: 10, Version: 4, Lease: 5},
		{Key: []byte("b"), Value: []byte("22"), CreateRevision: 3, ModRevision: 9, Version: 2, Lease: 5},
	}})
	keys, err := s.LeaseKeys(5)
	if err != nil || fmt.Sprintf("%q", keys) != `["a" "b"]` {
		t.Fatalf("LeaseKeys(5) = %q, %v", keys, err)
	}
	applyLeases(t, s, leases, func(w *WriteBatch) {
		if _, err := w.Put(&pb.PutRequest{Key: []byte("a"), Lease: 6}); err != nil {
			t.Fatal(err)
		}
		if _, err := w.DeleteRange(&pb.DeleteRangeRequest{Key: []byte("b")}); err != nil {
			t.Fatal(err)
		}
	})
	if keys, _ := s.LeaseKeys(5); len(keys) != 0 {
		t.Fatalf("LeaseKeys(5) after moves = %q", keys)
	}
	if keys, _ := s.LeaseKeys(6); fmt.Sprintf("%q", keys) != `["a"]` {
		t.Fatalf("LeaseKeys(6) = %q", keys)
	}
}

func TestMetaAndReadTxn(t *testing.T) {
	s := rangeFixture(t)
	apply(t, s, func(w *WriteBatch) {
		if err := w.SetMeta("conf", []byte("c1")); err != nil {
			t.Fatal(err)
		}
	})
	if v, err := s.Meta("conf"); err != nil || string(v) != "c1" {
		t.Fatalf("Meta = %q, %v", v, err)
	}
	if v, err := s.Meta("none"); err != nil || v != nil {
		t.Fatalf("Meta(none) = %q, %v", v, err)
	}
	resp, err := s.ReadTxn(txnOf(nil, []*pb.RequestOp{rng("a", "")}, nil))
	if err != nil || resp.Header.Revision != 7 || len(resp.Responses[0].GetResponseRange().Kvs) != 1 {
		t.Fatalf("ReadTxn = %v, %v", resp, err)
	}
	if _, err := s.ReadTxn(txnOf(nil, []*pb.RequestOp{put("a", "")}, nil)); err == nil {
		t.Fatal("ReadTxn accepted a write")
	}
}

// countingEngine counts the engine reads Open makes.
type countingEngine struct {
	engine.Engine
	reads int
}

func (c *countingEngine) Get(key []byte) ([]byte, error) {
	c.reads++
	return c.Engine.Get(key)
}

func (c *countingEngine) NewIter(lower, upper []byte) engine.Iterator {
	c.reads++
	return c.Engine.NewIter(lower, upper)
}

func (c *countingEngine) NewSnapshot() engine.Snapshot {
	c.reads++
	return c.Engine.NewSnapshot()
}

// TestOpenReadsConstant: opening a store reads the same handful of engine
// keys whatever the number of keys, and restart keeps everything.
func TestOpenReadsConstant(t *testing.T) {
	var reads []int
	for _, n := range []int{10, 3000} {
		fs := vfs.NewMem()
		e, err := epebble.Open("db", epebble.Options{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		s, err := Open(e, Options{})
		if err != nil {
			t.Fatal(err)
		}
		w := s.Write(nil)
		for i := range n {
			if _, err := w.Put(&pb.PutRequest{Key: fmt.Appendf(nil, "key%06d", i), Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := w.Compact(&pb.CompactionRequest{Revision: int64(n / 2)}); err != nil {
			t.Fatal(err)
		}
		if err := w.Commit(1); err != nil {
			t.Fatal(err)
		}
		before, _, _, err := s.HashKV(0)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		e, err = epebble.Open("db", epebble.Options{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		ce := &countingEngine{Engine: e}
		s, err = Open(ce, Options{})
		if err != nil {
			t.Fatal(err)
		}
		reads = append(reads, ce.reads)
		if s.Rev() != int64(n+1) || s.CompactRev() != int64(n/2) {
			t.Fatalf("after reopen rev/compact = %d/%d", s.Rev(), s.CompactRev())
		}
		after, _, _, err := s.HashKV(0)
		if err != nil || after != before {
			t.Fatalf("HashKV after reopen = %x (%v), before %x", after, err, before)
		}
		// The pending physical compaction resumes after a restart.
		s.Start()
		<-s.CompactDone(int64(n / 2))
		s.Close()
		e.Close()
	}
	if reads[0] != reads[1] || reads[0] > 4 {
		t.Fatalf("Open made %v engine reads for 10 and 3000 keys; want equal and few", reads)
	}
}

func TestWriteBatchAbortLeavesNothing(t *testing.T) {
	s := rangeFixture(t)
	w := s.Write(nil)
	if _, err := w.Put(&pb.PutRequest{Key: []byte("x"), Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	if w.Rev() != 8 {
		t.Fatalf("batch revision %d, want 8", w.Rev())
	}
	w.Abort()
	if s.Rev() != 7 {
		t.Fatalf("revision after abort %d", s.Rev())
	}
	r, _ := s.Range(&pb.RangeRequest{Key: []byte("x")})
	if r.Count != 0 {
		t.Fatal("aborted put is visible")
	}

}

// TestCompactionKeepsDeletionAtCompactRevision: a deletion at exactly the
// compact revision stays (a watch from that revision must see it) until the
// next compaction drops it.
func TestCompactionKeepsDeletionAtCompactRevision(t *testing.T) {
	s := rangeFixture(t) // c deleted at 7
	s.Start()
	defer s.Close()
	history := func(key string) int { return countVersions(t, s.e, []byte(key)) }
	compact := func(rev int64) {
		var done <-chan struct{}
		apply(t, s, func(w *WriteBatch) {
			var err error
			if _, done, err = w.Compact(&pb.CompactionRequest{Revision: rev}); err != nil {
				t.Fatal(err)
			}
		})
		<-done
	}
	compact(7)
	if n := history("c"); n != 1 {
		t.Fatalf("after compaction at 7, c has %d history entries, want its deletion at 7", n)
	}
	if n := history("a"); n != 1 {
		t.Fatalf("after compaction at 7, a has %d history entries, want 1", n)
	}
	apply(t, s, mustPut(t, "x", "1"))
	compact(8)
	if n := history("c"); n != 0 {
		t.Fatalf("after compaction at 8, c has %d history entries, want none", n)
	}
}

// TestChangesRefusesCompactedRange: Changes (what log compaction builds a
// batch from) refuses a revision range once the compact revision is past
// its first revision, since physical compaction may have removed a
// deletion or an overwritten version of it; a range compaction cannot
// touch is answered in full.
func TestChangesRefusesCompactedRange(t *testing.T) {
	s := rangeFixture(t) // rev 2 a=1, 3 b=22, 4 c=333, 5 a=4444, 6 d=5, 7 delete c
	s.Start()
	defer s.Close()
	var done <-chan struct{}
	apply(t, s, func(w *WriteBatch) {
		var err error
		if _, done, err = w.Compact(&pb.CompactionRequest{Revision: 5}); err != nil {
			t.Fatal(err)
		}
	})
	<-done
	for _, tc := range []struct {
		from, to int64
		refused  bool
		changes  int
	}{
		{from: 1, to: 7, refused: true},  // a=1 at 2 is gone
		{from: 3, to: 7, refused: true},  // c=333 at 4 is kept, but 4 < 5
		{from: 4, to: 7, changes: 3},     // 5, 6, 7: compaction at 5 removes below 5 only
		{from: 6, to: 7, changes: 1},     // the deletion of c
		{from: 7, to: 7, changes: 0},     // an empty range
		{from: 1, to: 1, refused: false}, // empty too: nothing to read
	} {
		got, err := s.Changes(tc.from, tc.to)
		if refused := errors.Is(err, ErrChangesCompacted); refused != tc.refused {
			t.Fatalf("Changes(%d, %d) = %v, refused %v, want %v", tc.from, tc.to, err, refused, tc.refused)
		}
		if !tc.refused && (err != nil || len(got) != tc.changes) {
			t.Fatalf("Changes(%d, %d) = %d changes, %v; want %d", tc.from, tc.to, len(got), err, tc.changes)
		}
	}
}

// leaseFunc is a set of leases given by its membership test.
type leaseFunc func(id int64) bool

// Exists implements Leases.
func (f leaseFunc) Exists(id int64) bool { return f(id) }
