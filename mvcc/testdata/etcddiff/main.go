// Command etcddiff runs random requests against strata's mvcc package and
// against etcd's own mvcc and txn packages (v3.7.3) side by side, and
// reports the first answer, error, revision or HashKV that differs.
//
// It lives in its own module under testdata because the strata module must
// not depend on etcd's server module. Run it from this directory:
//
//	go run .
//
// Requests etcd's gRPC layer would refuse (duplicate puts in a txn, a put
// inside a range the same txn deletes) are not sent: etcd's mvcc misbehaves
// on them. HashKV is not compared where etcd answers from its compaction
// hash cache or where no key is live (etcd then hashes whatever its
// compaction left on disk).
package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/pkg/v3/traceutil"
	"go.etcd.io/etcd/server/v3/etcdserver/txn"
	"go.etcd.io/etcd/server/v3/lease"
	"go.etcd.io/etcd/server/v3/storage/backend"
	emvcc "go.etcd.io/etcd/server/v3/storage/mvcc"
	"go.etcd.io/etcd/server/v3/storage/schema"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	epebble "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/mvcc"
)

type lessor struct{ lease.FakeLessor }

func (l *lessor) Lookup(id lease.LeaseID) *lease.Lease {
	if id < 100 {
		return &lease.Lease{ID: id}
	}
	return nil
}

var keys = []string{"a", "a\x00b", "b", "c", "d", "e", "foo/1", "foo/2"}

// key is mostly one of a few keys (so requests collide), sometimes one of
// forty more (so sorts see more than twelve keys, where sort.Sort stops
// being an insertion sort and the order of ties depends on the algorithm).
func key(r *rand.Rand) []byte {
	if r.IntN(3) == 0 {
		return fmt.Appendf(nil, "g/%02d", r.IntN(40))
	}
	return []byte(keys[r.IntN(len(keys))])
}

func rangeEnd(r *rand.Rand, k []byte) []byte {
	switch r.IntN(5) {
	case 0, 1:
		return nil
	case 2:
		return []byte{0}
	case 3:
		return append(append([]byte(nil), k...), 0xff)
	default:
		return key(r)
	}
}

func randRange(r *rand.Rand, cur, comp int64) *pb.RangeRequest {
	k := key(r)
	if r.IntN(6) == 0 {
		k = []byte{0}
	}
	req := &pb.RangeRequest{Key: k, RangeEnd: rangeEnd(r, k)}
	if r.IntN(3) == 0 {
		req.Revision = comp - 1 + r.Int64N(cur-comp+3)
	}
	if r.IntN(3) == 0 {
		req.Limit = r.Int64N(4)
	}
	if r.IntN(3) == 0 {
		req.SortOrder = pb.RangeRequest_SortOrder(r.IntN(3))
		req.SortTarget = pb.RangeRequest_SortTarget(r.IntN(5))
	}
	req.CountOnly = r.IntN(8) == 0
	req.KeysOnly = r.IntN(6) == 0
	if r.IntN(5) == 0 {
		req.MinModRevision = r.Int64N(cur + 1)
	}
	if r.IntN(5) == 0 {
		req.MaxModRevision = r.Int64N(cur + 1)
	}
	if r.IntN(5) == 0 {
		req.MinCreateRevision = r.Int64N(cur + 1)
	}
	if r.IntN(5) == 0 {
		req.MaxCreateRevision = r.Int64N(cur + 1)
	}
	return req
}

func randPut(r *rand.Rand) *pb.PutRequest {
	p := &pb.PutRequest{Key: key(r), Value: fmt.Appendf(nil, "v%d", r.IntN(50)), PrevKv: r.IntN(2) == 0}
	if r.IntN(5) == 0 {
		p.Lease = int64(r.IntN(120))
	}
	if r.IntN(8) == 0 {
		p.IgnoreValue = true
		p.Value = nil
	}
	if r.IntN(8) == 0 && p.Lease == 0 {
		p.IgnoreLease = true
	}
	return p
}

func randDel(r *rand.Rand) *pb.DeleteRangeRequest {
	k := key(r)
	return &pb.DeleteRangeRequest{Key: k, RangeEnd: rangeEnd(r, k), PrevKv: r.IntN(2) == 0}
}

func randTxn(r *rand.Rand, cur, comp int64, depth int) *pb.TxnRequest {
	t := &pb.TxnRequest{}
	for range r.IntN(3) {
		c := &pb.Compare{Key: key(r), Result: pb.Compare_CompareResult(r.IntN(4)), Target: pb.Compare_CompareTarget(r.IntN(5))}
		if r.IntN(4) == 0 {
			c.RangeEnd = rangeEnd(r, c.Key)
		}
		n := r.Int64N(cur + 1)
		switch c.Target {
		case pb.Compare_VERSION:
			c.TargetUnion = &pb.Compare_Version{Version: r.Int64N(4)}
		case pb.Compare_CREATE:
			c.TargetUnion = &pb.Compare_CreateRevision{CreateRevision: n}
		case pb.Compare_MOD:
			c.TargetUnion = &pb.Compare_ModRevision{ModRevision: n}
		case pb.Compare_VALUE:
			c.TargetUnion = &pb.Compare_Value{Value: fmt.Appendf(nil, "v%d", r.IntN(50))}
		case pb.Compare_LEASE:
			c.TargetUnion = &pb.Compare_Lease{Lease: int64(r.IntN(3))}
		}
		t.Compare = append(t.Compare, c)
	}
	ops := func() []*pb.RequestOp {
		var out []*pb.RequestOp
		for range r.IntN(4) {
			switch r.IntN(4) {
			case 0:
				out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: randPut(r)}})
			case 1:
				out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: randDel(r)}})
			case 2:
				out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: randRange(r, cur, comp)}})
			default:
				if depth < 2 {
					out = append(out, &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: randTxn(r, cur, comp, depth+1)}})
				}
			}
		}
		return out
	}
	t.Success, t.Failure = ops(), ops()
	return t
}

// hasDupPuts: etcd's gRPC layer refuses txns that put one key twice; skip them.
func hasDupPuts(t *pb.TxnRequest) bool {
	for _, ops := range [][]*pb.RequestOp{t.Success, t.Failure} {
		seen := map[string]bool{}
		var walk func(ops []*pb.RequestOp) bool
		walk = func(ops []*pb.RequestOp) bool {
			for _, op := range ops {
				if p := op.GetRequestPut(); p != nil {
					if seen[string(p.Key)] {
						return true
					}
					seen[string(p.Key)] = true
				}
				if d := op.GetRequestDeleteRange(); d != nil {
					// keep it simple: deletes and puts of overlapping keys are refused too
					if seen["del"] {
						return true
					}
					seen["del"] = true
				}
				if n := op.GetRequestTxn(); n != nil {
					if hasDupPuts(n) {
						return true
					}
				}
			}
			return false
		}
		if walk(ops) {
			return true
		}
	}
	return false
}

func errStr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func main() {
	seeds := 60
	steps := 400
	failures := 0
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		if err := run(seed, steps); err != nil {
			fmt.Println("seed", seed, ":", err)
			failures++
			if failures > 3 {
				break
			}
		}
	}
	if failures > 0 {
		os.Exit(1)
	}
	fmt.Println("all seeds agree")
}

func run(seed uint64, steps int) error {
	r := rand.New(rand.NewPCG(seed, 42))
	dir, _ := os.MkdirTemp("", "difftest")
	defer os.RemoveAll(dir)
	lg := zap.NewNop()
	be := backend.NewDefaultBackend(lg, filepath.Join(dir, "bolt.db"))
	defer be.Close()
	le := &lessor{}
	es := emvcc.NewStore(lg, be, le, emvcc.StoreConfig{})
	defer es.Close()

	eng, err := epebble.Open("db", epebble.Options{FS: vfs.NewMem()})
	if err != nil {
		return err
	}
	defer eng.Close()
	ss, err := mvcc.Open(eng, mvcc.Options{CompactChunk: 3})
	if err != nil {
		return err
	}
	ss.Start()
	defer ss.Close()
	ctx := context.Background()
	idx := uint64(0)
	comp := int64(0)
	compacted := map[int64]bool{} // etcd answers HashKV at these from a cache (hash of (prev compact, rev])
	for step := 0; step < steps; step++ {
		cur := ss.Rev()
		var what string
		var eResp, sResp proto.Message
		var eErr, sErr error
		w := ss.Write(leasesBelow100{})
		switch op := r.IntN(12); {
		case op < 3:
			req := randPut(r)
			what = fmt.Sprintf("put %v", req)
			eResp, _, eErr = txn.Put(ctx, lg, le, es, req)
			sResp, sErr = w.Put(req)
		case op < 5:
			req := randDel(r)
			what = fmt.Sprintf("delete %v", req)
			eResp, _, eErr = txn.DeleteRange(ctx, lg, es, req)
			sResp, sErr = w.DeleteRange(req)
		case op < 8:
			req := randRange(r, cur, comp)
			what = fmt.Sprintf("range %v", req)
			eResp, _, eErr = txn.Range(ctx, lg, es, req, true)
			sResp, sErr = ss.Range(req)
		case op < 11:
			req := randTxn(r, cur, comp, 0)
			if hasDupPuts(req) || hasIgnoreAndDelete(req) || putInDelete(req) {
				w.Abort()
				continue
			}
			what = fmt.Sprintf("txn %v", req)
			eResp, _, eErr = txn.Txn(ctx, lg, req, false, es, le, false)
			sResp, sErr = w.Txn(req)
		default:
			rev := comp + r.Int64N(cur-comp+2)
			what = fmt.Sprintf("compact %d", rev)
			var ch <-chan struct{}
			ch, eErr = es.Compact(traceutil.TODO(), rev)
			if eErr == nil {
				<-ch
				comp = rev
				compacted[rev] = true
			}
			_, _, sErr = w.Compact(&pb.CompactionRequest{Revision: rev})
		}
		idx++
		if err := w.Commit(idx); err != nil {
			return err
		}
		if errStr(eErr) != errStr(sErr) {
			return fmt.Errorf("step %d %s:\n etcd err %v\n strata err %v", step, what, eErr, sErr)
		}
		if eErr == nil && eResp != nil && !proto.Equal(eResp, sResp) {
			return fmt.Errorf("step %d %s:\n etcd   %v\n strata %v", step, what, eResp, sResp)
		}
		if es.Rev() != ss.Rev() {
			return fmt.Errorf("step %d %s: rev etcd %d strata %d", step, what, es.Rev(), ss.Rev())
		}
		if r.IntN(4) == 0 {
			hrev := int64(0)
			if r.IntN(2) == 0 {
				hrev = max(comp, 1) + r.Int64N(ss.Rev()-max(comp, 1)+1)
			}
			if compacted[hrev] || (hrev == 0 && compacted[ss.Rev()]) {
				continue
			}
			// With no live key at hrev etcd hashes whatever its compaction
			// left on disk (a quirk strata does not copy).
			if all, _ := ss.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: hrev, CountOnly: true}); all.GetCount() == 0 {
				continue
			}
			eh, _, eErr := es.HashStorage().HashByRev(hrev)
			sh, shRev, sComp, sErr := ss.HashKV(hrev)
			if errStr(eErr) != errStr(sErr) || eh.Hash != sh || (eErr == nil && (eh.Revision != shRev || eh.CompactRevision != sComp)) {
				dump(be, eng, hrev)
				all, _ := ss.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: hrev})
				return fmt.Errorf("live keys at %d: %d; step %d: HashKV(%d): etcd %+v %v, strata %x rev %d compact %d %v", hrev, all.GetCount(), step, hrev, eh, eErr, sh, shRev, sComp, sErr)
			}
		}
	}
	return nil
}

// hasIgnoreAndDelete: an ignore_value/ignore_lease put after a delete of the
// same key crashes etcd's apply (its gRPC layer refuses such txns).
func hasIgnoreAndDelete(t *pb.TxnRequest) bool {
	var ign, del bool
	var walk func(t *pb.TxnRequest)
	walk = func(t *pb.TxnRequest) {
		for _, ops := range [][]*pb.RequestOp{t.Success, t.Failure} {
			for _, op := range ops {
				if p := op.GetRequestPut(); p != nil && (p.IgnoreValue || p.IgnoreLease) {
					ign = true
				}
				if op.GetRequestDeleteRange() != nil {
					del = true
				}
				if n := op.GetRequestTxn(); n != nil {
					walk(n)
				}
			}
		}
	}
	walk(t)
	return ign && del
}

func dump(be backend.Backend, eng *epebble.Engine, rev int64) {
	tx := be.ReadTx()
	tx.RLock()
	fmt.Println("etcd bolt:")
	tx.UnsafeForEach(schema.Key, func(k, v []byte) error {
		kv := &mvccpb.KeyValue{}
		proto.Unmarshal(v, kv)
		fmt.Printf("  %x %q\n", k, kv.String())
		return nil
	})
	tx.RUnlock()
	fmt.Println("strata rev index:")
	it := eng.NewIter([]byte("mr"), []byte("ms"))
	for ok := it.First(); ok; ok = it.Next() {
		fmt.Printf("  %x %q\n", it.Key()[2:], it.Value())
	}
	it.Close()
}

// putInDelete: etcd's gRPC layer refuses a txn that puts a key some delete
// in it covers (checkIntervals); its mvcc then loses the put at compaction.
func putInDelete(t *pb.TxnRequest) bool {
	var puts [][]byte
	var dels [][2][]byte
	var walk func(t *pb.TxnRequest)
	walk = func(t *pb.TxnRequest) {
		for _, ops := range [][]*pb.RequestOp{t.Success, t.Failure} {
			for _, op := range ops {
				if p := op.GetRequestPut(); p != nil {
					puts = append(puts, p.Key)
				}
				if d := op.GetRequestDeleteRange(); d != nil {
					dels = append(dels, [2][]byte{d.Key, d.RangeEnd})
				}
				if n := op.GetRequestTxn(); n != nil {
					walk(n)
				}
			}
		}
	}
	walk(t)
	for _, p := range puts {
		for _, d := range dels {
			switch {
			case d[1] == nil:
				if string(p) == string(d[0]) {
					return true
				}
			case len(d[1]) == 1 && d[1][0] == 0:
				if string(p) >= string(d[0]) {
					return true
				}
			default:
				if string(p) >= string(d[0]) && string(p) < string(d[1]) {
					return true
				}
			}
		}
	}
	return false
}

// leasesBelow100 holds every lease whose ID is below 100.
type leasesBelow100 struct{}

// Exists implements mvcc.Leases.
func (leasesBelow100) Exists(id int64) bool { return id < 100 }
