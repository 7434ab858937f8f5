package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// Limits both servers run with in the conformance test, small so that the
// "too large" and "too many ops" cases are cheap to build.
const (
	maxRequestBytes = 16 * 1024
	maxTxnOps       = 16
)

// limitFlags are the flags that set those limits, with etcd's names.
var limitFlags = []string{
	fmt.Sprintf("--max-request-bytes=%d", maxRequestBytes),
	fmt.Sprintf("--max-txn-ops=%d", maxTxnOps),
}

// apis are the raw gRPC clients a step talks to: no clientv3 in between,
// so every request field is sent as written and nothing is retried.
type apis struct {
	kv    pb.KVClient
	lease pb.LeaseClient
}

// step is one request of the conformance table.
type step struct {
	name string
	do   func(ctx context.Context, c apis) (proto.Message, error)
}

func putStep(name string, r *pb.PutRequest) step {
	return step{name, func(ctx context.Context, c apis) (proto.Message, error) { return c.kv.Put(ctx, r) }}
}

func rangeStep(name string, r *pb.RangeRequest) step {
	return step{name, func(ctx context.Context, c apis) (proto.Message, error) { return c.kv.Range(ctx, r) }}
}

func delStep(name string, r *pb.DeleteRangeRequest) step {
	return step{name, func(ctx context.Context, c apis) (proto.Message, error) { return c.kv.DeleteRange(ctx, r) }}
}

func txnStep(name string, r *pb.TxnRequest) step {
	return step{name, func(ctx context.Context, c apis) (proto.Message, error) { return c.kv.Txn(ctx, r) }}
}

func compactStep(name string, r *pb.CompactionRequest) step {
	return step{name, func(ctx context.Context, c apis) (proto.Message, error) { return c.kv.Compact(ctx, r) }}
}

func grantStep(name string, r *pb.LeaseGrantRequest) step {
	return step{name, func(ctx context.Context, c apis) (proto.Message, error) { return c.lease.LeaseGrant(ctx, r) }}
}

// Request-building shorthands, to keep the table readable.

func b(s string) []byte { return []byte(s) }

func opPut(k, v string) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: b(k), Value: b(v)}}}
}

func opRange(r *pb.RangeRequest) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: r}}
}

func opGet(k string) *pb.RequestOp { return opRange(&pb.RangeRequest{Key: b(k)}) }

func opDel(k, end string) *pb.RequestOp {
	r := &pb.DeleteRangeRequest{Key: b(k)}
	if end != "" {
		r.RangeEnd = b(end)
	}
	return &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: r}}
}

func opTxn(r *pb.TxnRequest) *pb.RequestOp {
	return &pb.RequestOp{Request: &pb.RequestOp_RequestTxn{RequestTxn: r}}
}

// all is a range over every key.
func all() *pb.RangeRequest { return &pb.RangeRequest{Key: b("\x00"), RangeEnd: b("\x00")} }

// leaseID is the lease the table grants with an explicit ID, so that both
// servers hold the same ID.
const leaseID = 1000

// compareTargets builds, for every compare target and result, a read-only
// Txn on key "d" (value "1", lease leaseID, and the given version, create
// and mod revisions) against the key's own value and against a smaller one,
// so each result is seen both true and false.
func compareTargets(version, create, mod int64) []step {
	targets := []struct {
		name        string
		target      pb.Compare_CompareTarget
		same, lower func(c *pb.Compare)
	}{
		{"value", pb.Compare_VALUE,
			func(c *pb.Compare) { c.TargetUnion = &pb.Compare_Value{Value: b("1")} },
			func(c *pb.Compare) { c.TargetUnion = &pb.Compare_Value{Value: b("0")} }},
		{"version", pb.Compare_VERSION,
			func(c *pb.Compare) { c.TargetUnion = &pb.Compare_Version{Version: version} },
			func(c *pb.Compare) { c.TargetUnion = &pb.Compare_Version{Version: version - 1} }},
		{"create", pb.Compare_CREATE,
			func(c *pb.Compare) { c.TargetUnion = &pb.Compare_CreateRevision{CreateRevision: create} },
			func(c *pb.Compare) { c.TargetUnion = &pb.Compare_CreateRevision{CreateRevision: create - 1} }},
		{"mod", pb.Compare_MOD,
			func(c *pb.Compare) { c.TargetUnion = &pb.Compare_ModRevision{ModRevision: mod} },
			func(c *pb.Compare) { c.TargetUnion = &pb.Compare_ModRevision{ModRevision: mod - 1} }},
		{"lease", pb.Compare_LEASE,
			func(c *pb.Compare) { c.TargetUnion = &pb.Compare_Lease{Lease: leaseID} },
			func(c *pb.Compare) { c.TargetUnion = &pb.Compare_Lease{Lease: leaseID - 1} }},
	}
	results := []struct {
		name   string
		result pb.Compare_CompareResult
	}{{"=", pb.Compare_EQUAL}, {"!=", pb.Compare_NOT_EQUAL}, {"<", pb.Compare_LESS}, {">", pb.Compare_GREATER}}
	var steps []step
	for _, tg := range targets {
		for _, rs := range results {
			for _, side := range []struct {
				name string
				set  func(*pb.Compare)
			}{{"same", tg.same}, {"lower", tg.lower}} {
				c := &pb.Compare{Key: b("d"), Target: tg.target, Result: rs.result}
				side.set(c)
				steps = append(steps, txnStep(fmt.Sprintf("txn compare %s(d) %s %s", tg.name, rs.name, side.name), &pb.TxnRequest{
					Compare: []*pb.Compare{c},
					Success: []*pb.RequestOp{opGet("d")},
					Failure: []*pb.RequestOp{opGet("a")},
				}))
			}
		}
	}
	return steps
}

// conformanceSteps is the ordered table. Revisions in comments are what a
// fresh etcd answers; the test does not rely on them except to pick
// revisions that are old, current, future or compacted at that point.
func conformanceSteps() []step {
	steps := []step{
		rangeStep("range on empty store", &pb.RangeRequest{Key: b("a")}),
		putStep("put a=1", &pb.PutRequest{Key: b("a"), Value: b("1")}),                                      // rev 2
		putStep("put a=2 prev_kv", &pb.PutRequest{Key: b("a"), Value: b("2"), PrevKv: true}),                // rev 3
		putStep("put b=1", &pb.PutRequest{Key: b("b"), Value: b("1")}),                                      // rev 4
		putStep("put c=1 prev_kv of missing key", &pb.PutRequest{Key: b("c"), Value: b("1"), PrevKv: true}), // rev 5
		putStep("put foo/1", &pb.PutRequest{Key: b("foo/1"), Value: b("x")}),                                // rev 6
		putStep("put foo/2", &pb.PutRequest{Key: b("foo/2"), Value: b("y")}),                                // rev 7
		putStep("put foo/3", &pb.PutRequest{Key: b("foo/3"), Value: b("z")}),                                // rev 8
		putStep("put empty key", &pb.PutRequest{Key: b(""), Value: b("v")}),
		putStep("put with unknown lease", &pb.PutRequest{Key: b("x"), Value: b("v"), Lease: 12345}),
		putStep("put ignore_value", &pb.PutRequest{Key: b("a"), IgnoreValue: true, PrevKv: true}), // rev 9
		putStep("put ignore_value with a value", &pb.PutRequest{Key: b("a"), Value: b("v"), IgnoreValue: true}),
		putStep("put ignore_value on missing key", &pb.PutRequest{Key: b("nokey"), IgnoreValue: true}),
		putStep("put ignore_lease", &pb.PutRequest{Key: b("b"), Value: b("2"), IgnoreLease: true}), // rev 10
		putStep("put ignore_lease with a lease", &pb.PutRequest{Key: b("b"), Value: b("3"), IgnoreLease: true, Lease: 5}),
		grantStep("lease grant with explicit ID", &pb.LeaseGrantRequest{TTL: 600, ID: leaseID}),
		grantStep("lease grant of an existing ID", &pb.LeaseGrantRequest{TTL: 600, ID: leaseID}),
		putStep("put d=1 with lease", &pb.PutRequest{Key: b("d"), Value: b("1"), Lease: leaseID}), // rev 11
		putStep("put ignore_lease on missing key", &pb.PutRequest{Key: b("e"), Value: b("1"), IgnoreLease: true}),
		putStep("put empty value", &pb.PutRequest{Key: b("emptyval"), Value: b("")}),                                                         // rev 12
		putStep("put ignore_value ignore_lease keeps both", &pb.PutRequest{Key: b("d"), IgnoreValue: true, IgnoreLease: true, PrevKv: true}), // rev 13

		rangeStep("range point", &pb.RangeRequest{Key: b("a")}),
		rangeStep("range missing key", &pb.RangeRequest{Key: b("nokey")}),
		rangeStep("range [a, c)", &pb.RangeRequest{Key: b("a"), RangeEnd: b("c")}),
		rangeStep("range prefix foo/", &pb.RangeRequest{Key: b("foo/"), RangeEnd: b("foo0")}),
		rangeStep("range from-key b", &pb.RangeRequest{Key: b("b"), RangeEnd: b("\x00")}),
		rangeStep("range all", all()),
		rangeStep("range end before key", &pb.RangeRequest{Key: b("c"), RangeEnd: b("a")}),
		rangeStep("range empty key", &pb.RangeRequest{Key: b("")}),
		rangeStep("range limit 2", func() *pb.RangeRequest { r := all(); r.Limit = 2; return r }()),
		rangeStep("range limit equal to count", func() *pb.RangeRequest { r := all(); r.Limit = 8; return r }()),
		rangeStep("range limit above count", func() *pb.RangeRequest { r := all(); r.Limit = 100; return r }()),
		rangeStep("range count_only", func() *pb.RangeRequest { r := all(); r.CountOnly = true; return r }()),
		rangeStep("range count_only limit 1", func() *pb.RangeRequest { r := all(); r.CountOnly = true; r.Limit = 1; return r }()),
		rangeStep("range keys_only", func() *pb.RangeRequest { r := all(); r.KeysOnly = true; return r }()),
		rangeStep("range keys_only limit 3", func() *pb.RangeRequest { r := all(); r.KeysOnly = true; r.Limit = 3; return r }()),
		rangeStep("range sorted by key ascending, limit 2", func() *pb.RangeRequest {
			r := all()
			r.SortTarget, r.SortOrder, r.Limit = pb.RangeRequest_KEY, pb.RangeRequest_ASCEND, 2
			return r
		}()),
		rangeStep("range sort target value, no order", func() *pb.RangeRequest { r := all(); r.SortTarget = pb.RangeRequest_VALUE; return r }()),
		rangeStep("range serializable", func() *pb.RangeRequest { r := all(); r.Serializable = true; return r }()),
		rangeStep("range at old revision 2", &pb.RangeRequest{Key: b("a"), Revision: 2}),
		rangeStep("range at revision 1 (before any put)", &pb.RangeRequest{Key: b("a"), Revision: 1}),
		rangeStep("range all at old revision 7", func() *pb.RangeRequest { r := all(); r.Revision = 7; return r }()),
		rangeStep("range at current revision 13", &pb.RangeRequest{Key: b("a"), Revision: 13}),
		rangeStep("range at future revision", &pb.RangeRequest{Key: b("a"), Revision: 14}),
		rangeStep("range at far future revision", &pb.RangeRequest{Key: b("a"), Revision: 1000}),
		rangeStep("range serializable at future revision", &pb.RangeRequest{Key: b("a"), Revision: 14, Serializable: true}),
	}
	for _, order := range []pb.RangeRequest_SortOrder{pb.RangeRequest_NONE, pb.RangeRequest_ASCEND, pb.RangeRequest_DESCEND} {
		for _, target := range []pb.RangeRequest_SortTarget{pb.RangeRequest_KEY, pb.RangeRequest_VERSION, pb.RangeRequest_CREATE, pb.RangeRequest_MOD, pb.RangeRequest_VALUE} {
			r := all()
			r.SortOrder, r.SortTarget = order, target
			steps = append(steps, rangeStep(fmt.Sprintf("range sort %s by %s", order, target), r))
		}
	}
	steps = append(steps,
		rangeStep("range sort MOD DESCEND limit 3", func() *pb.RangeRequest {
			r := all()
			r.SortOrder, r.SortTarget, r.Limit = pb.RangeRequest_DESCEND, pb.RangeRequest_MOD, 3
			return r
		}()),
		rangeStep("range sort VALUE ASCEND limit 2 keys_only", func() *pb.RangeRequest {
			r := all()
			r.SortOrder, r.SortTarget, r.Limit, r.KeysOnly = pb.RangeRequest_ASCEND, pb.RangeRequest_VALUE, 2, true
			return r
		}()),
		rangeStep("range invalid sort order", func() *pb.RangeRequest { r := all(); r.SortOrder = 7; return r }()),
		rangeStep("range invalid sort target", func() *pb.RangeRequest { r := all(); r.SortTarget = 9; return r }()),
		rangeStep("range min_mod_revision 6", func() *pb.RangeRequest { r := all(); r.MinModRevision = 6; return r }()),
		rangeStep("range max_mod_revision 8", func() *pb.RangeRequest { r := all(); r.MaxModRevision = 8; return r }()),
		rangeStep("range min_create 5 max_create 7", func() *pb.RangeRequest {
			r := all()
			r.MinCreateRevision, r.MaxCreateRevision = 5, 7
			return r
		}()),
		rangeStep("range min_mod 9 limit 1", func() *pb.RangeRequest { r := all(); r.MinModRevision, r.Limit = 9, 1; return r }()),
		rangeStep("range min_mod 9 count_only", func() *pb.RangeRequest { r := all(); r.MinModRevision, r.CountOnly = 9, true; return r }()),
		rangeStep("range max_create 6 at revision 7", func() *pb.RangeRequest {
			r := all()
			r.MaxCreateRevision, r.Revision = 6, 7
			return r
		}()),

		delStep("delete missing key prev_kv", &pb.DeleteRangeRequest{Key: b("zz"), PrevKv: true}),
		delStep("delete b prev_kv", &pb.DeleteRangeRequest{Key: b("b"), PrevKv: true}),                                   // rev 14
		delStep("delete prefix foo/ prev_kv", &pb.DeleteRangeRequest{Key: b("foo/"), RangeEnd: b("foo0"), PrevKv: true}), // rev 15
		delStep("delete empty key", &pb.DeleteRangeRequest{Key: b("")}),
		delStep("delete from-key x (nothing there)", &pb.DeleteRangeRequest{Key: b("x"), RangeEnd: b("\x00")}),
		rangeStep("range all at revision 13 sees deleted keys", func() *pb.RangeRequest { r := all(); r.Revision = 13; return r }()),
		rangeStep("range all after deletes", all()),
		putStep("put b again restarts its version", &pb.PutRequest{Key: b("b"), Value: b("again"), PrevKv: true}), // rev 16
	)

	steps = append(steps, compareTargets(2, 11, 13)...)
	steps = append(steps,
		txnStep("txn compare version of missing key = 0", &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: b("nokey"), Target: pb.Compare_VERSION, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Version{Version: 0}}},
			Success: []*pb.RequestOp{opGet("nokey")},
			Failure: []*pb.RequestOp{opGet("a")},
		}),
		txnStep("txn compare value of missing key = empty", &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: b("nokey"), Target: pb.Compare_VALUE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Value{Value: b("")}}},
			Success: []*pb.RequestOp{opGet("nokey")},
			Failure: []*pb.RequestOp{opGet("a")},
		}),
		txnStep("txn compare over a range: version > 0 for all of [a, e)", &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: b("a"), RangeEnd: b("e"), Target: pb.Compare_VERSION, Result: pb.Compare_GREATER, TargetUnion: &pb.Compare_Version{Version: 0}}},
			Success: []*pb.RequestOp{opRange(&pb.RangeRequest{Key: b("a"), RangeEnd: b("e")})},
		}),
		txnStep("txn compare over a range: mod < 12 fails for one key", &pb.TxnRequest{
			Compare: []*pb.Compare{{Key: b("a"), RangeEnd: b("e"), Target: pb.Compare_MOD, Result: pb.Compare_LESS, TargetUnion: &pb.Compare_ModRevision{ModRevision: 12}}},
			Success: []*pb.RequestOp{opGet("a")},
			Failure: []*pb.RequestOp{opGet("b")},
		}),
		txnStep("txn several compares, all true", &pb.TxnRequest{
			Compare: []*pb.Compare{
				{Key: b("a"), Target: pb.Compare_VALUE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Value{Value: b("2")}},
				{Key: b("c"), Target: pb.Compare_VERSION, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Version{Version: 1}},
			},
			Success: []*pb.RequestOp{opGet("a"), opGet("c")},
		}),
		txnStep("txn empty", &pb.TxnRequest{}),
		txnStep("txn success branch writes: put, delete, nested txn", &pb.TxnRequest{ // rev 17
			Compare: []*pb.Compare{{Key: b("a"), Target: pb.Compare_MOD, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_ModRevision{ModRevision: 9}}},
			Success: []*pb.RequestOp{
				opPut("a", "t1"),
				opDel("c", ""),
				opTxn(&pb.TxnRequest{
					Compare: []*pb.Compare{{Key: b("x"), Target: pb.Compare_VERSION, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Version{Version: 0}}},
					Success: []*pb.RequestOp{opPut("x", "nested"), opGet("x")},
					Failure: []*pb.RequestOp{opGet("x")},
				}),
				opGet("a"),
			},
			Failure: []*pb.RequestOp{opGet("a")},
		}),
		rangeStep("range after txn writes", all()),
		txnStep("txn failure branch writes", &pb.TxnRequest{ // rev 18
			Compare: []*pb.Compare{{Key: b("a"), Target: pb.Compare_VALUE, Result: pb.Compare_EQUAL, TargetUnion: &pb.Compare_Value{Value: b("nope")}}},
			Success: []*pb.RequestOp{opPut("f", "success")},
			Failure: []*pb.RequestOp{opPut("f", "failure"), opGet("f"), opPut("g", "1")},
		}),
		txnStep("txn reads its own writes in order", &pb.TxnRequest{ // rev 19
			Success: []*pb.RequestOp{opGet("h"), opPut("h", "1"), opGet("h")},
		}),
		txnStep("txn put and delete of one key is a duplicate", &pb.TxnRequest{
			Success: []*pb.RequestOp{opDel("h", ""), opPut("h", "2")},
		}),
		txnStep("txn only reads does not bump revision", &pb.TxnRequest{
			Success: []*pb.RequestOp{opGet("a"), opRange(all())},
		}),
		txnStep("txn delete of nothing does not bump revision", &pb.TxnRequest{
			Success: []*pb.RequestOp{opDel("nothing-here", "")},
		}),
		txnStep("txn duplicate put", &pb.TxnRequest{
			Success: []*pb.RequestOp{opPut("k", "1"), opPut("k", "2")},
		}),
		txnStep("txn put then delete range covering it", &pb.TxnRequest{
			Success: []*pb.RequestOp{opPut("k", "1"), opDel("j", "l")},
		}),
		txnStep("txn two deletes of the same key", &pb.TxnRequest{ // deletes nothing: no new revision
			Success: []*pb.RequestOp{opDel("k", ""), opDel("k", "")},
		}),
		txnStep("txn same key in success and failure", &pb.TxnRequest{ // rev 20
			Success: []*pb.RequestOp{opPut("k", "s")},
			Failure: []*pb.RequestOp{opPut("k", "f")},
		}),
		txnStep("txn duplicate key through a nested txn", &pb.TxnRequest{
			Success: []*pb.RequestOp{opPut("n", "1"), opTxn(&pb.TxnRequest{Success: []*pb.RequestOp{opPut("n", "2")}})},
		}),
		txnStep("txn nested txn same key in both nested branches", &pb.TxnRequest{ // rev 21
			Success: []*pb.RequestOp{opPut("m", "outer"), opTxn(&pb.TxnRequest{
				Success: []*pb.RequestOp{opPut("n", "ns")},
				Failure: []*pb.RequestOp{opPut("n", "nf")},
			})},
		}),
		txnStep(fmt.Sprintf("txn with %d ops (the limit)", maxTxnOps), &pb.TxnRequest{Success: nOps("lim", maxTxnOps)}), // rev 22
		txnStep(fmt.Sprintf("txn with %d ops (over the limit)", maxTxnOps+1), &pb.TxnRequest{Success: nOps("over", maxTxnOps+1)}),
		txnStep("txn over the limit in the failure branch", &pb.TxnRequest{Failure: nOps("overf", maxTxnOps+1)}),
		txnStep("txn put of empty key", &pb.TxnRequest{Success: []*pb.RequestOp{opPut("", "v")}}),
		txnStep("txn put with unknown lease", &pb.TxnRequest{
			Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: b("l"), Value: b("v"), Lease: 4242}}}},
		}),
		txnStep("txn range at future revision", &pb.TxnRequest{
			Success: []*pb.RequestOp{opRange(&pb.RangeRequest{Key: b("a"), Revision: 1000})},
		}),
		rangeStep("range all after txns", all()),

		compactStep("compact to 5", &pb.CompactionRequest{Revision: 5}),
		rangeStep("range at 4, below compaction", &pb.RangeRequest{Key: b("a"), Revision: 4}),
		rangeStep("range at 5, the compact revision", &pb.RangeRequest{Key: b("a"), Revision: 5}),
		rangeStep("range all at 5", func() *pb.RangeRequest { r := all(); r.Revision = 5; return r }()),
		rangeStep("range at 6", &pb.RangeRequest{Key: b("a"), Revision: 6}),
		compactStep("compact to 5 again", &pb.CompactionRequest{Revision: 5}),
		compactStep("compact to 3, below compaction", &pb.CompactionRequest{Revision: 3}),
		compactStep("compact to a future revision", &pb.CompactionRequest{Revision: 1000}),
		compactStep("compact physical to 10", &pb.CompactionRequest{Revision: 10, Physical: true}),
		rangeStep("range all at 9, below compaction", func() *pb.RangeRequest { r := all(); r.Revision = 9; return r }()),
		rangeStep("range all at 10", func() *pb.RangeRequest { r := all(); r.Revision = 10; return r }()),
		rangeStep("range all at 12 sees versions kept by compaction", func() *pb.RangeRequest { r := all(); r.Revision = 12; return r }()),
		rangeStep("range serializable at 9", func() *pb.RangeRequest { r := all(); r.Revision, r.Serializable = 9, true; return r }()),
		txnStep("txn range below compaction", &pb.TxnRequest{
			Success: []*pb.RequestOp{opRange(&pb.RangeRequest{Key: b("a"), Revision: 9})},
		}),
		rangeStep("range count_only at 10", func() *pb.RangeRequest { r := all(); r.Revision, r.CountOnly = 10, true; return r }()),
		compactStep("compact to the current revision", &pb.CompactionRequest{Revision: 22}),
		compactStep("compact to the current revision again", &pb.CompactionRequest{Revision: 22}),
		rangeStep("range all after compacting everything", all()),

		putStep("put value over --max-request-bytes", &pb.PutRequest{Key: b("big"), Value: make([]byte, maxRequestBytes+1024)}),
		putStep("put key over --max-request-bytes", &pb.PutRequest{Key: []byte(strings.Repeat("k", maxRequestBytes+1024)), Value: b("v")}),
		txnStep("txn over --max-request-bytes", &pb.TxnRequest{Success: []*pb.RequestOp{
			opPut("big1", strings.Repeat("v", maxRequestBytes/2)), opPut("big2", strings.Repeat("v", maxRequestBytes/2+1024)),
		}}),
		putStep("put just under --max-request-bytes", &pb.PutRequest{Key: b("almost"), Value: make([]byte, maxRequestBytes-1024)}), // rev 23
		rangeStep("range keys_only after refused requests", func() *pb.RangeRequest { r := all(); r.KeysOnly = true; return r }()),
		putStep("put after everything", &pb.PutRequest{Key: b("last"), Value: b("1"), PrevKv: true}),
		putStep("put ignore_value without ignore_lease drops the lease", &pb.PutRequest{Key: b("d"), IgnoreValue: true, PrevKv: true}),
		rangeStep("range d after its lease was dropped", &pb.RangeRequest{Key: b("d")}),
	)
	return steps
}

// nOps builds n puts of distinct keys prefix/00, prefix/01, ...
func nOps(prefix string, n int) []*pb.RequestOp {
	ops := make([]*pb.RequestOp, n)
	for i := range ops {
		ops[i] = opPut(fmt.Sprintf("%s/%02d", prefix, i), "v")
	}
	return ops
}

// runSteps runs the table in order against the server at endpoint.
func runSteps(t *testing.T, endpoint string, steps []step) []outcome {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+strings.TrimPrefix(endpoint, "http://"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", endpoint, err)
	}
	defer conn.Close()
	c := apis{kv: pb.NewKVClient(conn), lease: pb.NewLeaseClient(conn)}
	out := make([]outcome, len(steps))
	for i, s := range steps {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := s.do(ctx, c)
		cancel()
		if err != nil {
			out[i] = outcome{err: err}
			continue
		}
		normalizeHeaders(resp.ProtoReflect())
		out[i] = outcome{resp: resp}
	}
	return out
}

// TestConformance runs one ordered table of requests against a fresh strata
// and a fresh etcd with the same flags and requires the same answers.
func TestConformance(t *testing.T) {
	t.Parallel()
	steps := conformanceSteps()
	var (
		mu      sync.Mutex
		results = map[flavor][]outcome{}
	)
	t.Run("run", func(t *testing.T) {
		for _, f := range flavors {
			t.Run(string(f), func(t *testing.T) {
				t.Parallel()
				p := start(t, f, limitFlags...)
				out := runSteps(t, p.Endpoint(), steps)
				mu.Lock()
				results[f] = out
				mu.Unlock()
			})
		}
	})
	want, got := results[etcd], results[strata]
	if want == nil || got == nil {
		t.Fatalf("cannot compare: a server did not run the table (etcd ran: %v, strata ran: %v)", want != nil, got != nil)
	}
	mismatches := 0
	for i, s := range steps {
		if sameOutcome(want[i], got[i]) {
			continue
		}
		mismatches++
		// A difference early in the table shifts every later revision;
		// the first differences are the ones worth reading in full.
		if mismatches <= 12 {
			t.Errorf("step %d %q: strata differs from etcd (- etcd, + strata):\n%s", i, s.name, lineDiff(render(want[i]), render(got[i])))
		} else {
			t.Errorf("step %d %q: strata differs from etcd", i, s.name)
		}
	}
	if mismatches > 0 {
		t.Logf("%d of %d steps differ", mismatches, len(steps))
	}
}

// TestConformanceSelf checks the comparison machinery: two fresh etcds
// must agree on every step, so a mismatch in TestConformance is strata's.
func TestConformanceSelf(t *testing.T) {
	if testing.Short() {
		t.Skip("etcd against etcd: only to validate the table")
	}
	t.Parallel()
	steps := conformanceSteps()
	var outs [2][]outcome
	t.Run("run", func(t *testing.T) {
		for i := range outs {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				t.Parallel()
				p := start(t, etcd, limitFlags...)
				outs[i] = runSteps(t, p.Endpoint(), steps)
			})
		}
	})
	if outs[0] == nil || outs[1] == nil {
		t.Fatal("an etcd did not run the table")
	}
	for i, s := range steps {
		if !sameOutcome(outs[0][i], outs[1][i]) {
			t.Errorf("step %d %q: two etcds differ:\n%s", i, s.name, lineDiff(render(outs[0][i]), render(outs[1][i])))
		}
		if testing.Verbose() {
			t.Logf("step %d %q:\n%s", i, s.name, render(outs[0][i]))
		}
	}
}
