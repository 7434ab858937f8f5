package mvcc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Engine key spaces (a wire format: see doc.go before changing any byte).
const (
	prefixCurrent = "mc" // mc<key>                       -> current record (live keys only): encodeCurrent
	prefixHistory = "mh" // mh<esc(key)>\x00\x01<^main><^sub> -> KeyValue (tombstone: mod_revision 0)
	prefixRev     = "mr" // mr<main><sub>                  -> flag byte + key
	prefixLease   = "ml" // ml<lease><key>                 -> empty
	prefixMeta    = "mm" // mm<name>                       -> store's own state
	prefixUser    = "mu" // mu<name>                       -> SetMeta values
)

var (
	metaState   = []byte(prefixMeta + "state")   // rev(8) compactRev(8)
	metaCompact = []byte(prefixMeta + "compact") // target(8) doneMain(8) doneSub(8)
	metaLayout  = []byte(prefixMeta + "layout")  // layout(8): the newest layout written
)

// Store layouts, recorded in mm"layout" by the first commit of a release
// that writes them. A store that records a layout above layoutCurrent was
// written by a newer release and is refused at Open. Releases before
// layoutMoved record nothing and write copied records only, which this
// release reads; they cannot read moved records.
const (
	layoutMoved   = 2 // moved current records (doc.go, "Where each version lives")
	layoutCurrent = layoutMoved
)

// Flag bytes of a revision-index value.
const (
	revPut       = 0
	revTombstone = 1
)

// errCorrupt marks a stored value that does not decode.
var errCorrupt = errors.New("mvcc: corrupt stored value")

// prefixEnd returns the smallest key greater than every key with prefix p
// (p's last byte is never 0xff here).
func prefixEnd(p string) []byte {
	b := []byte(p)
	b[len(b)-1]++
	return b
}

func currentKey(key []byte) []byte {
	return appendCurrentKey(make([]byte, 0, len(prefixCurrent)+len(key)), key)
}

func appendCurrentKey(b, key []byte) []byte {
	return append(append(b, prefixCurrent...), key...)
}

// currentMoved starts a current record whose version is not in history
// (doc.go, "Where each version lives"). A marshalled KeyValue never starts
// with it: protobuf has no field 0, and a live key's KeyValue starts with
// its non-empty key (tag 0x0a).
const currentMoved = 0x00

// current is a key's current version as its mc record holds it.
type current struct {
	kv *mvccpb.KeyValue
	// enc is kv's encoding, the bytes its history entry holds.
	enc []byte
	// sub is the sub-revision of kv's mod revision (moved records only).
	sub int64
	// moved: the version is in mc only and moves to mh (at kv.ModRevision,
	// sub) when it stops being current. A copied record's version is in
	// mh as well.
	moved bool
}

// appendMoved appends the mc record of kv, a version written by a Put at
// sub-revision sub: currentMoved, sub as a uvarint, the KeyValue.
func appendMoved(b []byte, sub int64, kv *mvccpb.KeyValue) []byte {
	b = append(b, currentMoved)
	b = binary.AppendUvarint(b, uint64(sub))
	return appendKV(b, kv)
}

// decodeCurrent decodes an mc record, moved or copied. enc aliases b.
func decodeCurrent(b []byte) (*current, error) {
	c := &current{enc: b}
	if len(b) > 0 && b[0] == currentMoved {
		sub, n := binary.Uvarint(b[1:])
		if n <= 0 || sub > math.MaxInt64 {
			return nil, fmt.Errorf("%w: current record: bad sub-revision", errCorrupt)
		}
		c.sub, c.moved, c.enc = int64(sub), true, b[1+n:]
	}
	kv, err := decodeKV(c.enc)
	if err != nil {
		return nil, err
	}
	c.kv = kv
	return c, nil
}

// escape appends key to dst so that byte order of escaped keys matches the
// order of the raw keys and no escaped key is a prefix of another:
// 0x00 becomes 0x00 0xff, and the key ends with 0x00 0x01.
func escape(dst, key []byte) []byte {
	for _, c := range key {
		if c == 0 {
			dst = append(dst, 0, 0xff)
		} else {
			dst = append(dst, c)
		}
	}
	return append(dst, 0, 1)
}

// unescape decodes an escaped key at the start of b and returns the key and
// the rest of b.
func unescape(b []byte) (key, rest []byte, err error) {
	key = make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != 0 {
			key = append(key, b[i])
			continue
		}
		if i+1 >= len(b) {
			return nil, nil, fmt.Errorf("%w: truncated key escape", errCorrupt)
		}
		switch b[i+1] {
		case 0xff:
			key = append(key, 0)
			i++
		case 1:
			return key, b[i+2:], nil
		default:
			return nil, nil, fmt.Errorf("%w: bad key escape 0x%02x", errCorrupt, b[i+1])
		}
	}
	return nil, nil, fmt.Errorf("%w: unterminated key", errCorrupt)
}

// engineKeyLen returns the length of the longest engine key a Put of key
// writes: its history entry (the key escaped, each 0x00 taking two bytes,
// then a terminator and a revision), its current entry, or its lease entry.
func engineKeyLen(key []byte) int {
	history := len(prefixHistory) + len(key) + bytes.Count(key, []byte{0}) + 2 + 16
	return max(history, len(prefixCurrent)+len(key), len(prefixLease)+8+len(key))
}

// historyPrefix is the prefix of every history entry of key.
func historyPrefix(key []byte) []byte {
	return escape([]byte(prefixHistory), key)
}

// historyKey is the history entry of key at (main, sub). Revisions are
// stored inverted so that the newest version of a key sorts first and
// SeekGE(historyKey(key, r, maxSub)) lands on the newest version <= r.
func historyKey(key []byte, main, sub int64) []byte {
	b := historyPrefix(key)
	b = binary.BigEndian.AppendUint64(b, ^uint64(main))
	return binary.BigEndian.AppendUint64(b, ^uint64(sub))
}

// historySeek is where the newest version of key at or below main starts.
func historySeek(key []byte, main int64) []byte {
	b := historyPrefix(key)
	b = binary.BigEndian.AppendUint64(b, ^uint64(main))
	return binary.BigEndian.AppendUint64(b, 0)
}

// historyKeyEnd is just past every history entry of key.
func historyKeyEnd(key []byte) []byte {
	b := escape([]byte(prefixHistory), key)
	b[len(b)-1] = 2
	return b
}

// parseHistoryKey splits a history entry's engine key.
func parseHistoryKey(k []byte) (key []byte, main, sub int64, err error) {
	if len(k) < len(prefixHistory) {
		return nil, 0, 0, fmt.Errorf("%w: short history key", errCorrupt)
	}
	key, rest, err := unescape(k[len(prefixHistory):])
	if err != nil {
		return nil, 0, 0, err
	}
	if len(rest) != 16 {
		return nil, 0, 0, fmt.Errorf("%w: history key revision has %d bytes", errCorrupt, len(rest))
	}
	main = int64(^binary.BigEndian.Uint64(rest))
	sub = int64(^binary.BigEndian.Uint64(rest[8:]))
	return key, main, sub, nil
}

func revKey(main, sub int64) []byte {
	return appendRevKey(make([]byte, 0, len(prefixRev)+16), main, sub)
}

func appendRevKey(b []byte, main, sub int64) []byte {
	b = append(b, prefixRev...)
	b = binary.BigEndian.AppendUint64(b, uint64(main))
	return binary.BigEndian.AppendUint64(b, uint64(sub))
}

func parseRevKey(k []byte) (main, sub int64, err error) {
	if len(k) != len(prefixRev)+16 {
		return 0, 0, fmt.Errorf("%w: revision key has %d bytes", errCorrupt, len(k))
	}
	k = k[len(prefixRev):]
	return int64(binary.BigEndian.Uint64(k)), int64(binary.BigEndian.Uint64(k[8:])), nil
}

func revValue(tombstone bool, key []byte) []byte {
	return appendRevValue(make([]byte, 0, 1+len(key)), tombstone, key)
}

func appendRevValue(b []byte, tombstone bool, key []byte) []byte {
	flag := byte(revPut)
	if tombstone {
		flag = revTombstone
	}
	return append(append(b, flag), key...)
}

func parseRevValue(v []byte) (tombstone bool, key []byte, err error) {
	if len(v) < 1 || v[0] > revTombstone {
		return false, nil, fmt.Errorf("%w: revision index value", errCorrupt)
	}
	return v[0] == revTombstone, v[1:], nil
}

func leaseKey(lease int64, key []byte) []byte {
	b := binary.BigEndian.AppendUint64([]byte(prefixLease), uint64(lease))
	return append(b, key...)
}

func leasePrefix(lease int64) []byte {
	return binary.BigEndian.AppendUint64([]byte(prefixLease), uint64(lease))
}

// state is the store's persistent revision state.
type state struct {
	rev        int64 // current revision
	compactRev int64 // -1 before any revision compaction
}

func (s state) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(s.rev))
	return binary.BigEndian.AppendUint64(b, uint64(s.compactRev))
}

func decodeState(b []byte) (state, error) {
	if len(b) != 16 {
		return state{}, fmt.Errorf("%w: state has %d bytes", errCorrupt, len(b))
	}
	return state{rev: int64(binary.BigEndian.Uint64(b)), compactRev: int64(binary.BigEndian.Uint64(b[8:]))}, nil
}

// compactJob is the persistent progress of physical revision compaction:
// every revision-index entry at or below (doneMain, doneSub) has been
// visited for target.
type compactJob struct {
	target   int64
	doneMain int64
	doneSub  int64
}

func (j compactJob) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(j.target))
	b = binary.BigEndian.AppendUint64(b, uint64(j.doneMain))
	return binary.BigEndian.AppendUint64(b, uint64(j.doneSub))
}

func decodeCompactJob(b []byte) (compactJob, error) {
	if len(b) != 24 {
		return compactJob{}, fmt.Errorf("%w: compaction job has %d bytes", errCorrupt, len(b))
	}
	return compactJob{
		target:   int64(binary.BigEndian.Uint64(b)),
		doneMain: int64(binary.BigEndian.Uint64(b[8:])),
		doneSub:  int64(binary.BigEndian.Uint64(b[16:])),
	}, nil
}

// pending reports whether the job has work left: its progress is below
// the target, or inside the target revision's entries (a chunk can end
// among the keys one revision wrote; only a scan that ran out marks the
// target done, with doneSub MaxInt64). A zero job (no compaction yet) has
// none.
func (j compactJob) pending() bool {
	return j.doneMain < j.target || (j.target > 0 && j.doneMain == j.target && j.doneSub != math.MaxInt64)
}
