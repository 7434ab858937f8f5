package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/engines"
	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/mvcc"
)

// member is an engine and its store, as a member holds them, written to
// directly (index i applies the i-th batch).
type member struct {
	t     *testing.T
	eng   engine.Engine
	store *mvcc.Store
	index uint64
}

func newMember(t *testing.T) *member {
	t.Helper()
	eng, err := pebbleengine.Open(filepath.Join(t.TempDir(), "engine"), pebbleengine.Options{CacheSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	return startMember(t, eng)
}

// startMember starts a store on eng, which the caller closes.
func startMember(t *testing.T, eng engine.Engine) *member {
	t.Helper()
	store, err := mvcc.Open(eng, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := &member{t: t, eng: eng, store: store}
	cs, err := proto.Marshal(&raftpb.ConfState{Voters: []uint64{1, 2, 3}, Learners: []uint64{4}})
	if err != nil {
		t.Fatal(err)
	}
	m.write(func(w *mvcc.WriteBatch) error { return w.SetMeta("raft/confstate", cs) })
	return m
}

// write applies one batch at the next index.
func (m *member) write(fn func(w *mvcc.WriteBatch) error) {
	m.t.Helper()
	w := m.store.Write(nil)
	if err := fn(w); err != nil {
		w.Abort()
		m.t.Fatal(err)
	}
	m.index++
	if err := w.Commit(m.index); err != nil {
		m.t.Fatal(err)
	}
}

// put writes n keys prefix0..prefixN-1 with values of size bytes, one
// batch each.
func (m *member) put(prefix string, n, size int) {
	m.t.Helper()
	for i := range n {
		m.write(func(w *mvcc.WriteBatch) error {
			_, err := w.Put(&pb.PutRequest{Key: fmt.Appendf(nil, "%s%04d", prefix, i), Value: []byte(strings.Repeat(prefix[:1], size))})
			return err
		})
	}
}

// kvs returns every key and its value, mod revision and version, as
// lines, at the store's revision.
func kvs(t *testing.T, store *mvcc.Store) []string {
	t.Helper()
	resp, err := store.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, fmt.Sprintf("%s=%d bytes c%d m%d v%d", kv.Key, len(kv.Value), kv.CreateRevision, kv.ModRevision, kv.Version))
	}
	return out
}

var testID = datadir.ID{Name: "a", MemberID: 0xa1, ClusterID: 0xc1}

func newBackuper(t *testing.T, m *member, target Target) *Backuper {
	clock := time.Date(2026, 11, 25, 8, 0, 0, 0, time.UTC)
	return New(Config{
		Engine: m.eng, Target: target, ID: testID, StagingDir: t.TempDir(),
		Term: func(uint64) (uint64, error) { return 7, nil },
		Now:  func() time.Time { clock = clock.Add(time.Hour); return clock },
	})
}

func fileTarget(t *testing.T) *FileTarget {
	t.Helper()
	ft, err := NewFileTarget(filepath.Join(t.TempDir(), "target"))
	if err != nil {
		t.Fatal(err)
	}
	return ft
}

func hashes(m *Manifest) map[string]bool {
	out := map[string]bool{}
	for _, f := range m.Files {
		out[f.SHA256] = true
	}
	return out
}

// TestIncremental: the first version uploads every file; a second one
// after a small change uploads only the files the first did not have,
// which are a small part of the whole; the manifests record the engine's
// state.
func TestIncremental(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	m.put("a", 200, 1000)
	target := fileTarget(t)
	b := newBackuper(t, m, target)
	v1, err := b.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Files of equal content (Pebble's empty marker files) are stored once.
	if v1.Version != 1 || v1.NewFiles != uint64(len(hashes(v1))) || v1.NewBytes != uint64(v1.Size()) {
		t.Errorf("first version: version %d, new %d of %d files (%d distinct), %d of %d bytes; want version 1, all new",
			v1.Version, v1.NewFiles, len(v1.Files), len(hashes(v1)), v1.NewBytes, v1.Size())
	}
	if v1.RaftIndex != m.index || v1.RaftTerm != 7 || v1.Revision != m.store.Rev() || v1.CompactRevision != -1 ||
		v1.ClusterID != 0xc1 || v1.MemberID != 0xa1 || fmt.Sprint(v1.ConfState.Voters) != "[1 2 3]" || fmt.Sprint(v1.ConfState.Learners) != "[4]" {
		t.Errorf("first version's metadata: %+v", v1)
	}
	m.put("b", 3, 10)
	hashedBefore := b.Stats().BytesHashed
	v2, err := b.Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The tables the first version hashed are not hashed again.
	var unchanged int64
	for _, f := range v2.Files {
		if immutable(f.Name) && hashes(v1)[f.SHA256] {
			unchanged += f.Size
		}
	}
	if hashed := b.Stats().BytesHashed - hashedBefore; unchanged == 0 || hashed > uint64(v2.Size()-unchanged) {
		t.Errorf("second version hashed %d bytes of %d, %d of them in tables the first had hashed", hashed, v2.Size(), unchanged)
	}
	if st := b.Stats(); st.Versions != 2 || st.LastVersion != 2 || st.LastIndex != m.index || st.FilesUploaded != v1.NewFiles+v2.NewFiles || st.LastSuccess.IsZero() {
		t.Errorf("stats after two versions: %+v", st)
	}
	old := hashes(v1)
	var fresh uint64
	var freshBytes int64
	for _, f := range v2.Files {
		if !old[f.SHA256] {
			old[f.SHA256] = true
			fresh++
			freshBytes += f.Size
		}
	}
	if v2.Version != 2 || v2.NewFiles != fresh || v2.NewBytes != uint64(freshBytes) {
		t.Errorf("second version: version %d, new files %d (%d bytes); want 2, %d (%d bytes)", v2.Version, v2.NewFiles, v2.NewBytes, fresh, freshBytes)
	}
	if v2.NewBytes*5 > uint64(v2.Size()) {
		t.Errorf("second version uploaded %d of %d bytes after a 3-key change; want a small part", v2.NewBytes, v2.Size())
	}
	if v2.RaftIndex != m.index || v2.Revision != m.store.Rev() {
		t.Errorf("second version at index %d revision %d, want %d %d", v2.RaftIndex, v2.Revision, m.index, m.store.Rev())
	}
	list, err := List(ctx, target)
	if err != nil || len(list) != 2 || list[0].Version != 1 || list[1].Version != 2 {
		t.Fatalf("List = %v, %v", list, err)
	}
	// Each file is stored once, under its hash.
	objs, err := target.List(ctx, filesPrefix)
	if err != nil {
		t.Fatal(err)
	}
	all := hashes(v1)
	for h := range hashes(v2) {
		all[h] = true
	}
	if len(objs) != len(all) {
		t.Errorf("target holds %d files, the versions name %d distinct", len(objs), len(all))
	}
}

// failingTarget fails every Put after the first ok ones, or only the
// manifest's, as a target that goes away in the middle of a backup.
type failingTarget struct {
	Target
	ok           int64
	manifestOnly bool
	calls        atomic.Int64
}

var errInjected = errors.New("injected: target unreachable")

func (f *failingTarget) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	if f.manifestOnly && strings.HasPrefix(name, manifestsPrefix) || !f.manifestOnly && f.calls.Add(1) > f.ok {
		return errInjected
	}
	return f.Target.Put(ctx, name, r, size)
}

// TestManifestLast: a backup whose target fails before the first upload,
// after one, or at the manifest writes no manifest, so no manifest names
// a missing file; the next backup completes and uploads only what the
// failed ones had not.
func TestManifestLast(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	m.put("a", 100, 500)
	target := fileTarget(t)
	if _, err := newBackuper(t, m, target).Create(ctx); err != nil {
		t.Fatal(err)
	}
	// New table and MANIFEST: at least two files to upload.
	m.put("c", 100, 500)
	for _, failing := range []*failingTarget{{Target: target, ok: 0}, {Target: target, ok: 1}, {Target: target, manifestOnly: true}} {
		_, err := newBackuper(t, m, failing).Create(ctx)
		if !errors.Is(err, errInjected) {
			t.Fatalf("%+v: Create = %v, want the injected failure", failing, err)
		}
		list, err := List(ctx, target)
		if err != nil || len(list) != 1 {
			t.Fatalf("%+v: after the failure the target lists %d versions (%v); want only the first", failing, len(list), err)
		}
		if _, err := Verify(ctx, target, 1); err != nil {
			t.Fatalf("%+v: %v", failing, err)
		}
	}
	before, err := target.List(ctx, filesPrefix)
	if err != nil {
		t.Fatal(err)
	}
	v2, err := newBackuper(t, m, target).Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after, err := target.List(ctx, filesPrefix)
	if err != nil {
		t.Fatal(err)
	}
	// It uploads exactly the files of its checkpoint that the failed runs
	// had not (the engine may have compacted since, so there can be some).
	present := map[string]bool{}
	for _, o := range before {
		present[strings.TrimPrefix(o.Name, filesPrefix)] = true
	}
	var missing uint64
	for h := range hashes(v2) {
		if !present[h] {
			missing++
		}
	}
	if v2.Version != 2 || v2.NewFiles != missing || uint64(len(after)-len(before)) != missing {
		t.Errorf("resumed version %d uploaded %d files, the target grew by %d; want version 2 and %d", v2.Version, v2.NewFiles, len(after)-len(before), missing)
	}
	if _, err := Verify(ctx, target, 2); err != nil {
		t.Fatal(err)
	}
}

// TestPrune: retention keeps what its rules say and always the newest;
// garbage collection deletes exactly the files no kept version names; the
// kept versions still verify and restore.
func TestPrune(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name     string
		r        Retention
		kept     []uint64
		wantErr  string
		versions int
	}{
		{name: "keep last 1", r: Retention{KeepLast: 1}, kept: []uint64{4}, versions: 4},
		{name: "keep last 2", r: Retention{KeepLast: 2}, kept: []uint64{3, 4}, versions: 4},
		{name: "keep last more than there are", r: Retention{KeepLast: 9}, kept: []uint64{1, 2, 3, 4}, versions: 4},
		// Versions are one hour apart (the test clock), the last at 12:00.
		{name: "keep within 90 minutes", r: Retention{KeepWithin: 90 * time.Minute}, kept: []uint64{3, 4}, versions: 4},
		{name: "keep within keeps the newest however old", r: Retention{KeepWithin: time.Minute,
			Now: func() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }}, kept: []uint64{4}, versions: 4},
		{name: "either rule keeps", r: Retention{KeepLast: 1, KeepWithin: 150 * time.Minute}, kept: []uint64{2, 3, 4}, versions: 4},
		{name: "exponential: four hours of one day", r: Retention{Exponential: true}, kept: []uint64{1, 2, 3, 4}, versions: 4},
		{name: "exponential two days later: the last of the day", r: Retention{Exponential: true,
			Now: func() time.Time { return time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC) }}, kept: []uint64{4}, versions: 4},
		{name: "no rule", r: Retention{}, wantErr: "no retention given", versions: 1},
		{name: "negative", r: Retention{KeepLast: -1}, wantErr: "negative retention", versions: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMember(t)
			target := fileTarget(t)
			b := newBackuper(t, m, target)
			for i := range tc.versions {
				m.put(fmt.Sprintf("k%d", i), 50, 300)
				if i == 2 {
					// Merges the tables: the older versions' files are
					// no longer the newest's.
					if err := m.eng.CompactAll(); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := b.Create(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if tc.r.Now == nil {
				tc.r.Now = func() time.Time { return time.Date(2026, 11, 25, 12+tc.versions-4, 0, 0, 0, time.UTC) }
			}
			rep, err := Prune(ctx, target, tc.r)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Prune = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(rep.Kept) != fmt.Sprint(tc.kept) {
				t.Errorf("kept %v, want %v", rep.Kept, tc.kept)
			}
			list, err := List(ctx, target)
			if err != nil {
				t.Fatal(err)
			}
			named := map[string]bool{}
			var listed []uint64
			for _, v := range list {
				listed = append(listed, v.Version)
				for h := range hashes(v) {
					named[h] = true
				}
			}
			if fmt.Sprint(listed) != fmt.Sprint(tc.kept) {
				t.Errorf("the target lists %v after prune, want %v", listed, tc.kept)
			}
			objs, err := target.List(ctx, filesPrefix)
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) != len(named) {
				t.Errorf("%d files left, the kept versions name %d", len(objs), len(named))
			}
			for _, v := range tc.kept {
				if _, err := Verify(ctx, target, v); err != nil {
					t.Errorf("version %d after prune: %v", v, err)
				}
			}
			// A new version after a prune never reuses a number.
			if v, err := b.Create(ctx); err != nil || v.Version != uint64(tc.versions+1) {
				t.Errorf("Create after prune: version %v, %v; want %d", v, err, tc.versions+1)
			}
		})
	}
}

func restoreConfig(dir string, version uint64) RestoreConfig {
	return RestoreConfig{
		Version: version, DataDir: dir, Name: "r1",
		InitialCluster:      map[string][]string{"r1": {"http://127.0.0.1:2380"}},
		InitialClusterToken: "restored",
	}
}

// openRestored opens a restored data directory's store.
func openRestored(t *testing.T, dir string) *mvcc.Store {
	t.Helper()
	id, ok, err := datadir.ReadID(vfs.Default, dir)
	if err != nil || !ok {
		t.Fatalf("identity of %s: %v, found %v", dir, err, ok)
	}
	eng, err := engines.Open(id.EngineName(), datadir.Engine(dir), engines.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	store, err := mvcc.Open(eng, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return store
}

// TestRestore: each version restores to exactly the state it was taken
// at, as a new member of a new cluster with an applied index of zero and
// none of the old cluster's conf state.
func TestRestore(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	target := fileTarget(t)
	b := newBackuper(t, m, target)
	var want [][]string
	var revs []int64
	for i := range 3 {
		m.put(fmt.Sprintf("r%d", i), 40, 200)
		m.put("a", 5, 10+i) // overwrites: versions and mod revisions move
		if _, err := b.Create(ctx); err != nil {
			t.Fatal(err)
		}
		want = append(want, kvs(t, m.store))
		revs = append(revs, m.store.Rev())
	}
	for i, version := range []uint64{1, 2, 3, 0} {
		want, rev := want[min(i, 2)], revs[min(i, 2)]
		dir := filepath.Join(t.TempDir(), "restored")
		res, err := Restore(ctx, target, restoreConfig(dir, version))
		if err != nil {
			t.Fatalf("restore version %d: %v", version, err)
		}
		if res.Manifest.Version != uint64(min(i, 2)+1) || res.ClusterID == 0xc1 || res.MemberID == 0xa1 {
			t.Errorf("restore version %d: %+v", version, res)
		}
		store := openRestored(t, dir)
		if got := kvs(t, store); strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("restored version %d holds\n%s\nwant\n%s", version, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if store.Rev() != rev || store.AppliedIndex() != 0 {
			t.Errorf("restored version %d: revision %d, applied index %d; want %d, 0", version, store.Rev(), store.AppliedIndex(), rev)
		}
		if raw, err := store.Meta("raft/confstate"); err != nil || raw != nil {
			t.Errorf("restored version %d kept the old conf state: %x, %v", version, raw, err)
		}
		if id, ok, err := datadir.ReadID(vfs.Default, dir); err == nil && ok && id.Name != "r1" {
			t.Errorf("restored identity %+v", id)
		}
		if _, err := os.Stat(dir + ".download"); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("staging directory left behind: %v", err)
		}
	}
}

// corrupt flips one byte in the middle of the largest file of version v.
func corrupt(t *testing.T, target *FileTarget, v *Manifest) File {
	t.Helper()
	var big File
	for _, f := range v.Files {
		if f.Size > big.Size {
			big = f
		}
	}
	p := target.path(fileName(big.SHA256))
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	raw[len(raw)/2] ^= 0x20
	if err := os.WriteFile(p, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return big
}

// TestCorruptFile: a damaged or missing file is found by Verify, which
// names it, and refused by Restore, which leaves no data directory.
func TestCorruptFile(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name   string
		damage func(t *testing.T, target *FileTarget, v *Manifest) File
		want   string
	}{
		{name: "flipped byte", damage: corrupt, want: "has sha256"},
		{name: "missing", damage: func(t *testing.T, target *FileTarget, v *Manifest) File {
			f := v.Files[0]
			for _, g := range v.Files {
				if g.Size > f.Size {
					f = g
				}
			}
			if err := os.Remove(target.path(fileName(f.SHA256))); err != nil {
				t.Fatal(err)
			}
			return f
		}, want: "no such object"},
		{name: "truncated", damage: func(t *testing.T, target *FileTarget, v *Manifest) File {
			f := v.Files[0]
			for _, g := range v.Files {
				if g.Size > f.Size {
					f = g
				}
			}
			if err := os.Truncate(target.path(fileName(f.SHA256)), f.Size-1); err != nil {
				t.Fatal(err)
			}
			return f
		}, want: "bytes, the manifest says"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newMember(t)
			m.put("a", 100, 300)
			target := fileTarget(t)
			v, err := newBackuper(t, m, target).Create(ctx)
			if err != nil {
				t.Fatal(err)
			}
			bad := tc.damage(t, target, v)
			rep, err := Verify(ctx, target, 0)
			if !errors.Is(err, ErrCorrupt) || len(rep.Bad) != 1 || !strings.Contains(rep.Bad[0], bad.Name) || !strings.Contains(rep.Bad[0], tc.want) {
				t.Errorf("Verify = %+v, %v; want the %s file %s reported", rep, err, tc.name, bad.Name)
			}
			dir := filepath.Join(t.TempDir(), "restored")
			_, err = Restore(ctx, target, restoreConfig(dir, 0))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Restore = %v, want a refusal saying %q", err, tc.want)
			}
			for _, p := range []string{dir, dir + ".download", dir + ".restoring"} {
				if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s left behind: %v", p, err)
				}
			}
		})
	}
}

// TestBadInput: each refusal is clear and changes nothing.
func TestBadInput(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	m.put("a", 10, 10)
	target := fileTarget(t)
	if _, err := newBackuper(t, m, target).Create(ctx); err != nil {
		t.Fatal(err)
	}
	existing := t.TempDir()
	if err := os.WriteFile(filepath.Join(existing, "x"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := fileTarget(t)
	tests := []struct {
		name string
		run  func() error
		want string
	}{
		{name: "restore into an existing data dir", want: "exists",
			run: func() error { _, err := Restore(ctx, target, restoreConfig(existing, 0)); return err }},
		{name: "restore a missing version", want: "has no version 9",
			run: func() error {
				_, err := Restore(ctx, target, restoreConfig(filepath.Join(t.TempDir(), "d"), 9))
				return err
			}},
		{name: "restore from an empty target", want: "holds no backup version",
			run: func() error {
				_, err := Restore(ctx, empty, restoreConfig(filepath.Join(t.TempDir(), "d"), 0))
				return err
			}},
		{name: "restore with --name not in --initial-cluster", want: "no member named",
			run: func() error {
				cfg := restoreConfig(filepath.Join(t.TempDir(), "d"), 0)
				cfg.Name = "other"
				_, err := Restore(ctx, target, cfg)
				return err
			}},
		{name: "verify a missing version", want: "has no version 5",
			run: func() error { _, err := Verify(ctx, target, 5); return err }},
		{name: "http URL", want: "want a file:// or s3:// URL",
			run: func() error { _, err := OpenTarget(ctx, "http://example/x", TargetOptions{}); return err }},
		{name: "file URL with a host", want: "local directory",
			run: func() error { _, err := OpenTarget(ctx, "file://host/x", TargetOptions{}); return err }},
		{name: "s3 URL without a bucket", want: "no bucket",
			run: func() error { _, err := OpenTarget(ctx, "s3:///x", TargetOptions{}); return err }},
		{name: "s3 endpoint with a bad scheme", want: "want http or https",
			run: func() error {
				_, err := OpenTarget(ctx, "s3://b/x", TargetOptions{Endpoint: "ftp://127.0.0.1:1"})
				return err
			}},
		{name: "s3 half the credentials", want: "both the access key and the secret key",
			run: func() error {
				_, err := OpenTarget(ctx, "s3://b/x", TargetOptions{Endpoint: "http://127.0.0.1:1", AccessKey: "k"})
				return err
			}},
		{name: "s3 unreachable", want: "127.0.0.1:1",
			run: func() error {
				c, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				_, err := OpenTarget(c, "s3://b/x", TargetOptions{Endpoint: "http://127.0.0.1:1", AccessKey: "k", SecretKey: "s"})
				return err
			}},
		{name: "object name escaping the target", want: "invalid object name",
			run: func() error { return target.Put(ctx, "../x", strings.NewReader("x"), 1) }},
		{name: "put of a name that exists", want: "already exists",
			run: func() error { return target.Put(ctx, manifestName(1), strings.NewReader("x"), 1) }},
		{name: "put shorter than its size", want: "read 1 bytes, want 2",
			run: func() error { return target.Put(ctx, "files/short", strings.NewReader("x"), 2) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
	if _, err := Verify(ctx, target, 1); err != nil {
		t.Errorf("the target after the refusals: %v", err)
	}
	if entries, err := os.ReadDir(existing); err != nil || len(entries) != 1 {
		t.Errorf("the existing data dir after the refusal: %v, %v", entries, err)
	}
	if _, err := target.Stat(ctx, "files/short"); !errors.Is(err, ErrNotExist) {
		t.Errorf("a short put left an object: %v", err)
	}
}

// TestCreateOffline: a stopped member's data directory is backed up
// without changing a file of it, and a directory without an identity is
// refused.
func TestCreateOffline(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "member")
	eng, err := pebbleengine.Open(datadir.Engine(dir), pebbleengine.Options{CacheSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	store, err := mvcc.Open(eng, mvcc.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m := &member{t: t, eng: eng, store: store}
	m.put("k", 20, 100)
	want := kvs(t, store)
	if err := eng.Close(); err != nil {
		t.Fatal(err)
	}
	target := fileTarget(t)
	if _, err := CreateOffline(ctx, dir, target, nil, nil); err == nil || !strings.Contains(err.Error(), "no identity file") {
		t.Fatalf("CreateOffline without an identity = %v", err)
	}
	if err := datadir.WriteID(vfs.Default, dir, testID); err != nil {
		t.Fatal(err)
	}
	before := listTree(t, dir)
	v, err := CreateOffline(ctx, dir, target, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if v.RaftIndex != m.index || v.ClusterID != ID(testID.ClusterID) {
		t.Errorf("offline version: %+v", v)
	}
	if after := listTree(t, dir); after != before {
		t.Errorf("the data dir changed:\nbefore\n%s\nafter\n%s", before, after)
	}
	res := filepath.Join(t.TempDir(), "restored")
	if _, err := Restore(ctx, target, restoreConfig(res, 0)); err != nil {
		t.Fatal(err)
	}
	if got := kvs(t, openRestored(t, res)); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("restored %v, want %v", got, want)
	}
}

// listTree describes every file below dir (name, size, mtime), except the
// LOCK, which taking it may create.
func listTree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || info.Name() == "LOCK" {
			return err
		}
		fmt.Fprintf(&b, "%s %d %s\n", p, info.Size(), info.ModTime())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestRun: the continuous mode takes a version every interval and prunes
// after each, until its context ends.
func TestRun(t *testing.T) {
	m := newMember(t)
	m.put("a", 20, 100)
	target := fileTarget(t)
	b := newBackuper(t, m, target)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx, 5*time.Millisecond, Retention{KeepLast: 1}) }()
	deadline := time.Now().Add(20 * time.Second)
	for b.Stats().Versions < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("3 versions not taken in 20 s: %+v", b.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run = %v, want context.Canceled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	// The cancel may land between a version and its prune, or in the
	// middle of a version (a failure): at most the last two are left.
	list, err := List(context.Background(), target)
	st := b.Stats()
	if err != nil || len(list) == 0 || len(list) > 2 || list[len(list)-1].Version != st.LastVersion || st.Failures > 1 {
		t.Errorf("after Run with keep-last 1: %d versions (%v), stats %+v", len(list), err, st)
	}
	if err := b.Run(context.Background(), 0, Retention{}); err == nil {
		t.Error("Run with interval 0 started")
	}
}

// TestOpenTargetMustExist: a reader's open (MustExist) refuses a file://
// directory that is missing or is a file, creating nothing, and opens an
// existing one without writing to it; a writer's open creates it.
func TestOpenTargetMustExist(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	missing := filepath.Join(root, "missing")
	if _, err := OpenTarget(ctx, "file://"+missing, TargetOptions{MustExist: true}); err == nil || !strings.Contains(err.Error(), "no such directory") {
		t.Errorf("MustExist open of a missing directory: %v, want no such directory", err)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Error("MustExist open created the missing directory")
	}
	file := filepath.Join(root, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenTarget(ctx, "file://"+file, TargetOptions{MustExist: true}); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("MustExist open of a file: %v, want not a directory", err)
	}
	empty := filepath.Join(root, "empty")
	if err := os.Mkdir(empty, 0o700); err != nil {
		t.Fatal(err)
	}
	tg, err := OpenTarget(ctx, "file://"+empty, TargetOptions{MustExist: true})
	if err != nil {
		t.Fatalf("MustExist open of an existing directory: %v", err)
	}
	if objs, err := tg.List(ctx, ""); err != nil || len(objs) != 0 {
		t.Errorf("List of an empty target: %v, %v", objs, err)
	}
	if entries, err := os.ReadDir(empty); err != nil || len(entries) != 0 {
		t.Errorf("MustExist open wrote to the target: %v, %v", entries, err)
	}
	if _, err := OpenTarget(ctx, "file://"+missing, TargetOptions{}); err != nil {
		t.Fatalf("a writer's open of a missing directory: %v", err)
	}
	if _, err := os.Stat(missing); err != nil {
		t.Errorf("a writer's open did not create the directory: %v", err)
	}
}
