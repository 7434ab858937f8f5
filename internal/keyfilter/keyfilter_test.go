package keyfilter

import (
	"hash/maphash"
	"strconv"
	"testing"
)

// keyHashes returns the hashes of n distinct keys with the given prefix.
func keyHashes(seed maphash.Seed, prefix string, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = maphash.String(seed, prefix+strconv.Itoa(i))
	}
	return hs
}

// TestFilters checks both filters: no false negatives ever, and false
// positives near the rate the package comment promises.
func TestFilters(t *testing.T) {
	seed := maphash.MakeSeed()
	type filter interface {
		Add(uint64)
		MayContain(uint64) bool
		Count() int
	}
	for _, tc := range []struct {
		name   string
		make   func() filter
		keys   int
		maxFPR float64
	}{
		{"filter at capacity", func() filter { return New(100_000) }, 100_000, 0.015},
		{"filter at half capacity", func() filter { return New(100_000) }, 50_000, 0.002},
		{"one-block filter", func() filter { return New(1) }, 10, 1},
		{"growing within its first filter", func() filter { return NewGrowing(100_000) }, 100_000, 0.015},
		// 1,000 -> 2,000 -> ... : seven filters for 100,000 keys.
		{"growing through seven filters", func() filter { return NewGrowing(1_000) }, 100_000, 0.03},
		{"growing through ten filters", func() filter { return NewGrowing(100) }, 100_000, 0.03},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.make()
			added := keyHashes(seed, "added/", tc.keys)
			for _, h := range added {
				f.Add(h)
			}
			if f.Count() != tc.keys {
				t.Fatalf("Count = %d, want %d", f.Count(), tc.keys)
			}
			for i, h := range added {
				if !f.MayContain(h) {
					t.Fatalf("added key %d: MayContain = false", i)
				}
			}
			absent := keyHashes(seed, "absent/", 100_000)
			passed := 0
			for _, h := range absent {
				if f.MayContain(h) {
					passed++
				}
			}
			if fpr := float64(passed) / float64(len(absent)); fpr > tc.maxFPR {
				t.Fatalf("false positive rate %.4f, want <= %.4f", fpr, tc.maxFPR)
			}
		})
	}
}

func TestGrowingSizes(t *testing.T) {
	g := NewGrowing(1000)
	for i := range uint64(7000) {
		g.Add(i * 0x9e3779b97f4a7c15)
	}
	// 1,000 + 2,000 + 4,000 = 7,000: three filters, the last full.
	if len(g.filters) != 3 || g.capacity != 4000 {
		t.Fatalf("filters %d, capacity %d; want 3, 4000", len(g.filters), g.capacity)
	}
	want := ((1000*10+511)/512 + (2000*12+511)/512 + (4000*14+511)/512) * 64
	if g.Bytes() != want {
		t.Fatalf("Bytes = %d, want %d", g.Bytes(), want)
	}
}
