package appendlog

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/RaduBerinde/btreemap"
)

// waitHints waits, bounded, until every sealed file of e's set that holds
// frames has its hint file, and returns how many do.
func waitHints(t *testing.T, e *Engine) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.mu.RLock()
		hinted, missing := 0, 0
		for _, s := range e.mu.segs {
			switch {
			case !s.sealed || s.size <= headerSize:
			case s.hinted:
				hinted++
			default:
				missing++
			}
		}
		e.mu.RUnlock()
		if missing == 0 {
			return hinted
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sealed files still without a hint after 10s", missing)
		}
		e.kickHinter()
		time.Sleep(5 * time.Millisecond)
	}
}

// recovered is what Open rebuilt: every key's location (file, offset,
// length), each file's dead bytes and the applied index.
type recovered struct {
	locs    map[string]string
	dead    map[uint64]int64
	applied uint64
}

func recoveredState(e *Engine) recovered {
	e.mu.RLock()
	defer e.mu.RUnlock()
	r := recovered{locs: map[string]string{}, dead: map[uint64]int64{}, applied: e.AppliedIndex()}
	e.mu.kd.AscendFunc(btreemap.Min[[]byte](), btreemap.Max[[]byte](), func(k []byte, l loc) bool {
		r.locs[string(k)] = fmt.Sprintf("%x@%d+%d", l.seg.id, l.off, l.n)
		return true
	})
	for _, s := range e.mu.segs {
		r.dead[s.id] = s.dead
	}
	return r
}

// copyDir copies the files of src into a new directory.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range ents {
		data, err := os.ReadFile(filepath.Join(src, de.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, de.Name()), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func hintFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*"+hintSuffix))
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// TestHintRecoveryEquivalence: Open rebuilds the same key directory (every
// key at the same file, offset and length), the same dead bytes per file
// and the same applied index whether it reads the sealed files' hints or
// scans the files, and a hint that is missing, truncated, damaged or
// another file's is not used: its file is scanned instead, so a bad hint
// neither loses nor resurrects a key. The history overwrites and deletes
// keys within and across files and merges once, so hints hold deletions
// of keys that older files set.
func TestHintRecoveryEquivalence(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir, Options{MaxFileBytes: 1 << 10, MergeMinBytes: -1})
	rng := rand.New(rand.NewPCG(7, 8))
	state := map[string]string{}
	for i := uint64(1); i <= 300; i++ {
		b := e.NewBatch()
		for range 1 + rng.IntN(4) {
			k := fmt.Sprintf("k%02d", rng.IntN(30))
			if rng.IntN(3) == 0 {
				_ = b.Delete([]byte(k))
				delete(state, k)
			} else {
				v := fmt.Sprintf("v%d-%s", i, strings.Repeat("x", rng.IntN(120)))
				_ = b.Set([]byte(k), []byte(v))
				state[k] = v
			}
		}
		if err := b.Commit(i); err != nil {
			t.Fatal(err)
		}
		if i == 150 {
			if err := e.CompactAll(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := waitHints(t, e); n < 10 {
		t.Fatalf("%d hinted files; the test wants many", n)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	hints := hintFiles(t, dir)

	// The reference: every file scanned.
	ref := copyDir(t, dir)
	for _, h := range hints {
		_ = os.Remove(filepath.Join(ref, filepath.Base(h)))
	}
	r := open(t, ref, Options{MergeMinBytes: -1})
	want := recoveredState(r)
	if r.openHinted != 0 || !maps.Equal(scan(t, r), state) {
		t.Fatalf("without hints: %d files read by hint; keys %v, want %v", r.openHinted, scan(t, r), state)
	}
	_ = r.Close()

	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, dir string, hints []string) // hints: the paths in dir
		hinted bool                                           // Open reads every sealed file by its hint
	}{
		{"present", func(*testing.T, string, []string) {}, true},
		{"missing", func(t *testing.T, _ string, hints []string) {
			for _, h := range hints {
				if err := os.Remove(h); err != nil {
					t.Fatal(err)
				}
			}
		}, false},
		{"truncated", func(t *testing.T, _ string, hints []string) {
			for i, h := range hints {
				st, err := os.Stat(h)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Truncate(h, int64(i)%st.Size()); err != nil {
					t.Fatal(err)
				}
			}
		}, false},
		{"corrupt", func(t *testing.T, _ string, hints []string) {
			for i, h := range hints {
				data, err := os.ReadFile(h)
				if err != nil {
					t.Fatal(err)
				}
				data[(i*131)%len(data)] ^= 0x10
				if err := os.WriteFile(h, data, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}, false},
		{"another file's", func(t *testing.T, _ string, hints []string) {
			first, err := os.ReadFile(hints[0])
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range hints[1:] {
				if err := os.WriteFile(h, first, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			_ = os.Remove(hints[0])
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cp := copyDir(t, dir)
			var paths []string
			for _, h := range hints {
				paths = append(paths, filepath.Join(cp, filepath.Base(h)))
			}
			tc.damage(t, cp, paths)
			e := open(t, cp, Options{MergeMinBytes: -1})
			defer e.Close()
			got := recoveredState(e)
			if got.applied != want.applied || !maps.Equal(got.locs, want.locs) || !maps.Equal(got.dead, want.dead) {
				t.Fatalf("recovered %+v\nwant (scanning) %+v", got, want)
			}
			if keys := scan(t, e); !maps.Equal(keys, state) {
				t.Fatalf("keys %v, want %v", keys, state)
			}
			if tc.hinted && (e.openHinted != len(hints) || e.openScanned > 1) {
				t.Fatalf("%d files read by hint and %d scanned; want %d, and the newest scanned if it holds frames", e.openHinted, e.openScanned, len(hints))
			}
			if !tc.hinted && e.openHinted != 0 {
				t.Fatalf("%d files read by a damaged or missing hint", e.openHinted)
			}
			// The hinter replaces what it found missing or unusable.
			if n := waitHints(t, e); n < len(hints) || len(hintFiles(t, cp)) != n {
				t.Fatalf("%d files hinted after Open and %d hint files; want at least %d, one per hinted file", n, len(hintFiles(t, cp)), len(hints))
			}
		})
	}
}

// TestHintsFollowTheSet: a merge's dropped files lose their hints with
// them, and Open removes the hint of a file it does not replay (left by a
// crash between the removal of a superseded file and of its hint).
func TestHintsFollowTheSet(t *testing.T) {
	dir := t.TempDir()
	e := open(t, dir, Options{MaxFileBytes: 1 << 10, MergeMinBytes: -1})
	for i := uint64(1); i <= 60; i++ {
		b := e.NewBatch()
		_ = b.Set([]byte(fmt.Sprintf("k%02d", i%7)), []byte(strings.Repeat("h", 100)))
		if err := b.Commit(i); err != nil {
			t.Fatal(err)
		}
	}
	waitHints(t, e)
	if err := e.CompactAll(); err != nil {
		t.Fatal(err)
	}
	n := waitHints(t, e)
	if got := len(hintFiles(t, dir)); got != n {
		t.Fatalf("%d hint files in the directory after a merge, %d files of the set hinted", got, n)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	stale := hintPath(filepath.Join(dir, fileName(3)))
	if err := os.WriteFile(stale, []byte("a superseded file's hint"), 0o600); err != nil {
		t.Fatal(err)
	}
	e = open(t, dir, Options{MergeMinBytes: -1})
	defer e.Close()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("a hint without its data file is still there after Open: %v", err)
	}
}

// FuzzHintDecode: decodeHint, given any bytes under a valid CRC, returns
// an error or entries that lie inside the data file they name, and what it
// returns encodes and decodes back to the same.
func FuzzHintDecode(f *testing.F) {
	h := &hint{id: idStep, size: 4096, dead: 17, entries: []hintEntry{
		{key: []byte("a"), off: headerSize + 12, n: 3},
		{key: []byte("b"), del: true},
		{key: bytes.Repeat([]byte{0}, 300), off: 4000, n: 96},
	}}
	copy(h.dataHdr[:], header{}.encode())
	valid := h.encode()
	f.Add(valid[:len(valid)-hintTrailSize])
	f.Add(valid[:hintHeadSize])
	f.Add([]byte(hintMagic))
	f.Fuzz(func(t *testing.T, body []byte) {
		b := binary.BigEndian.AppendUint32(bytes.Clone(body), crc32.Checksum(body, castagnoli))
		h, err := decodeHint(b)
		if err != nil {
			return
		}
		for _, en := range h.entries {
			if len(en.key) == 0 || len(en.key) > maxKeySize {
				t.Fatalf("key of %d bytes", len(en.key))
			}
			if !en.del && (en.off < headerSize || en.off+int64(en.n) > h.size) {
				t.Fatalf("value of %d bytes at %d, outside a file of %d", en.n, en.off, h.size)
			}
		}
		again, err := decodeHint(h.encode())
		if err != nil {
			t.Fatalf("re-encoded hint does not decode: %v", err)
		}
		if again.id != h.id || again.dataHdr != h.dataHdr || again.size != h.size || again.dead != h.dead || len(again.entries) != len(h.entries) {
			t.Fatalf("round trip: %+v, want %+v", again, h)
		}
		for i := range h.entries {
			a, b := again.entries[i], h.entries[i]
			if !bytes.Equal(a.key, b.key) || a.del != b.del || a.off != b.off || a.n != b.n {
				t.Fatalf("entry %d: %+v, want %+v", i, a, b)
			}
		}
	})
}
