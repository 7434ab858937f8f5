package engines

import (
	"fmt"
	"maps"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/enginetest"
)

func TestOpenByName(t *testing.T) {
	tests := []struct {
		name    string
		engine  string
		fs      vfs.FS
		wantErr string
	}{
		{name: "default", engine: ""},
		{name: "pebble", engine: Pebble},
		{name: "pebble in memory", engine: Pebble, fs: vfs.NewMem()},
		{name: "bbolt", engine: Bbolt},
		{name: "bbolt on the default fs", engine: Bbolt, fs: vfs.Default},
		{name: "bbolt in memory", engine: Bbolt, fs: vfs.NewMem(), wantErr: "works on the operating system's files only"},
		{name: "appendlog", engine: AppendLog},
		{name: "appendlog in memory", engine: AppendLog, fs: vfs.NewMem(), wantErr: "works on the operating system's files only"},
		{name: "hybridlog", engine: HybridLog},
		{name: "hybridlog in memory", engine: HybridLog, fs: vfs.NewMem(), wantErr: "works on the operating system's files only"},
		{name: "unknown", engine: "rocksdb", wantErr: `unknown engine "rocksdb": --engine takes pebble, bbolt, appendlog or hybridlog`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "engine")
			e, err := Open(tc.engine, dir, Options{FS: tc.fs})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Open error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestConformance(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			enginetest.Run(t, func(t *testing.T, dir string) engine.Engine {
				e, err := Open(name, dir, Options{})
				if err != nil {
					t.Fatal(err)
				}
				return e
			})
		})
	}
}

func scan(t *testing.T, r engine.Reader) map[string]string {
	t.Helper()
	out := map[string]string{}
	it := r.NewIter([]byte("k"), []byte("l"))
	for ok := it.First(); ok; ok = it.Next() {
		out[string(it.Key())] = string(it.Value())
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSnapshotAcrossEngines: a snapshot exported by any engine installs
// into any engine, which then holds the same keys and applied index.
func TestSnapshotAcrossEngines(t *testing.T) {
	for _, from := range Names() {
		for _, to := range Names() {
			t.Run(from+"->"+to, func(t *testing.T) {
				src, err := Open(from, t.TempDir(), Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer src.Close()
				b := src.NewBatch()
				for i := range 100 {
					_ = b.Set(fmt.Appendf(nil, "k%03d", i), fmt.Appendf(nil, "v%d", i))
				}
				if err := b.Commit(77); err != nil {
					t.Fatal(err)
				}
				dst, err := Open(to, t.TempDir(), Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer dst.Close()
				b = dst.NewBatch()
				_ = b.Set([]byte("kold"), []byte("x"))
				if err := b.Commit(3); err != nil {
					t.Fatal(err)
				}
				path := filepath.Join(t.TempDir(), "staged")
				w, err := dst.NewSnapshotWriter(path)
				if err != nil {
					t.Fatal(err)
				}
				v, err := src.NewExportView()
				if err != nil {
					t.Fatal(err)
				}
				if err := v.ForEach(w.Add); err != nil {
					t.Fatal(err)
				}
				_ = v.Close()
				if err := w.Finish(); err != nil {
					t.Fatal(err)
				}
				idx, err := dst.InstallSnapshot(path)
				if err != nil {
					t.Fatal(err)
				}
				if idx != 77 || dst.AppliedIndex() != 77 || dst.DurableIndex() != 77 {
					t.Fatalf("installed %d, applied %d, durable %d; want 77", idx, dst.AppliedIndex(), dst.DurableIndex())
				}
				if got, want := scan(t, dst), scan(t, src); !maps.Equal(got, want) {
					t.Fatalf("installed %d keys, want %d", len(got), len(want))
				}
			})
		}
	}
}

// TestForeignEngineRefused: an engine is not opened over the other's files.
func TestForeignEngineRefused(t *testing.T) {
	tests := []struct{ first, second, wantErr string }{
		{first: Pebble, second: Bbolt, wantErr: "the directory holds a pebble engine"},
		{first: Bbolt, second: Pebble, wantErr: "the directory holds a bbolt engine (bbolt.db)"},
		{first: AppendLog, second: Pebble, wantErr: "the directory holds an appendlog engine"},
		{first: Pebble, second: AppendLog, wantErr: "the directory holds a pebble engine"},
		{first: AppendLog, second: Bbolt, wantErr: "the directory holds an appendlog engine"},
		{first: HybridLog, second: AppendLog, wantErr: "the directory holds a hybridlog engine (stable)"},
		{first: AppendLog, second: HybridLog, wantErr: "the directory holds an appendlog engine"},
	}
	for _, tc := range tests {
		t.Run(tc.first+"-then-"+tc.second, func(t *testing.T) {
			dir := t.TempDir()
			e, err := Open(tc.first, dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := Open(tc.second, dir, Options{}); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Open(%s) over %s: %v, want %q", tc.second, tc.first, err, tc.wantErr)
			}
			e, err = Open(tc.first, dir, Options{})
			if err != nil {
				t.Fatalf("reopen %s: %v", tc.first, err)
			}
			_ = e.Close()
		})
	}
}
