package load

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
)

// Distribution names how keys are chosen among those that exist.
type Distribution string

const (
	// Uniform picks every existing key with equal probability.
	Uniform Distribution = "uniform"
	// Zipfian picks keys by popularity rank with YCSB's constant 0.99, the
	// ranks scattered over the key space by a hash (YCSB's scrambled
	// zipfian) so hot keys are not adjacent.
	Zipfian Distribution = "zipfian"
	// Latest favours the most recently inserted keys (YCSB's skewed latest):
	// the newest key is the most popular.
	Latest Distribution = "latest"
)

// ParseDistribution checks a distribution name.
func ParseDistribution(s string) (Distribution, error) {
	switch d := Distribution(s); d {
	case Uniform, Zipfian, Latest:
		return d, nil
	}
	return "", fmt.Errorf("unknown key distribution %q (want uniform, zipfian or latest)", s)
}

// zipfConstant is YCSB's default skew.
const zipfConstant = 0.99

// zipfian draws ranks in [0, n) with P(rank i) proportional to 1/(i+1)^theta,
// using the method of Gray et al., "Quickly generating billion-record
// synthetic databases" (SIGMOD 1994), as YCSB does. n may grow (inserts);
// zeta(n) is then extended incrementally instead of recomputed.
//
// Concurrency: safe for concurrent use; one mutex guards the parameters. The
// critical section is a few float operations, small beside an RPC.
type zipfian struct {
	mu    sync.Mutex
	theta float64
	alpha float64 // 1/(1-theta)
	zeta2 float64 // zeta(2)
	n     int64   // mu: item count the parameters below are for
	zetan float64 // mu: zeta(n)
	eta   float64 // mu: derived from n, zetan
}

// newZipfian returns a generator over n >= 1 items.
func newZipfian(n int64) *zipfian {
	z := &zipfian{theta: zipfConstant, alpha: 1 / (1 - zipfConstant)}
	z.zeta2 = zetaRange(0, 2, z.theta)
	z.growLocked(max(n, 1))
	return z
}

// zetaRange returns sum over i in (from, to] of 1/i^theta.
func zetaRange(from, to int64, theta float64) float64 {
	var s float64
	for i := from + 1; i <= to; i++ {
		s += 1 / math.Pow(float64(i), theta)
	}
	return s
}

// growLocked extends the parameters to n items. REQUIRES: z.mu held (or z not
// yet shared).
func (z *zipfian) growLocked(n int64) {
	if n <= z.n {
		return
	}
	z.zetan += zetaRange(z.n, n, z.theta)
	z.n = n
	z.eta = (1 - math.Pow(2/float64(n), 1-z.theta)) / (1 - z.zeta2/z.zetan)
}

// next returns a rank in [0, n) for n items; n may exceed the count seen
// before.
func (z *zipfian) next(rng *rand.Rand, n int64) int64 {
	u := rng.Float64()
	z.mu.Lock()
	z.growLocked(n)
	zetan, eta, cnt := z.zetan, z.eta, z.n
	z.mu.Unlock()
	uz := u * zetan
	if uz < 1 {
		return 0
	}
	if uz < 1+math.Pow(0.5, z.theta) {
		return 1
	}
	r := int64(float64(cnt) * math.Pow(eta*u-eta+1, z.alpha))
	return min(r, n-1)
}

// chooser picks an existing key index given the current key count.
type chooser interface {
	// choose returns an index in [0, count).
	choose(rng *rand.Rand, count int64) int64
}

type uniformChooser struct{}

func (uniformChooser) choose(rng *rand.Rand, count int64) int64 { return rng.Int64N(count) }

// zipfChooser is YCSB's scrambled zipfian: ranks are hashed over the key
// space so the popular keys are spread out.
type zipfChooser struct{ z *zipfian }

func (c zipfChooser) choose(rng *rand.Rand, count int64) int64 {
	return int64(fnv64(uint64(c.z.next(rng, count))) % uint64(count))
}

// latestChooser is YCSB's skewed latest: the newest key has rank 0.
type latestChooser struct{ z *zipfian }

func (c latestChooser) choose(rng *rand.Rand, count int64) int64 {
	return count - 1 - c.z.next(rng, count)
}

// newChooser returns the chooser for d over an initial count of keys.
func newChooser(d Distribution, count int64) chooser {
	switch d {
	case Zipfian:
		return zipfChooser{newZipfian(count)}
	case Latest:
		return latestChooser{newZipfian(count)}
	default:
		return uniformChooser{}
	}
}

// fnv64 is FNV-1a over the 8 little-endian bytes of v: YCSB's key hash.
func fnv64(v uint64) uint64 {
	const (
		offset = 0xcbf29ce484222325
		prime  = 0x100000001b3
	)
	h := uint64(offset)
	for i := 0; i < 8; i++ {
		h ^= v & 0xff
		h *= prime
		v >>= 8
	}
	return h
}
