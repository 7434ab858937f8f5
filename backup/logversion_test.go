package backup

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/strata-kv/strata/mvcc"
)

// newLogBackuper is newBackuper with the member's raft log and a policy.
func newLogBackuper(t *testing.T, m *member, a *applied, target Target, p Policy) *Backuper {
	b := newBackuper(t, m, target)
	b.cfg.Log, b.cfg.Policy = a.log, p
	return b
}

// putRandom writes n keys with random values of size bytes, which Pebble
// cannot compress, one batch each.
func putRandom(m *member, n, size int) {
	m.t.Helper()
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		v := make([]byte, size)
		for j := range v {
			v[j] = byte(rnd.Uint32())
		}
		m.write(func(w *mvcc.WriteBatch) error {
			_, err := w.Put(&pb.PutRequest{Key: fmt.Appendf(nil, "random%04d", i), Value: v})
			return err
		})
	}
}

// liveAnswer is what the live store answers now: every key and HashKV at
// its revision.
func liveAnswer(t *testing.T, m *member) string {
	t.Helper()
	return answer(t, m.store.Rev(), kvs(t, m.store), m.store.HashKV)
}

// restoreAnswer restores cfg into a new directory and returns what the
// restored store answers, or the error (after checking that a refused
// restore left no directory behind).
func restoreAnswer(t *testing.T, target Target, cfg RestoreConfig) (RestoreResult, string, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "restored")
	cfg.DataDir = dir
	res, err := Restore(context.Background(), target, cfg)
	if err != nil {
		for _, p := range []string{dir, dir + ".download"} {
			if _, serr := os.Stat(p); serr == nil {
				t.Errorf("a refused restore left %s", p)
			}
		}
		return res, "", err
	}
	s := openRestored(t, dir)
	return res, answer(t, s.Rev(), kvs(t, s), s.HashKV), nil
}

// writeRound proposes a mix of requests: puts, an overwrite, a delete, a
// lease grant and a put under it, a txn.
func writeRound(a *applied, round int) {
	for i := range 6 {
		a.propose(put(fmt.Sprintf("k%02d", (i*7+round)%13), fmt.Sprintf("r%d-%d-%s", round, i, strings.Repeat("x", 300)), 0))
	}
	a.propose(&pb.InternalRaftRequest{DeleteRange: &pb.DeleteRangeRequest{Key: fmt.Appendf(nil, "k%02d", round%13)}})
	lease := int64(100 + round)
	a.propose(&pb.InternalRaftRequest{LeaseGrant: &pb.LeaseGrantRequest{ID: lease, TTL: 600}})
	a.propose(put(fmt.Sprintf("leased%d", round), "x", lease))
	a.propose(&pb.InternalRaftRequest{Txn: &pb.TxnRequest{
		Compare: []*pb.Compare{{Key: []byte("k03"), Target: pb.Compare_VERSION, Result: pb.Compare_GREATER, TargetUnion: &pb.Compare_Version{Version: 0}}},
		Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("txn"), Value: fmt.Appendf(nil, "%d", round)}}}},
		Failure: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte("txn")}}}},
	}})
}

// TestLogVersion: after a files version, versions of a member whose log
// holds the entries since are log versions naming that base and the
// archived log after it; each restores to exactly what the live store
// answered when it was taken (keys, values, revisions, HashKV), through
// puts, deletes, leases, a txn and a revision compaction; a restore to a
// revision after a log version starts from it; prune keeps the base of a
// kept log version and the log it names.
func TestLogVersion(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	m.put("big", 200, 500) // a base of some size, so that the ratio allows logs
	a := newApplied(t, m)
	target := fileTarget(t)
	b := newLogBackuper(t, m, a, target, Policy{LogRatio: 10})
	writeRound(a, 1)
	v1, err := b.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v1.IsLog() || v1.Kind != KindFiles {
		t.Fatalf("the first version is %q, want a files version (nothing to base a log on)", v1.Kind)
	}
	want := map[uint64]string{v1.Version: liveAnswer(t, m)}
	var versions []*Manifest
	for round := 2; round <= 4; round++ {
		writeRound(a, round)
		if round == 3 {
			a.propose(&pb.InternalRaftRequest{Compaction: &pb.CompactionRequest{Revision: m.store.Rev() - 5}})
			a.propose(&pb.InternalRaftRequest{LeaseRevoke: &pb.LeaseRevokeRequest{ID: 101}})
		}
		v, err := b.Create(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want[v.Version] = liveAnswer(t, m)
		if !v.IsLog() || v.Base != v1.Version || v.BaseIndex != v1.RaftIndex || v.RaftIndex != a.app.AppliedIndex() ||
			v.Revision != m.store.Rev() || v.CompactRevision != m.store.CompactRev() || len(v.Files) != 0 || v.EngineBytes == 0 {
			t.Fatalf("round %d: version %+v; want a log version on version %d at index %d, revision %d", round, v, v1.Version, a.app.AppliedIndex(), m.store.Rev())
		}
		// Each log version uploads only the entries after the last version.
		if len(versions) > 0 && (v.NewBytes == 0 || v.NewBytes >= uint64(v.LogSize())) {
			t.Errorf("version %d uploaded %d of its %d log bytes; want only what follows version %d", v.Version, v.NewBytes, v.LogSize(), versions[len(versions)-1].Version)
		}
		versions = append(versions, v)
	}
	if st := b.Stats(); st.Versions != 4 || st.LogVersions != 3 {
		t.Errorf("stats: %d versions, %d log versions; want 4, 3", st.Versions, st.LogVersions)
	}
	for _, v := range append([]*Manifest{v1}, versions...) {
		res, got, err := restoreAnswer(t, target, restoreConfig("", v.Version))
		if err != nil {
			t.Fatalf("restore version %d: %v", v.Version, err)
		}
		if got != want[v.Version] {
			t.Errorf("restored version %d:\n%s\nthe live store answered:\n%s", v.Version, got, want[v.Version])
		}
		if res.Manifest.Version != v.Version || res.ReplayedTo != 0 {
			t.Errorf("restore version %d: from version %d, replayed to %d", v.Version, res.Manifest.Version, res.ReplayedTo)
		}
		rep, err := Verify(ctx, target, v.Version)
		if err != nil || rep.LogObjects != len(v.Log) || (v.IsLog() && rep.Base != v1.Version) || rep.Files != len(hashes(v1)) {
			t.Errorf("verify version %d: %+v, %v", v.Version, rep, err)
		}
	}

	// Point-in-time restore from a log version: every revision after the
	// last one, replayed from its log then the archive.
	last := versions[len(versions)-1]
	writeRound(a, 5)
	if _, err := b.ArchiveLog(ctx, a.log, a.app.AppliedIndex(), nil); err != nil {
		t.Fatal(err)
	}
	for rev := last.Revision; rev <= m.store.Rev(); rev++ {
		res, got, err := restoreAnswer(t, target, RestoreConfig{ToRevision: rev, Name: "r1",
			InitialCluster: map[string][]string{"r1": {"http://127.0.0.1:2380"}}})
		if err != nil {
			t.Errorf("restore to revision %d: %v", rev, err)
			continue
		}
		if got != a.states[rev] && rev != last.Revision {
			t.Errorf("restored to revision %d:\n%s\nthe live store answered:\n%s", rev, got, a.states[rev])
		}
		if res.Manifest.Version != last.Version {
			t.Errorf("restore to revision %d started from version %d, want the log version %d", rev, res.Manifest.Version, last.Version)
		}
	}

	// Prune to the newest version: it is a log version, so its base
	// stays, with its files and the log objects the newest names.
	rep, err := b.Prune(ctx, Retention{KeepLast: 1})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(rep.Kept) != fmt.Sprint([]uint64{v1.Version, last.Version}) || rep.LogObjectsDeleted != 0 {
		t.Errorf("prune kept %v (deleted %v, %d log objects); want the base %d and the newest %d", rep.Kept, rep.Deleted, rep.LogObjectsDeleted, v1.Version, last.Version)
	}
	if _, got, err := restoreAnswer(t, target, restoreConfig("", last.Version)); err != nil || got != want[last.Version] {
		t.Errorf("restore version %d after the prune: %v", last.Version, err)
	}
	if _, err := Verify(ctx, target, last.Version); err != nil {
		t.Errorf("verify version %d after the prune: %v", last.Version, err)
	}
	// A files version taken now frees the base once the log version goes.
	v5, err := b.CreateKind(ctx, KindFiles)
	if err != nil || v5.IsLog() {
		t.Fatalf("a files version asked for: %+v, %v", v5, err)
	}
	if rep, err := b.Prune(ctx, Retention{KeepLast: 1}); err != nil || fmt.Sprint(rep.Kept) != fmt.Sprint([]uint64{v5.Version}) || rep.LogObjectsDeleted == 0 {
		t.Errorf("prune to the files version %d: %+v, %v", v5.Version, rep, err)
	}
}

// TestLogVersionPolicy: the policy's rules and the member's log decide
// between a log and a files version: log versions off, the log above the
// ratio, full-every, a truncated log (a files version, and a refusal when
// a log version is asked for), no log at all.
func TestLogVersionPolicy(t *testing.T) {
	ctx := context.Background()
	kinds := func(b *Backuper, a *applied, n int) string {
		t.Helper()
		var out []string
		for i := range n {
			writeRound(a, i)
			v, err := b.Create(ctx)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, string(v.Kind))
		}
		return strings.Join(out, " ")
	}
	tests := []struct {
		name   string
		policy Policy
		want   string
	}{
		{"off", Policy{}, "files files files files"},
		{"full every 3", Policy{LogRatio: 10, FullEvery: 3}, "files log log files log log files"},
		{"full every 1", Policy{LogRatio: 10, FullEvery: 1}, "files files files"},
		// Each round logs about 2.3 KB, and a base is about 100 KB of
		// incompressible values (120 KB with its metadata): two rounds fit under
		// 5%, three do not.
		{"ratio", Policy{LogRatio: 0.05}, "files log log files log log files"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMember(t)
			putRandom(m, 200, 500)
			a := newApplied(t, m)
			b := newLogBackuper(t, m, a, fileTarget(t), tt.policy)
			if got := kinds(b, a, len(strings.Fields(tt.want))); got != tt.want {
				t.Errorf("kinds %q, want %q", got, tt.want)
			}
		})
	}

	t.Run("truncated log", func(t *testing.T) {
		m := newMember(t)
		a := newApplied(t, m)
		target := fileTarget(t)
		b := newLogBackuper(t, m, a, target, Policy{LogRatio: 10})
		if got := kinds(b, a, 2); got != "files log" {
			t.Fatalf("kinds %q", got)
		}
		writeRound(a, 7)
		a.log.truncate(a.app.AppliedIndex()) // a snapshot, or log compaction's batches
		before := listTree(t, target.dir)
		if _, err := b.CreateKind(ctx, KindLog); !errors.Is(err, ErrNoLogVersion) || !strings.Contains(err.Error(), "no longer holds entry") {
			t.Errorf("a log version over a truncated log = %v, want ErrNoLogVersion saying the log no longer holds the entry", err)
		}
		if after := listTree(t, target.dir); after != before {
			t.Errorf("a refused log version changed the target:\n%s\nwas\n%s", after, before)
		}
		v, err := b.Create(ctx)
		if err != nil || v.IsLog() {
			t.Fatalf("a version over a truncated log: %+v, %v; want a files version", v, err)
		}
		writeRound(a, 8)
		if v, err := b.Create(ctx); err != nil || !v.IsLog() || v.Base != 3 {
			t.Errorf("the version after the files version: %+v, %v; want a log version on version 3", v, err)
		}
	})

	t.Run("no log", func(t *testing.T) {
		m := newMember(t)
		b := newBackuper(t, m, fileTarget(t))
		b.cfg.Policy = Policy{LogRatio: 10}
		m.put("a", 3, 10)
		for range 2 {
			if v, err := b.Create(ctx); err != nil || v.IsLog() {
				t.Fatalf("a version without a log: %+v, %v", v, err)
			}
		}
		if _, err := b.CreateKind(ctx, KindLog); !errors.Is(err, ErrNoLogVersion) {
			t.Errorf("a log version without a log = %v, want ErrNoLogVersion", err)
		}
	})
}

// TestLogVersionDamaged: a log version whose base or log objects are
// missing or damaged is refused by Verify (naming what is wrong) and by
// Restore (leaving nothing behind), with ErrCorrupt; the base itself
// still verifies and restores while only a log object is damaged.
func TestLogVersionDamaged(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*FileTarget, *Manifest, *Manifest) {
		m := newMember(t)
		m.put("big", 50, 500)
		a := newApplied(t, m)
		target := fileTarget(t)
		b := newLogBackuper(t, m, a, target, Policy{LogRatio: 10})
		base, err := b.Create(ctx)
		if err != nil {
			t.Fatal(err)
		}
		writeRound(a, 1)
		writeRound(a, 2)
		lv, err := b.Create(ctx)
		if err != nil || !lv.IsLog() || len(lv.Log) == 0 {
			t.Fatalf("log version: %+v, %v", lv, err)
		}
		return target, base, lv
	}
	objPath := func(target *FileTarget, o LogObject) string { return target.path(logName(o.First, o.Last)) }
	tests := []struct {
		name   string
		damage func(t *testing.T, target *FileTarget, base, lv *Manifest)
		// want is in the error of both Verify and Restore.
		want string
	}{
		{"log object flipped", func(t *testing.T, target *FileTarget, base, lv *Manifest) {
			p := objPath(target, lv.Log[0])
			raw, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			raw[len(raw)-2] ^= 1
			if err := os.WriteFile(p, raw, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "has sha256"},
		{"log object truncated", func(t *testing.T, target *FileTarget, base, lv *Manifest) {
			if err := os.Truncate(objPath(target, lv.Log[0]), lv.Log[0].Size-1); err != nil {
				t.Fatal(err)
			}
		}, "bytes, the manifest says"},
		{"log object missing", func(t *testing.T, target *FileTarget, base, lv *Manifest) {
			if err := os.Remove(objPath(target, lv.Log[0])); err != nil {
				t.Fatal(err)
			}
		}, "no such object"},
		{"base missing", func(t *testing.T, target *FileTarget, base, lv *Manifest) {
			if err := os.Remove(target.path(manifestName(base.Version))); err != nil {
				t.Fatal(err)
			}
		}, "is a log version on version 1, which"},
		{"base file damaged", func(t *testing.T, target *FileTarget, base, lv *Manifest) {
			corrupt(t, target, base)
		}, "has sha256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			target, base, lv := setup(t)
			tt.damage(t, target, base, lv)
			before := listTree(t, target.dir)
			rep, err := Verify(ctx, target, lv.Version)
			if !errors.Is(err, ErrCorrupt) || len(rep.Bad) == 0 || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("verify: %+v, %v; want ErrCorrupt with %q", rep, err, tt.want)
			}
			if _, _, err := restoreAnswer(t, target, restoreConfig("", lv.Version)); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("restore: %v; want ErrCorrupt with %q", err, tt.want)
			}
			if after := listTree(t, target.dir); after != before {
				t.Errorf("verify or restore changed the target")
			}
		})
	}
}
