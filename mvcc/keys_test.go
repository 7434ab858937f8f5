package mvcc

import (
	"bytes"
	"testing"
)

// FuzzHistoryKey: escaped keys round-trip, and history entries of different
// keys sort as the raw keys do, whatever their revisions.
func FuzzHistoryKey(f *testing.F) {
	f.Add([]byte("a"), []byte("a\x00"), int64(2), int64(9))
	f.Add([]byte("\x00\xff"), []byte("\x00"), int64(5), int64(1))
	f.Add([]byte(""), []byte("\x01"), int64(1), int64(1))
	f.Fuzz(func(t *testing.T, a, b []byte, ra, rb int64) {
		ka := historyKey(a, ra, 3)
		key, main, sub, err := parseHistoryKey(ka)
		if err != nil || !bytes.Equal(key, a) || main != ra || sub != 3 {
			t.Fatalf("round trip of %q@%d: %q %d %d %v", a, ra, key, main, sub, err)
		}
		if c := bytes.Compare(a, b); c != 0 {
			if got := bytes.Compare(ka, historyKey(b, rb, 0)); got != c {
				t.Fatalf("order of %q and %q: history keys compare %d, raw %d", a, b, got, c)
			}
			// Every entry of a lies inside a's bounds, none of b's does.
			if bytes.Compare(ka, historyPrefix(a)) < 0 || bytes.Compare(ka, historyKeyEnd(a)) >= 0 {
				t.Fatalf("history key of %q outside its bounds", a)
			}
			kb := historyKey(b, rb, 0)
			if bytes.Compare(kb, historyPrefix(a)) >= 0 && bytes.Compare(kb, historyKeyEnd(a)) < 0 {
				t.Fatalf("history key of %q inside the bounds of %q", b, a)
			}
		}
		if ra >= 0 && rb >= ra && bytes.Compare(historySeek(a, rb), ka) > 0 {
			t.Fatalf("seek to %d passes the version at %d", rb, ra)
		}
	})
}

// FuzzDecode: no decoder of stored bytes panics on arbitrary input.
func FuzzDecode(f *testing.F) {
	f.Add([]byte("mhab\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01"))
	f.Add(state{rev: 5, compactRev: -1}.encode())
	f.Add(compactJob{target: 4, doneMain: 2, doneSub: 1}.encode())
	f.Add([]byte{1, 'k'})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _, _ = parseHistoryKey(b)
		_, _, _ = unescape(b)
		_, _, _ = parseRevKey(b)
		_, _, _ = parseRevValue(b)
		if st, err := decodeState(b); err == nil && !bytes.Equal(st.encode(), b) {
			t.Fatalf("state does not round-trip")
		}
		if j, err := decodeCompactJob(b); err == nil && !bytes.Equal(j.encode(), b) {
			t.Fatalf("compaction job does not round-trip")
		}
		_, _ = decodeKV(b)
	})
}
