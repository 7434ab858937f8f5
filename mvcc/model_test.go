package mvcc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/engine"
	epebble "github.com/strata-kv/strata/engine/pebble"
)

// model is etcd's MVCC semantics written the plain way: every key's full
// list of versions, never physically compacted.
type model struct {
	rev        int64
	compactRev int64
	hist       map[string][]*mvccpb.KeyValue // ascending mod; a tombstone has ModRevision 0 and Version = -main
	log        []logEntry                    // every version in revision order
}

type logEntry struct {
	main, sub int64
	kv        *mvccpb.KeyValue
}

func (m *model) appendLog(kv *mvccpb.KeyValue) {
	main := tombMain(kv)
	sub := int64(0)
	if n := len(m.log); n > 0 && m.log[n-1].main == main {
		sub = m.log[n-1].sub + 1
	}
	m.log = append(m.log, logEntry{main: main, sub: sub, kv: kv})
}

// hash is etcd's HashKV rule written plainly: versions in (compactRev, rev],
// plus versions at or below compactRev that are their key's newest at or
// below rev and not deletions; etcd's revision keys and marshalled values.
func (m *model) hash(rev int64) uint32 {
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	h.Write([]byte("key"))
	for _, e := range m.log {
		if e.main > rev {
			break
		}
		tomb := e.kv.ModRevision == 0
		if e.main <= m.compactRev {
			var newest *mvccpb.KeyValue
			for _, kv := range m.hist[string(e.kv.Key)] {
				if tombMain(kv) <= rev {
					newest = kv
				}
			}
			if tomb || newest != e.kv {
				continue
			}
		}
		k := binary.BigEndian.AppendUint64(nil, uint64(e.main))
		k = append(k, '_')
		k = binary.BigEndian.AppendUint64(k, uint64(e.sub))
		v := e.kv
		if tomb {
			k = append(k, 't')
			v = &mvccpb.KeyValue{Key: e.kv.Key}
		}
		b, err := proto.Marshal(v)
		if err != nil {
			panic(err)
		}
		h.Write(k)
		h.Write(b)
	}
	return h.Sum32()
}

func newModel() *model { return &model{rev: 1, compactRev: -1, hist: map[string][]*mvccpb.KeyValue{}} }

func tombMain(kv *mvccpb.KeyValue) int64 {
	if kv.ModRevision == 0 {
		return -kv.Version
	}
	return kv.ModRevision
}

// at returns key's live version at rev, or nil.
func (m *model) at(key string, rev int64) *mvccpb.KeyValue {
	var out *mvccpb.KeyValue
	for _, kv := range m.hist[key] {
		if tombMain(kv) <= rev {
			out = kv
		}
	}
	if out == nil || out.ModRevision == 0 {
		return nil
	}
	return out
}

func inRange(k string, key, end []byte) bool {
	if end == nil {
		return k == string(key)
	}
	if len(end) == 1 && end[0] == 0 {
		return k >= string(key)
	}
	return k >= string(key) && k < string(end)
}

func (m *model) keys(key, end []byte, rev int64) []*mvccpb.KeyValue {
	var out []*mvccpb.KeyValue
	for k := range m.hist {
		if inRange(k, key, end) {
			if kv := m.at(k, rev); kv != nil {
				out = append(out, proto.CloneOf(kv))
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i].Key, out[j].Key) < 0 })
	return out
}

func (m *model) put(key, val []byte, main int64) {
	kv := &mvccpb.KeyValue{Key: key, Value: val, CreateRevision: main, ModRevision: main, Version: 1}
	if prev := m.at(string(key), main); prev != nil {
		kv.CreateRevision, kv.Version = prev.CreateRevision, prev.Version+1
	}
	m.hist[string(key)] = append(m.hist[string(key)], kv)
	m.appendLog(kv)
}

func (m *model) del(key, end []byte, main int64) int64 {
	kvs := m.keys(key, end, main)
	for _, kv := range kvs {
		tomb := &mvccpb.KeyValue{Key: kv.Key, Version: -main}
		m.hist[string(kv.Key)] = append(m.hist[string(kv.Key)], tomb)
		m.appendLog(tomb)
	}
	return int64(len(kvs))
}

// modelRange answers a plain range (no sort, no filters) with limit.
func (m *model) rangeAt(key, end []byte, rev, limit int64) (*pb.RangeResponse, error) {
	if rev > m.rev {
		return nil, ErrFutureRev
	}
	if rev <= 0 {
		rev = m.rev
	}
	if rev < m.compactRev {
		return nil, ErrCompacted
	}
	kvs := m.keys(key, end, rev)
	resp := &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: m.rev}, Count: int64(len(kvs))}
	if limit > 0 && int64(len(kvs)) > limit {
		kvs, resp.More = kvs[:limit], true
	}
	resp.Kvs = kvs
	return resp, nil
}

func openTestStore(t testing.TB, fs vfs.FS, dir string) (*epebble.Engine, *Store) {
	t.Helper()
	e, err := epebble.Open(dir, epebble.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(e, Options{CompactChunk: 7})
	if err != nil {
		t.Fatal(err)
	}
	return e, s
}

func randKey(rng *rand.Rand) []byte { return fmt.Appendf(nil, "k%d", rng.IntN(12)) }

func randRange(rng *rand.Rand) (key, end []byte) {
	switch rng.IntN(4) {
	case 0:
		return randKey(rng), nil
	case 1:
		return randKey(rng), []byte{0}
	default:
		a, b := randKey(rng), randKey(rng)
		if bytes.Compare(a, b) > 0 {
			a, b = b, a
		}
		return a, append(b, '~')
	}
}

func equalResp(t *testing.T, what string, got, want proto.Message) {
	t.Helper()
	if !proto.Equal(got, want) {
		t.Fatalf("%s:\n got %v\nwant %v", what, got, want)
	}
}

// TestModel applies random puts, deletes, transactions and compactions to
// the store and to the model, restarting the store now and then, and
// compares every answer and random ranges at random revisions.
func TestModel(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runModel(t, seed) })
	}
}

func runModel(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	fs := vfs.NewMem()
	e, s := openTestStore(t, fs, "db")
	s.Start()
	// The filter of current keys builds beside the model's writes.
	s.StartKeyFilter()
	m := newModel()
	index := uint64(0)
	for step := 0; step < 300; step++ {
		w := s.Write(modelLeases)
		for range 1 + rng.IntN(4) {
			switch op := rng.IntN(10); {
			case op < 4:
				key := randKey(rng)
				val := fmt.Appendf(nil, "v%d", rng.IntN(1000))
				lease := int64(0)
				if rng.IntN(10) == 0 {
					lease = int64(rng.IntN(150))
				}
				prev := m.at(string(key), m.rev)
				got, err := w.Put(&pb.PutRequest{Key: key, Value: val, Lease: lease, PrevKv: true})
				if lease >= 100 {
					if !errors.Is(err, ErrLeaseNotFound) {
						t.Fatalf("put with missing lease: err = %v", err)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				m.rev++
				m.put(key, val, m.rev)
				m.hist[string(key)][len(m.hist[string(key)])-1].Lease = lease
				equalResp(t, "put", got, &pb.PutResponse{Header: &pb.ResponseHeader{Revision: m.rev}, PrevKv: prev})
			case op < 6:
				key, end := randRange(rng)
				prevs := m.keys(key, end, m.rev)
				got, err := w.DeleteRange(&pb.DeleteRangeRequest{Key: key, RangeEnd: end, PrevKv: true})
				if err != nil {
					t.Fatal(err)
				}
				if len(prevs) > 0 {
					m.rev++
					m.del(key, end, m.rev)
				}
				equalResp(t, "delete", got, &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{Revision: m.rev}, Deleted: int64(len(prevs)), PrevKvs: prevs})
			case op < 9:
				modelTxn(t, rng, w, m)
			default:
				if m.rev <= m.compactRev+1 || rng.IntN(3) != 0 {
					continue
				}
				c := m.compactRev + 1 + rng.Int64N(m.rev-m.compactRev)
				if c < 1 {
					c = 1
				}
				if _, _, err := w.Compact(&pb.CompactionRequest{Revision: c}); err != nil {
					t.Fatalf("compact %d (rev %d): %v", c, m.rev, err)
				}
				m.compactRev = c
				if _, _, err := w.Compact(&pb.CompactionRequest{Revision: c}); !errors.Is(err, ErrCompacted) {
					t.Fatalf("second compact at %d: err = %v, want ErrCompacted", c, err)
				}
			}
		}
		index++
		if err := w.Commit(index); err != nil {
			t.Fatal(err)
		}
		if s.Rev() != m.rev || s.CompactRev() != m.compactRev {
			t.Fatalf("rev/compact = %d/%d, model %d/%d", s.Rev(), s.CompactRev(), m.rev, m.compactRev)
		}
		for range 3 {
			key, end := randRange(rng)
			rev := m.compactRev - 1 + rng.Int64N(m.rev-m.compactRev+3)
			if rng.IntN(3) == 0 {
				rev = 0
			}
			limit := rng.Int64N(3)
			want, werr := m.rangeAt(key, end, rev, limit)
			got, gerr := s.Range(&pb.RangeRequest{Key: key, RangeEnd: end, Revision: rev, Limit: limit})
			if !errors.Is(gerr, werr) || (werr == nil && gerr != nil) {
				t.Fatalf("range [%q,%q) at %d: err %v, want %v", key, end, rev, gerr, werr)
			}
			if werr == nil {
				equalResp(t, fmt.Sprintf("range [%q,%q) at %d limit %d", key, end, rev, limit), got, want)
			}
		}
		if rng.IntN(4) == 0 {
			checkEvents(t, rng, s, m)
		}
		if rng.IntN(5) == 0 {
			// HashKV follows etcd's rule whatever physical compaction has
			// done so far (it runs concurrently).
			rev := max(m.compactRev, 1) + rng.Int64N(m.rev-max(m.compactRev, 1)+1)
			got, hrev, crev, err := s.HashKV(rev)
			if err != nil || got != m.hash(rev) || hrev != rev || crev != m.compactRev {
				t.Fatalf("HashKV(%d) = %x, %d, %d, %v; want %x, %d, %d", rev, got, hrev, crev, err, m.hash(rev), rev, m.compactRev)
			}
		}
		if rng.IntN(40) == 0 {
			// Restart: everything must survive, and a pending physical
			// compaction resume.
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e, s = openTestStore(t, fs, "db")
			s.Start()
			s.StartKeyFilter()
			if s.Rev() != m.rev || s.CompactRev() != m.compactRev || s.AppliedIndex() != index {
				t.Fatalf("after restart rev/compact/index = %d/%d/%d, want %d/%d/%d", s.Rev(), s.CompactRev(), s.AppliedIndex(), m.rev, m.compactRev, index)
			}
		}
	}
	// Compact at the current revision with the compactor stopped, hash,
	// let physical compaction run, and hash again: members whose compaction
	// has or has not run must agree.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	w := s.Write(modelLeases)
	if m.rev > m.compactRev {
		if _, _, err := w.Compact(&pb.CompactionRequest{Revision: m.rev}); err != nil {
			t.Fatal(err)
		}
		m.compactRev = m.rev
	}
	index++
	if err := w.Commit(index); err != nil {
		t.Fatal(err)
	}
	before, _, _, err := s.HashKV(0)
	if err != nil {
		t.Fatal(err)
	}
	w = s.Write(modelLeases)
	if _, _, err = w.Compact(&pb.CompactionRequest{Revision: m.rev}); !errors.Is(err, ErrCompacted) {
		t.Fatalf("compact at the compact revision: err = %v", err)
	}
	w.Abort()
	s.Start()
	done := s.CompactDone(m.compactRev)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("physical compaction did not finish")
	}
	after, _, _, err := s.HashKV(0)
	if err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Fatalf("HashKV = %x after physical compaction, %x before", after, before)
	}
	want, _ := m.rangeAt([]byte{0}, []byte{0}, m.compactRev, 0)
	got, err := s.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, Revision: m.compactRev})
	if err != nil {
		t.Fatal(err)
	}
	equalResp(t, "range all at compact revision", got, want)
	// After compaction at the current revision only live keys have
	// history, one version each, plus deletions at that very revision.
	var tombs int64
	for _, e := range m.log {
		if e.main == m.compactRev && e.kv.ModRevision == 0 {
			tombs++
		}
	}
	nHist := countVersions(t, e, nil)
	nRev := countPrefix(t, e, prefixRev)
	if int64(nHist) != got.Count+tombs || int64(nRev) != got.Count+tombs {
		t.Fatalf("after compaction at the current revision: %d history and %d index entries, want %d", nHist, nRev, got.Count+tombs)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
}

func countPrefix(t *testing.T, e *epebble.Engine, p string) int {
	it := e.NewIter([]byte(p), prefixEnd(p))
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	return n
}

// countVersions counts the versions of key (nil: of every key) that the
// store holds: its history entries and a moved current record (doc.go,
// "Where each version lives").
func countVersions(t *testing.T, r engine.Reader, key []byte) int {
	t.Helper()
	hLower, hUpper := []byte(prefixHistory), prefixEnd(prefixHistory)
	cLower, cUpper := []byte(prefixCurrent), prefixEnd(prefixCurrent)
	if key != nil {
		hLower, hUpper = historyPrefix(key), historyKeyEnd(key)
		cLower, cUpper = currentKey(key), append(currentKey(key), 0)
	}
	n := 0
	it := r.NewIter(hLower, hUpper)
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	it = r.NewIter(cLower, cUpper)
	for ok := it.First(); ok; ok = it.Next() {
		c, err := decodeCurrent(it.Value())
		if err != nil {
			t.Fatal(err)
		}
		if c.moved {
			n++
		}
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	return n
}

// modelTxn runs one random transaction: a compare on one key, then puts,
// deletes and ranges in the chosen branch.
func modelTxn(t *testing.T, rng *rand.Rand, w *WriteBatch, m *model) {
	t.Helper()
	ck := randKey(rng)
	cur := m.at(string(ck), m.rev)
	var ver int64
	if cur != nil {
		ver = cur.Version
	}
	cmp := &pb.Compare{Key: ck, Target: pb.Compare_VERSION, Result: pb.Compare_EQUAL,
		TargetUnion: &pb.Compare_Version{Version: ver + int64(rng.IntN(2))}}
	ok := cmp.GetVersion() == ver
	var ops [2][]*pb.RequestOp
	for b := range ops {
		for range rng.IntN(4) {
			switch rng.IntN(3) {
			case 0:
				ops[b] = append(ops[b], &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{
					Key: randKey(rng), Value: fmt.Appendf(nil, "t%d", rng.IntN(100))}}})
			case 1:
				key, end := randRange(rng)
				ops[b] = append(ops[b], &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: key, RangeEnd: end}}})
			default:
				key, end := randRange(rng)
				ops[b] = append(ops[b], &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: key, RangeEnd: end}}})
			}
		}
	}
	req := &pb.TxnRequest{Compare: []*pb.Compare{cmp}, Success: ops[0], Failure: ops[1]}
	got, err := w.Txn(req)
	if err != nil {
		t.Fatal(err)
	}
	chosen := ops[1]
	if ok {
		chosen = ops[0]
	}
	want := &pb.TxnResponse{Succeeded: ok}
	main := m.rev + 1
	wrote := false
	for _, op := range chosen {
		switch {
		case op.GetRequestPut() != nil:
			p := op.GetRequestPut()
			m.put(p.Key, p.Value, main)
			wrote = true
			want.Responses = append(want.Responses, &pb.ResponseOp{Response: &pb.ResponseOp_ResponsePut{ResponsePut: &pb.PutResponse{Header: &pb.ResponseHeader{Revision: main}}}})
		case op.GetRequestDeleteRange() != nil:
			d := op.GetRequestDeleteRange()
			n := m.del(d.Key, d.RangeEnd, main)
			wrote = wrote || n > 0
			rev := m.rev
			if wrote {
				rev = main
			}
			want.Responses = append(want.Responses, &pb.ResponseOp{Response: &pb.ResponseOp_ResponseDeleteRange{ResponseDeleteRange: &pb.DeleteRangeResponse{Header: &pb.ResponseHeader{Revision: rev}, Deleted: n}}})
		default:
			r := op.GetRequestRange()
			rev := m.rev
			if wrote {
				rev = main
			}
			kvs := m.keys(r.Key, r.RangeEnd, rev)
			want.Responses = append(want.Responses, &pb.ResponseOp{Response: &pb.ResponseOp_ResponseRange{ResponseRange: &pb.RangeResponse{Header: &pb.ResponseHeader{Revision: rev}, Kvs: kvs, Count: int64(len(kvs))}}})
		}
	}
	if wrote {
		m.rev = main
	}
	want.Header = &pb.ResponseHeader{Revision: m.rev}
	equalResp(t, "txn", got, want)
}

// checkEvents compares Store.Events from a random revision with the model's
// log: types, key values, previous versions and the limit rule.
func checkEvents(t *testing.T, rng *rand.Rand, s *Store, m *model) {
	t.Helper()
	from := m.compactRev - 1 + rng.Int64N(m.rev-m.compactRev+3)
	limit := rng.IntN(4)
	got, next, err := s.Events(from, 0, limit, true)
	if from < m.compactRev {
		if !errors.Is(err, ErrCompacted) {
			t.Fatalf("Events(%d) below compact revision %d: err = %v", from, m.compactRev, err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	var want []*mvccpb.Event
	wantNext := m.rev + 1
	if from > m.rev {
		wantNext = from
	}
	for _, e := range m.log {
		key := string(e.kv.Key)
		if e.main < from {
			continue
		}
		if limit > 0 && len(want) >= limit && e.main != want[len(want)-1].Kv.ModRevision {
			wantNext = e.main
			break
		}
		// prev_kv is etcd's Range at main-1: none for a create event or a
		// compacted revision.
		var p *mvccpb.KeyValue
		if e.main-1 >= m.compactRev && e.kv.Version != 1 {
			p = m.at(key, e.main-1)
		}
		ev := &mvccpb.Event{Type: mvccpb.Event_PUT, Kv: e.kv, PrevKv: p}
		if e.kv.ModRevision == 0 {
			ev = &mvccpb.Event{Type: mvccpb.Event_DELETE, Kv: &mvccpb.KeyValue{Key: e.kv.Key, ModRevision: e.main}, PrevKv: p}
		}
		want = append(want, ev)
	}
	if next != wantNext || len(got) != len(want) {
		t.Fatalf("Events(%d, limit %d): %d events next %d, want %d next %d", from, limit, len(got), next, len(want), wantNext)
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("Events(%d) event %d:\n got %v\nwant %v", from, i, got[i], want[i])
		}
	}
}

// modelLeases are the leases the model test's puts may attach keys to.
var modelLeases = leaseFunc(func(id int64) bool { return id < 100 })
