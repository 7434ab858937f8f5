package watch

import "bytes"

// group indexes watchers by the keys they watch: single-key watchers in a
// map, range watchers in a list scanned per event. etcd uses an interval
// tree for ranges; a list keeps this simple and is fast enough for
// thousands of range watchers per event.
//
// Concurrency: not safe for concurrent use; the hub's groups are guarded
// by Hub.mu, and a pass-local group belongs to the hub goroutine.
type group struct {
	keys   map[string][]*watcher
	ranges []*watcher
	n      int
	prev   int // watchers that want prev_kv
}

func newGroup() *group { return &group{keys: map[string][]*watcher{}} }

func (g *group) add(w *watcher) {
	if w.end == nil {
		l := g.keys[string(w.key)]
		w.pos = len(l)
		g.keys[string(w.key)] = append(l, w)
	} else {
		w.pos = len(g.ranges)
		g.ranges = append(g.ranges, w)
	}
	g.n++
	if w.prevKV {
		g.prev++
	}
}

// remove takes w out of the group in O(1) (swap with the last).
func (g *group) remove(w *watcher) {
	if w.end == nil {
		l := g.keys[string(w.key)]
		last := l[len(l)-1]
		l[w.pos], last.pos = last, w.pos
		l = l[:len(l)-1]
		if len(l) == 0 {
			delete(g.keys, string(w.key))
		} else {
			g.keys[string(w.key)] = l
		}
	} else {
		last := g.ranges[len(g.ranges)-1]
		g.ranges[w.pos], last.pos = last, w.pos
		g.ranges[len(g.ranges)-1] = nil
		g.ranges = g.ranges[:len(g.ranges)-1]
	}
	g.n--
	if w.prevKV {
		g.prev--
	}
}

// each calls fn for every watcher whose range holds key.
func (g *group) each(key []byte, fn func(w *watcher)) {
	for _, w := range g.keys[string(key)] {
		fn(w)
	}
	for _, w := range g.ranges {
		if w.contains(key) {
			fn(w)
		}
	}
}

// contains reports whether key is in w's range: [key, end), end empty
// meaning every key from key on, nil meaning key alone.
func (w *watcher) contains(key []byte) bool {
	if w.end == nil {
		return bytes.Equal(key, w.key)
	}
	if bytes.Compare(key, w.key) < 0 {
		return false
	}
	return len(w.end) == 0 || bytes.Compare(key, w.end) < 0
}
