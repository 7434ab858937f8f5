package backup

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/appendlog"
	bboltengine "github.com/strata-kv/strata/engine/bbolt"
	"github.com/strata-kv/strata/engine/engines"
	"github.com/strata-kv/strata/engine/hybridlog"
	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/mvcc"
)

// smallFileEngine opens the engine named name in dir with data files small
// enough that a few hundred kilobytes fill several: appendlog and
// hybridlog seal a file every 32 KiB, so that a version after a small
// change finds most files sealed and already in the target.
func smallFileEngine(t *testing.T, name, dir string) engine.Engine {
	t.Helper()
	var eng engine.Engine
	var err error
	switch name {
	case engines.Pebble:
		eng, err = pebbleengine.Open(dir, pebbleengine.Options{CacheSize: 1 << 20})
	case engines.Bbolt:
		eng, err = bboltengine.Open(dir, bboltengine.Options{})
	case engines.AppendLog:
		eng, err = appendlog.Open(dir, appendlog.Options{MaxFileBytes: 32 << 10})
	case engines.HybridLog:
		eng, err = hybridlog.Open(dir, hybridlog.Options{MemBytes: 32 << 10, Stable: appendlog.Options{MaxFileBytes: 32 << 10}})
	default:
		t.Fatalf("no engine %q", name)
	}
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// putRandom writes keys prefix0000..prefix<n-1> with incompressible values
// of size bytes, one batch each, so that files' sizes are the data's.
func (m *member) putRandom(rng *rand.Rand, prefix string, first, n, size int) {
	m.t.Helper()
	for i := first; i < first+n; i++ {
		value := make([]byte, size)
		for j := range value {
			value[j] = byte(rng.Uint32())
		}
		m.write(func(w *mvcc.WriteBatch) error {
			_, err := w.Put(&pb.PutRequest{Key: fmt.Appendf(nil, "%s%04d", prefix, i), Value: value})
			return err
		})
	}
}

// manifestFormat reads the envelope format of version v's manifest as
// stored in the target.
func manifestFormat(t *testing.T, target Target, v uint64) int {
	t.Helper()
	r, err := target.Get(context.Background(), manifestName(v))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	raw, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatal(err)
	}
	return env.Format
}

// TestEveryEngine: a member on each engine takes versions, online and
// offline, that restore to exactly the state they were taken at, onto
// its own engine and onto another; the manifest names the engine (format
// 3) except Pebble's (format 1, as before other engines could be backed
// up); and on the engines whose files are immutable once sealed (Pebble,
// appendlog, hybridlog) a version after a change of 1% of the keys
// uploads a small part of the first.
func TestEveryEngine(t *testing.T) {
	for _, name := range engines.Names() {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dir := filepath.Join(t.TempDir(), "member")
			if err := datadir.MkdirAllSynced(vfs.Default, datadir.Engine(dir)); err != nil {
				t.Fatal(err)
			}
			eng := smallFileEngine(t, name, datadir.Engine(dir))
			closed := false
			t.Cleanup(func() {
				if !closed {
					_ = eng.Close()
				}
			})
			m := startMember(t, eng)
			rng := rand.New(rand.NewPCG(1, 2))
			m.putRandom(rng, "k", 0, 400, 1000)
			id := testID
			id.Engine = name
			target := fileTarget(t)
			clock := time.Date(2026, 11, 28, 8, 0, 0, 0, time.UTC)
			b := New(Config{Engine: eng, Target: target, ID: id, StagingDir: t.TempDir(),
				Term: func(uint64) (uint64, error) { return 7, nil },
				Now:  func() time.Time { clock = clock.Add(time.Hour); return clock }})
			v1, err := b.Create(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want1 := kvs(t, m.store)
			m.putRandom(rng, "k", 100, 4, 1000) // 1% of the keys
			v2, err := b.Create(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want2 := kvs(t, m.store)

			wantFormat, wantEngine := FormatEngine, name
			if name == engines.Pebble {
				wantFormat, wantEngine = Format, ""
			}
			for _, v := range []*Manifest{v1, v2} {
				if got := manifestFormat(t, target, v.Version); got != wantFormat {
					t.Errorf("version %d written with format %d, want %d", v.Version, got, wantFormat)
				}
				read, err := ReadManifest(ctx, target, v.Version)
				if err != nil {
					t.Fatal(err)
				}
				if read.Engine != wantEngine || read.EngineName() != name {
					t.Errorf("version %d reads engine %q (%s), want %q", v.Version, read.Engine, read.EngineName(), wantEngine)
				}
			}
			t.Logf("%s: version 1 %d bytes in %d files; version 2 uploaded %d of %d bytes (%d of %d files)",
				name, v1.NewBytes, len(v1.Files), v2.NewBytes, v2.Size(), v2.NewFiles, len(v2.Files))
			if name != engines.Bbolt && v2.NewBytes*4 > uint64(v1.Size()) {
				t.Errorf("version 2 after a 1%% change uploaded %d bytes, more than a quarter of version 1's %d", v2.NewBytes, v1.Size())
			}

			other := engines.Pebble
			if name == engines.Pebble {
				other = engines.AppendLog
			}
			for _, tc := range []struct {
				version uint64
				engine  string
				want    []string
			}{{1, "", want1}, {2, "", want2}, {2, other, want2}} {
				res := filepath.Join(t.TempDir(), "restored")
				cfg := restoreConfig(res, tc.version)
				cfg.Engine = tc.engine
				if _, err := Restore(ctx, target, cfg); err != nil {
					t.Fatalf("restore version %d onto %q: %v", tc.version, tc.engine, err)
				}
				rid, _, err := datadir.ReadID(vfs.Default, res)
				if err != nil {
					t.Fatal(err)
				}
				if wantOn := cmp.Or(tc.engine, name); rid.EngineName() != wantOn {
					t.Errorf("version %d restored onto %s, want %s", tc.version, rid.EngineName(), wantOn)
				}
				if got := kvs(t, openRestored(t, res)); strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
					t.Errorf("version %d restored onto %q holds %d keys that differ from the %d it was taken with", tc.version, tc.engine, len(got), len(tc.want))
				}
			}

			// Offline: the stopped member's data directory, unchanged.
			if err := eng.Close(); err != nil {
				t.Fatal(err)
			}
			closed = true
			if err := datadir.WriteID(vfs.Default, dir, id); err != nil {
				t.Fatal(err)
			}
			before := listTree(t, dir)
			v3, err := CreateOffline(ctx, dir, target, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if after := listTree(t, dir); after != before {
				t.Errorf("the data dir changed:\nbefore\n%s\nafter\n%s", before, after)
			}
			if v3.EngineName() != name || v3.RaftIndex != m.index {
				t.Errorf("offline version: engine %s, index %d; want %s, %d", v3.EngineName(), v3.RaftIndex, name, m.index)
			}
			res := filepath.Join(t.TempDir(), "restored")
			if _, err := Restore(ctx, target, restoreConfig(res, v3.Version)); err != nil {
				t.Fatal(err)
			}
			if got := kvs(t, openRestored(t, res)); strings.Join(got, "\n") != strings.Join(want2, "\n") {
				t.Errorf("the offline version restored %d keys that differ from the %d the member held", len(got), len(want2))
			}
		})
	}
}
