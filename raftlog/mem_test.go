package raftlog

import (
	"math/rand/v2"
	"testing"
)

// TestPosList checks the chunked position list against a plain slice
// through random pushes, truncations and front drops across chunk edges.
func TestPosList(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var p posList
	var want []entryPos
	next := uint64(0)
	for i := 0; i < 3000; i++ {
		switch r := rng.IntN(10); {
		case r < 6:
			for n := rng.IntN(3 * posChunk / 2); n > 0; n-- {
				next++
				p.push(entryPos{term: next})
				want = append(want, entryPos{term: next})
			}
		case r < 8 && len(want) > 0:
			k := rng.IntN(len(want) + 1)
			p.truncate(k)
			want = want[:k]
		case len(want) > 0:
			k := rng.IntN(len(want) + 1)
			p.dropFront(k)
			want = want[k:]
		}
		if p.len() != len(want) {
			t.Fatalf("step %d: len %d, want %d", i, p.len(), len(want))
		}
		for _, k := range []int{0, len(want) / 2, len(want) - 1} {
			if k >= 0 && k < len(want) && p.at(k) != want[k] {
				t.Fatalf("step %d: at(%d) = %v, want %v", i, k, p.at(k), want[k])
			}
		}
	}
}
