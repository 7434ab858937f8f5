package raftlog

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

const fuzzSalt = 0x5eed5eed5eed5eed

// payloadOf returns the payload of the single frame in frame.
func payloadOf(frame []byte) []byte {
	n := binary.LittleEndian.Uint32(frame[8:12])
	return frame[frameHeaderSize : frameHeaderSize+int(n)]
}

// FuzzDecodeBatchPayload feeds arbitrary bytes to the batch decoder: it
// must not panic, must allocate in proportion to its input, and whatever it
// accepts must encode back to the same bytes.
func FuzzDecodeBatchPayload(f *testing.F) {
	f.Add(payloadOf(appendBatchFrame(nil, fuzzSalt, ents(1, 3, 2), true, hardState{2, 1, 1})))
	f.Add(payloadOf(appendBatchFrame(nil, fuzzSalt, nil, true, hardState{7, 0, 0})))
	f.Add(payloadOf(appendBatchFrame(nil, fuzzSalt, ents(9, 9, 1), false, hardState{})))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := decodeBatchPayload(p)
		if err != nil {
			return
		}
		if cap(b.entries) > len(p)/entryFixedSize {
			t.Fatalf("%d entries allocated for a %d-byte payload", cap(b.entries), len(p))
		}
		again := payloadOf(appendBatchFrame(nil, fuzzSalt, b.entries, b.hasHS, b.hs))
		if !bytes.Equal(again, p) {
			t.Fatalf("re-encoding differs:\n got %x\nwant %x", again, p)
		}
	})
}

// FuzzDecodeStatePayload: no panic, and an accepted state re-encodes to a
// state that decodes equal.
func FuzzDecodeStatePayload(f *testing.F) {
	frame, _ := appendStateFrame(nil, fuzzSalt, logState{snapIndex: 5, snapTerm: 2, hs: hardState{3, 1, 5},
		cs: &raftpb.ConfState{Voters: []uint64{1, 2, 3}}})
	f.Add(payloadOf(frame))
	f.Fuzz(func(t *testing.T, p []byte) {
		st, err := decodeStatePayload(p)
		if err != nil {
			return
		}
		frame, err := appendStateFrame(nil, fuzzSalt, st)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		st2, err := decodeStatePayload(payloadOf(frame))
		if err != nil || st2.reset != st.reset || st2.snapIndex != st.snapIndex || st2.snapTerm != st.snapTerm ||
			st2.hs != st.hs || !proto.Equal(st2.cs, st.cs) {
			t.Fatalf("round trip: %+v, %v; want %+v", st2, err, st)
		}
	})
}

// FuzzBatchRoundTrip encodes entries built from the input and decodes them.
func FuzzBatchRoundTrip(f *testing.F) {
	f.Add(uint64(1), uint64(1), []byte("a\x00bc\x00"), true)
	f.Fuzz(func(t *testing.T, first, term uint64, data []byte, withHS bool) {
		if first == 0 || first > 1<<62 {
			return
		}
		var es []*raftpb.Entry
		for i, d := range bytes.Split(data, []byte{0}) {
			es = append(es, &raftpb.Entry{Index: proto.Uint64(first + uint64(i)), Term: proto.Uint64(term),
				Type: raftpb.EntryType(i % 3).Enum(), Data: d})
		}
		frame := appendBatchFrame(nil, fuzzSalt, es, withHS, hardState{term, first, term ^ first})
		if err := verifyFrame(fuzzSalt, frame); err != nil {
			t.Fatal(err)
		}
		if len(frame)%frameAlign != 0 {
			t.Fatalf("frame of %d bytes is not aligned", len(frame))
		}
		b, err := decodeBatchPayload(payloadOf(frame))
		if err != nil {
			t.Fatal(err)
		}
		if err := sameEntries(b.entries, es); err != nil {
			t.Fatal(err)
		}
		if b.hasHS != withHS || (withHS && b.hs != (hardState{term, first, term ^ first})) {
			t.Fatalf("hard state %v %+v", b.hasHS, b.hs)
		}
	})
}

// FuzzScanSegment appends arbitrary bytes to a valid segment prefix and
// scans it as a last segment: no panic, and the valid prefix is always
// found (the bytes after it may only add frames or be a torn tail).
func FuzzScanSegment(f *testing.F) {
	prefix := make([]byte, segmentHeaderSize)
	segmentHeader{seq: 1, firstIndex: 1, salt: fuzzSalt}.encode(prefix)
	prefix, _ = appendStateFrame(prefix, fuzzSalt, logState{cs: &raftpb.ConfState{}})
	prefix = appendBatchFrame(prefix, fuzzSalt, ents(1, 2, 1), true, hardState{1, 1, 0})
	f.Add(appendBatchFrame(nil, fuzzSalt, ents(3, 3, 1), false, hardState{}))
	f.Add([]byte{1, 2, 3, 4, 2, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0})
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, tail []byte) {
		fs := vfs.NewMem()
		name := segmentName(1, 1)
		file, _ := fs.Create(name, vfs.WriteCategoryUnspecified)
		_, _ = file.Write(append(append([]byte(nil), prefix...), tail...))
		_ = file.Close()
		file, _ = fs.Open(name)
		defer file.Close()
		res, err := scanSegment(file, name, true, func(int64, byte, []byte) error { return nil })
		if err == nil && (res.frames < 2 || res.end < int64(len(prefix))) {
			t.Fatalf("valid prefix of %d bytes not found: %+v", len(prefix), res)
		}
	})
}
