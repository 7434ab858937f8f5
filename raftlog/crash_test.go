package raftlog

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// crashPoint is a power cut taken while operation `inFlight` ran: the
// recovered log must equal the model before it or after it (each operation
// is atomic on disk).
type crashPoint struct {
	fs       *vfs.MemFS
	inFlight int
	fsOp     errorfs.Op
}

// TestCrashAtRandomPoints runs random operations on a crashable file system
// and takes CrashClones just before random write-type file operations (in
// the middle of appends, segment creation, renames, deletions), keeping
// only synced data or a random part of unsynced data. Every clone must
// recover to the state before or after the operation in flight: every
// Append that returned is there, nothing half-done is visible. The
// recovered log must then accept appends and reopen cleanly.
//
// With several directories the parts of an Append are written by
// goroutines of their own, so the crash points a seed draws depend on
// their interleaving; every one is checked all the same.
func TestCrashAtRandomPoints(t *testing.T) {
	for _, c := range []struct{ ndirs, stripe int }{{1, 0}, {2, -1}, {3, -1}, {2, 0}} {
		for seed := uint64(1); seed <= 4; seed++ {
			t.Run(fmt.Sprintf("dirs%d/stripe%d/seed%d", c.ndirs, c.stripe, seed), func(t *testing.T) {
				crashAtRandomPoints(t, seed, testDirs(c.ndirs), c.stripe)
			})
		}
	}
}

func crashAtRandomPoints(t *testing.T, seed uint64, dirs []string, stripe int) {
	{
		{
			rng := rand.New(rand.NewPCG(seed, 99))
			mem := vfs.NewCrashableMem()
			var crashes []crashPoint
			inFlight := 0
			// The injector also runs on the goroutine preparing spare
			// segment files: mu guards rng, crashes and inFlight.
			var mu sync.Mutex
			inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
				switch op.Kind {
				case errorfs.OpCreate, errorfs.OpFilePreallocate, errorfs.OpFileWrite, errorfs.OpFileSync, errorfs.OpFileClose:
					if strings.Contains(op.Path, "spare-") {
						// The spare goroutine's operations interleave with
						// the writer's nondeterministically: crash only at
						// the writer's (which include writing a spare's
						// first frames and renaming it), so that a seed
						// always crashes at the same points.
						return nil
					}
				}
				mu.Lock()
				defer mu.Unlock()
				// Crash often just before an fdatasync: the write before it
				// may then survive in part (a torn frame).
				odds := 40
				if op.Kind == errorfs.OpFileSyncData {
					odds = 4
				}
				if op.Kind.ReadOrWrite() == errorfs.OpIsWrite && rng.IntN(odds) == 0 {
					cfg := vfs.CrashCloneCfg{}
					if p := rng.IntN(3); p > 0 {
						cfg = vfs.CrashCloneCfg{UnsyncedDataPercent: p * 50, RNG: rand.New(rand.NewPCG(rng.Uint64(), 0))}
					}
					crashes = append(crashes, crashPoint{fs: mem.CrashClone(cfg), inFlight: inFlight, fsOp: op})
				}
				return nil
			})
			fs := errorfs.Wrap(mem, inj)
			opts := Options{FS: fs, Dirs: dirs, SegmentSize: 8 << 10, tailBudget: 4 << 10, MinStripeBytes: stripe}
			l, err := Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			models := []model{{}}
			var term uint64 = 1
			for i := 0; i < 300; i++ {
				mu.Lock()
				inFlight = i
				op := randomOp(rng, models[i], &term)
				mu.Unlock()
				if op.kind == "reopen" {
					_ = l.Close()
					if l, err = Open(opts); err != nil {
						t.Fatal(err)
					}
				} else if err := do(l, op); err != nil {
					t.Fatalf("op %d (%v): %v", i, op, err)
				}
				models = append(models, models[i].apply(op))
			}
			_ = l.Close()
			if len(crashes) < 10 {
				t.Fatalf("only %d crash points", len(crashes))
			}
			torn, sawBefore, sawAfter := 0, 0, 0
			for _, c := range crashes {
				copts := Options{FS: c.fs, Dirs: dirs, SegmentSize: 8 << 10, tailBudget: 4 << 10, MinStripeBytes: stripe}
				core, logs := observer.New(zap.WarnLevel)
				copts.Logger = zap.New(core)
				l, err := Open(copts)
				torn += logs.Len()
				if err != nil {
					t.Fatalf("crash during op %d at %v: Open: %v", c.inFlight, c.fsOp, err)
				}
				before, after := matches(l, models[c.inFlight]), matches(l, models[c.inFlight+1])
				if before == nil {
					sawBefore++
				} else {
					sawAfter++
				}
				if before != nil && after != nil {
					t.Fatalf("crash during op %d at %v: recovered log is neither the state before (%v) nor after (%v)",
						c.inFlight, c.fsOp, before, after)
				}
				// The recovered log takes appends and recovers again.
				last, _ := l.LastIndex()
				mustAppend(t, l, ents(last+1, last+3, 1000), nil)
				_ = l.Close()
				if l, err = Open(copts); err != nil {
					t.Fatalf("crash during op %d: second Open: %v", c.inFlight, err)
				}
				if got, _ := l.LastIndex(); got != last+3 {
					t.Fatalf("crash during op %d: LastIndex after append and reopen = %d, want %d", c.inFlight, got, last+3)
				}
				_ = l.Close()
			}
			t.Logf("%d crash points: %d recovered the state before the operation in flight, %d after; %d torn tails truncated",
				len(crashes), sawBefore, sawAfter, torn)
		}
	}
}

// frameOffsets lists the frame offsets of a segment file.
func frameOffsets(t *testing.T, fs vfs.FS, name string) []int64 {
	t.Helper()
	f, err := fs.Open(fs.PathJoin(testDir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var offs []int64
	if _, err := scanSegment(f, name, true, func(off int64, _ byte, _ []byte) error {
		offs = append(offs, off)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return offs
}

func writeAt(t *testing.T, fs vfs.FS, name string, off int64, b []byte) {
	t.Helper()
	f, err := fs.OpenReadWrite(fs.PathJoin(testDir, name), vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestDamage damages a log on disk in the ways FORMAT.md distinguishes:
// torn or garbage tails of the last segment are truncated (and logged) and
// everything before them kept; any other damage is ErrCorrupt naming the
// file and offset.
func TestDamage(t *testing.T) {
	type layout struct {
		fs    vfs.FS
		names []string  // segments, oldest first
		offs  [][]int64 // frame offsets per segment
	}
	const perBatch, batches = 5, 40
	tests := []struct {
		name string
		// damage returns the file and offset it damaged.
		damage func(t *testing.T, lay layout) (string, int64)
		// wantLast is the last index after recovery; 0 means ErrCorrupt.
		wantLast uint64
		wantWarn bool
	}{{
		name: "torn last frame",
		damage: func(t *testing.T, lay layout) (string, int64) {
			n := lay.names[len(lay.names)-1]
			offs := lay.offs[len(lay.names)-1]
			off := offs[len(offs)-1]
			writeAt(t, lay.fs, n, off+40, make([]byte, 40)) // lose the sectors in the middle
			return n, off
		},
		wantLast: (batches - 1) * perBatch, wantWarn: true,
	}, {
		name: "zeroed last frame",
		damage: func(t *testing.T, lay layout) (string, int64) {
			n := lay.names[len(lay.names)-1]
			offs := lay.offs[len(lay.names)-1]
			writeAt(t, lay.fs, n, offs[len(offs)-1], make([]byte, 1024))
			return n, offs[len(offs)-1]
		},
		wantLast: (batches - 1) * perBatch,
	}, {
		name: "garbage tail",
		damage: func(t *testing.T, lay layout) (string, int64) {
			n := lay.names[len(lay.names)-1]
			f, _ := lay.fs.Open(lay.fs.PathJoin(testDir, n))
			st, _ := f.Stat()
			_ = f.Close()
			end := st.Size() - 1000 // well after the last frame: preallocated zeros
			writeAt(t, lay.fs, n, end, []byte(strings.Repeat("garbage!", 50)))
			return n, end
		},
		wantLast: batches * perBatch, wantWarn: true,
	}, {
		name: "flipped byte in a middle frame of the last segment",
		damage: func(t *testing.T, lay layout) (string, int64) {
			i := len(lay.names) - 1
			if len(lay.offs[i]) < 3 {
				t.Fatal("last segment needs three frames")
			}
			off := lay.offs[i][1]
			writeAt(t, lay.fs, lay.names[i], off+30, []byte{0xff})
			return lay.names[i], off
		},
	}, {
		name: "flipped byte in the last frame of a sealed segment",
		damage: func(t *testing.T, lay layout) (string, int64) {
			offs := lay.offs[0]
			off := offs[len(offs)-1]
			writeAt(t, lay.fs, lay.names[0], off+20, []byte{0xff})
			return lay.names[0], off
		},
	}, {
		name: "zeroed frame in a sealed segment",
		damage: func(t *testing.T, lay layout) (string, int64) {
			offs := lay.offs[0]
			writeAt(t, lay.fs, lay.names[0], offs[1], make([]byte, 16))
			return lay.names[0], offs[1]
		},
	}, {
		name: "bad segment header",
		damage: func(t *testing.T, lay layout) (string, int64) {
			writeAt(t, lay.fs, lay.names[1], 20, []byte{0xff})
			return lay.names[1], 0
		},
	}, {
		name: "missing middle segment",
		damage: func(t *testing.T, lay layout) (string, int64) {
			if err := lay.fs.Remove(lay.fs.PathJoin(testDir, lay.names[1])); err != nil {
				t.Fatal(err)
			}
			return "", -1
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := vfs.NewMem()
			l := openLog(t, fs, 4096)
			for b := uint64(0); b < batches; b++ {
				mustAppend(t, l, ents(b*perBatch+1, b*perBatch+perBatch, 1), hs(1, 1, b*perBatch))
			}
			_ = l.Close()
			names, _, err := listSegments(fs, testDir)
			if err != nil || len(names) < 3 {
				t.Fatalf("segments %v, %v: the test needs three", names, err)
			}
			lay := layout{fs: fs, names: names}
			for _, n := range names {
				lay.offs = append(lay.offs, frameOffsets(t, fs, n))
			}
			file, off := tt.damage(t, lay)
			l, logs, err := openObserved(t, fs, 4096)
			if tt.wantLast == 0 {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Open: %v, want ErrCorrupt", err)
				}
				if file != "" && (!strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), fmt.Sprintf("offset %d", off))) {
					t.Fatalf("error %q does not name file %s and offset %d", err, file, off)
				}
				// Inspect reads files one by one: it sees damage inside a file.
				if _, ierr := Inspect(fs, []string{testDir}); file != "" && !errors.Is(ierr, ErrCorrupt) {
					t.Fatalf("Inspect: %v, want ErrCorrupt", ierr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			checkLog(t, l, 0, 0, ents(1, tt.wantLast, 1), hardState{1, 1, tt.wantLast - perBatch})
			checkWarning(t, logs, tt.wantWarn, file, tt.wantLast)
			// The truncated tail is gone for good: append, reopen, no warning.
			mustAppend(t, l, ents(tt.wantLast+1, tt.wantLast+2, 2), nil)
			_ = l.Close()
			l, logs, err = openObserved(t, fs, 4096)
			if err != nil {
				t.Fatalf("second Open: %v", err)
			}
			defer l.Close()
			checkLog(t, l, 0, 0, append(ents(1, tt.wantLast, 1), ents(tt.wantLast+1, tt.wantLast+2, 2)...),
				hardState{1, 1, tt.wantLast - perBatch})
			checkWarning(t, logs, false, "", 0)
		})
	}
}

func checkWarning(t *testing.T, logs *observer.ObservedLogs, want bool, file string, lastGood uint64) {
	t.Helper()
	all := logs.All()
	if !want {
		if len(all) > 0 {
			t.Fatalf("unexpected warnings: %v", all)
		}
		return
	}
	if len(all) != 1 {
		t.Fatalf("got %d warnings, want 1", len(all))
	}
	fields := all[0].ContextMap()
	if !strings.HasSuffix(fmt.Sprint(fields["file"]), file) || fields["last_good_index"] != lastGood || fields["offset"] == nil {
		t.Fatalf("warning %v: want file %s, offset, last good index %d", fields, file, lastGood)
	}
}

// TestCrashedSegmentCreation leaves a temporary segment behind, as a crash
// before the rename would: Open removes it and recovers the rest.
func TestCrashedSegmentCreation(t *testing.T) {
	fs := vfs.NewMem()
	l := openLog(t, fs, 0)
	mustAppend(t, l, ents(1, 3, 1), nil)
	_ = l.Close()
	tmp := fs.PathJoin(testDir, segmentName(9, 4)+tempSuffix)
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.Write([]byte("half a segment"))
	_ = f.Close()
	l = openLog(t, fs, 0)
	defer l.Close()
	checkLog(t, l, 0, 0, ents(1, 3, 1), hardState{})
	if _, err := fs.Stat(tmp); err == nil {
		t.Fatal("temporary file survived Open")
	}
	_ = raftpb.Entry{}
}
