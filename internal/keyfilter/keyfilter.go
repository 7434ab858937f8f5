// Package keyfilter holds the in-memory bloom filters strata keeps over
// sets of keys, to skip reads of keys a store cannot hold.
//
// A Filter is a blocked bloom filter over 64-bit key hashes: each key sets
// Probes bits within one 512-bit block (one cache line), chosen by the
// hash's high bits, so a lookup touches one line. At 10 bits a key, its
// capacity, about 1% of the hashes never added pass MayContain.
//
// A Growing filter has no capacity: it is a series of Filters, each twice
// the capacity of the one before and with two more bits a key (up to 20),
// and a hash is added to the newest. A lookup asks each, so the false
// positives of the full ones add up; the added bits make the sum converge,
// to under 3% however many filters there are (a scalable bloom filter).
//
// Neither is safe for concurrent use; callers hold their own locks.
// Hashes come from the caller (maphash with a seed of its own, say): the
// filters only need their bits to be uniform.
package keyfilter

// Probes is how many bits a key sets in its block.
const Probes = 7

// bitsPerKey is a Filter's size per key of capacity; a Growing filter's
// later filters take up to maxBitsPerKey.
const (
	bitsPerKey    = 10
	maxBitsPerKey = 20
)

// Filter is a blocked bloom filter sized for a number of keys.
type Filter struct {
	blocks [][8]uint64
	count  int // hashes added, repeats included
}

// New returns a filter for capacity keys (at least one block).
func New(capacity int) *Filter { return newWithBits(capacity, bitsPerKey) }

func newWithBits(capacity, bits int) *Filter {
	n := max((capacity*bits+511)/512, 1)
	return &Filter{blocks: make([][8]uint64, n)}
}

// Add records h.
func (f *Filter) Add(h uint64) {
	b := &f.blocks[(h>>32)%uint64(len(f.blocks))]
	h1, h2 := uint32(h), uint32(h>>17)|1
	for i := range uint32(Probes) {
		bit := (h1 + i*h2) & 511
		b[bit>>6] |= 1 << (bit & 63)
	}
	f.count++
}

// MayContain reports whether h may have been added: false means it never
// was.
func (f *Filter) MayContain(h uint64) bool {
	b := &f.blocks[(h>>32)%uint64(len(f.blocks))]
	h1, h2 := uint32(h), uint32(h>>17)|1
	for i := range uint32(Probes) {
		bit := (h1 + i*h2) & 511
		if b[bit>>6]&(1<<(bit&63)) == 0 {
			return false
		}
	}
	return true
}

// Count is the number of Add calls, repeats included.
func (f *Filter) Count() int { return f.count }

// Bytes is the memory the filter's bits take.
func (f *Filter) Bytes() int { return len(f.blocks) * 64 }

// Growing is a filter that grows with what it is given (the package
// comment). Its zero value is not usable: call NewGrowing.
type Growing struct {
	filters  []*Filter // oldest first; hashes go to the last
	capacity int       // the last filter's capacity
	bits     int       // the last filter's bits a key
}

// NewGrowing returns an empty growing filter whose first filter takes
// capacity keys.
func NewGrowing(capacity int) *Growing {
	capacity = max(capacity, 1)
	return &Growing{filters: []*Filter{New(capacity)}, capacity: capacity, bits: bitsPerKey}
}

// Add records h, starting a filter of twice the capacity when the newest
// is full.
func (g *Growing) Add(h uint64) {
	last := g.filters[len(g.filters)-1]
	if last.count >= g.capacity {
		g.capacity *= 2
		g.bits = min(g.bits+2, maxBitsPerKey)
		last = newWithBits(g.capacity, g.bits)
		g.filters = append(g.filters, last)
	}
	last.Add(h)
}

// MayContain reports whether h may have been added: false means it never
// was.
func (g *Growing) MayContain(h uint64) bool {
	for i := len(g.filters) - 1; i >= 0; i-- {
		if g.filters[i].MayContain(h) {
			return true
		}
	}
	return false
}

// Count is the number of Add calls, repeats included.
func (g *Growing) Count() int {
	n := 0
	for _, f := range g.filters {
		n += f.count
	}
	return n
}

// Bytes is the memory the filters' bits take.
func (g *Growing) Bytes() int {
	n := 0
	for _, f := range g.filters {
		n += f.Bytes()
	}
	return n
}
