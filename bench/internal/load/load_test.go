package load

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

func TestZipfianRanks(t *testing.T) {
	const n, draws = 1000, 200000
	z := newZipfian(n)
	rng := rand.New(rand.NewPCG(1, 2))
	counts := make([]int, n)
	for i := 0; i < draws; i++ {
		r := z.next(rng, n)
		if r < 0 || r >= n {
			t.Fatalf("rank %d outside [0, %d)", r, n)
		}
		counts[r]++
	}
	// P(rank 0) = 1/zeta(n); with theta 0.99 and n = 1000 that is about 0.134.
	want := 1 / zetaRange(0, n, zipfConstant)
	got := float64(counts[0]) / draws
	if math.Abs(got-want) > 0.01 {
		t.Errorf("P(rank 0) = %.4f, want %.4f ± 0.01", got, want)
	}
	// Popularity falls with rank: the first ranks beat the last ones by far.
	head := counts[0] + counts[1] + counts[2]
	tail := counts[n-1] + counts[n-2] + counts[n-3]
	if head < 50*tail {
		t.Errorf("head %d vs tail %d: not skewed", head, tail)
	}
}

func TestZipfianGrowsLikeFresh(t *testing.T) {
	grown := newZipfian(100)
	grown.growLocked(5000)
	fresh := newZipfian(5000)
	if math.Abs(grown.zetan-fresh.zetan) > 1e-9 || math.Abs(grown.eta-fresh.eta) > 1e-12 {
		t.Errorf("grown zeta %v eta %v, fresh zeta %v eta %v", grown.zetan, grown.eta, fresh.zetan, fresh.eta)
	}
}

func TestChoosersStayInRange(t *testing.T) {
	tests := []struct {
		dist  Distribution
		count int64
	}{
		{Uniform, 1}, {Uniform, 10}, {Zipfian, 1}, {Zipfian, 37}, {Latest, 1}, {Latest, 1000},
	}
	for _, tt := range tests {
		t.Run(string(tt.dist), func(t *testing.T) {
			c := newChooser(tt.dist, tt.count)
			rng := rand.New(rand.NewPCG(3, 4))
			for i := 0; i < 10000; i++ {
				// The key space grows as inserts would grow it.
				count := tt.count + int64(i/1000)
				if k := c.choose(rng, count); k < 0 || k >= count {
					t.Fatalf("choose(%d) = %d", count, k)
				}
			}
		})
	}
}

func TestLatestFavoursNewest(t *testing.T) {
	c := newChooser(Latest, 1000)
	rng := rand.New(rand.NewPCG(5, 6))
	counts := map[int64]int{}
	for i := 0; i < 50000; i++ {
		counts[c.choose(rng, 1000)]++
	}
	type kv struct {
		k int64
		n int
	}
	var all []kv
	for k, n := range counts {
		all = append(all, kv{k, n})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n })
	if all[0].k != 999 {
		t.Errorf("most chosen key %d, want the newest (999)", all[0].k)
	}
}

func TestYCSBWorkloads(t *testing.T) {
	tests := []struct {
		letter         string
		dist           Distribution
		read, upd, ins float64
		wantDist       Distribution
		wantName       string
		wantErr        bool
	}{
		{letter: "A", read: 0.5, upd: 0.5, wantDist: Zipfian, wantName: "ycsb-A-zipfian"},
		{letter: "b", read: 0.95, upd: 0.05, wantDist: Zipfian, wantName: "ycsb-B-zipfian"},
		{letter: "C", read: 1, wantDist: Zipfian, wantName: "ycsb-C-zipfian"},
		{letter: "D", read: 0.95, ins: 0.05, wantDist: Latest, wantName: "ycsb-D-latest"},
		{letter: "AW", upd: 1, wantDist: Uniform, wantName: "ycsb-AW-uniform"},
		{letter: "AWL", upd: 1, wantDist: Latest, wantName: "ycsb-AWL-latest"},
		{letter: "A", dist: Uniform, read: 0.5, upd: 0.5, wantDist: Uniform, wantName: "ycsb-A-uniform"},
		{letter: "F", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.letter+string(tt.dist), func(t *testing.T) {
			w, err := YCSBWorkload(tt.letter, tt.dist, 100, 100)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if w.ReadProportion != tt.read || w.UpdateProportion != tt.upd || w.InsertProportion != tt.ins || w.Dist != tt.wantDist || w.Name() != tt.wantName {
				t.Errorf("got %+v name %s", w, w.Name())
			}
			// The generated mix follows the proportions.
			g := w.NewGenerator(100)
			rng := rand.New(rand.NewPCG(7, 8))
			var n [3]int
			const draws = 20000
			for i := 0; i < draws; i++ {
				op := g.Next(rng)
				n[op.Kind]++
				if op.Kind != OpRead && len(op.Value) != 100 {
					t.Fatalf("value of %d bytes, want 100", len(op.Value))
				}
			}
			for k, p := range []float64{tt.read, tt.upd, tt.ins} {
				if got := float64(n[k]) / draws; math.Abs(got-p) > 0.02 {
					t.Errorf("kind %d: share %.3f, want %.3f", k, got, p)
				}
			}
		})
	}
}

func TestYCSBInsertsExtendKeySpace(t *testing.T) {
	w := YCSB{Letter: "I", InsertProportion: 1, Dist: Uniform, ValueSize: 1}
	g := w.NewGenerator(10)
	rng := rand.New(rand.NewPCG(9, 9))
	for i := int64(10); i < 15; i++ {
		op := g.Next(rng)
		if op.Kind != OpInsert || op.Key != YCSBKey(i) {
			t.Fatalf("insert %d: got %v %q, want insert of %q", i, op.Kind, op.Key, YCSBKey(i))
		}
	}
}

func TestPutKeys(t *testing.T) {
	g := PutWorkload{KeySize: 8, ValueSize: 256, KeySpace: 3}.NewGenerator(0)
	var keys []string
	for i := 0; i < 5; i++ {
		op := g.Next(nil)
		if len(op.Key) != 8 || len(op.Value) != 256 {
			t.Fatalf("key %d bytes, value %d bytes; want 8 and 256", len(op.Key), len(op.Value))
		}
		keys = append(keys, op.Key)
	}
	// Sequential over a key space of 3: 0 1 2 0 1, in sorted byte order.
	if keys[0] != keys[3] || keys[1] != keys[4] || !(keys[0] < keys[1] && keys[1] < keys[2]) {
		t.Errorf("keys %q: want 0,1,2,0,1 in order", keys)
	}
	tests := []struct {
		size int
		i    uint64
		want string
	}{
		{size: 8, i: 1, want: "\x00\x00\x00\x00\x00\x00\x00\x01"},
		{size: 10, i: 258, want: "\x00\x00\x00\x00\x00\x00\x00\x00\x01\x02"},
		{size: 2, i: 258, want: "\x01\x02"},
		{size: 0, i: 7, want: "\x07"},
	}
	for _, tt := range tests {
		if got := binaryKey(tt.i, tt.size); got != tt.want {
			t.Errorf("binaryKey(%d, %d) = %q, want %q", tt.i, tt.size, got, tt.want)
		}
	}
}

func TestParseDistribution(t *testing.T) {
	for _, s := range []string{"uniform", "zipfian", "latest"} {
		if d, err := ParseDistribution(s); err != nil || string(d) != s {
			t.Errorf("ParseDistribution(%q) = %q, %v", s, d, err)
		}
	}
	if _, err := ParseDistribution("hotspot"); err == nil {
		t.Error("ParseDistribution(hotspot) succeeded")
	}
}
