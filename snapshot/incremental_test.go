package snapshot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"reflect"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/raftlog"
)

const testLimit = 1 << 20

// testBatch is the encoded compacted batch for first..last (term term): a
// put per index and, at first, a kept lease grant entry of type typ.
func testBatch(t testing.TB, first, last, term uint64, typ raftpb.EntryType) []byte {
	t.Helper()
	b := &logcompact.Batch{FirstIndex: first, LastIndex: last, LastTerm: term, Revision: int64(last) + 1}
	b.Records = append(b.Records, logcompact.Record{Kind: logcompact.RecordEntry, Index: first,
		Entry: &raftpb.Entry{Index: proto.Uint64(first), Term: proto.Uint64(term), Type: typ.Enum(), Data: []byte("kept")}})
	for i := first; i <= last; i++ {
		b.Records = append(b.Records, logcompact.Record{Kind: logcompact.RecordPut, Index: i, Main: int64(i) + 1,
			Key: []byte{'k', byte(i)}, Value: []byte("v"), CreateRevision: 2, Version: int64(i)})
	}
	return encodeBatch(t, b)
}

// encodeBatch is the batch file of b, as the raft log stores it.
func encodeBatch(t testing.TB, b *logcompact.Batch) []byte {
	t.Helper()
	file, err := logcompact.EncodeBatch(b)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := raftlog.EncodeCompactedBatch(file)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func testEntries(lo, hi, term uint64) []*raftpb.Entry {
	var out []*raftpb.Entry
	for i := lo; i <= hi; i++ {
		out = append(out, &raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(term), Type: raftpb.EntryNormal.Enum(),
			Data: []byte{byte(i)}})
	}
	return out
}

func encodeIncremental(t testing.TB, h IncrementalHeader, batches [][]byte, entries []*raftpb.Entry) []byte {
	t.Helper()
	var src []BatchSource
	for _, b := range batches {
		src = append(src, BatchSource{Size: int64(len(b)), R: bytes.NewReader(b)})
	}
	var buf bytes.Buffer
	n, err := WriteIncremental(&buf, h, src, entries)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteIncremental says %d bytes, wrote %d", n, buf.Len())
	}
	return buf.Bytes()
}

// reseal recomputes the header and trailer checksums of a stream that a
// test has altered, so that the decoder's other checks are reached.
func reseal(p []byte) []byte {
	p = bytes.Clone(p)
	binary.LittleEndian.PutUint32(p[60:64], crc32.Checksum(p[0:60], castagnoli))
	end := len(p) - incTrailerSize
	binary.LittleEndian.PutUint64(p[end:], uint64(end))
	binary.LittleEndian.PutUint32(p[end+8:], crc32.Checksum(p[:end], castagnoli))
	return p
}

// validStream: batches 11..20 and 21..30, entries 31..33, base 12 (inside
// the first batch), snapshot at 33.
func validStream(t testing.TB) (IncrementalHeader, [][]byte, []*raftpb.Entry) {
	h := IncrementalHeader{Index: 33, Term: 3, Base: 12, BaseTerm: 0, End: 33}
	return h, [][]byte{testBatch(t, 11, 20, 2, raftpb.EntryNormal), testBatch(t, 21, 30, 3, raftpb.EntryNormal)}, testEntries(31, 33, 3)
}

func TestIncrementalRoundTrip(t *testing.T) {
	h, batches, entries := validStream(t)
	for _, tc := range []struct {
		name    string
		h       IncrementalHeader
		batches [][]byte
		entries []*raftpb.Entry
	}{
		{name: "batches and entries", h: h, batches: batches, entries: entries},
		{name: "batches only, end at the last batch", h: IncrementalHeader{Index: 30, Term: 3, Base: 20, BaseTerm: 2, End: 30},
			batches: batches[1:]},
		{name: "end above the snapshot index", h: IncrementalHeader{Index: 25, Term: 3, Base: 10, End: 30}, batches: batches},
		{name: "entries only", h: IncrementalHeader{Index: 33, Term: 3, Base: 30, BaseTerm: 3, End: 33}, entries: entries},
		{name: "empty entry data", h: IncrementalHeader{Index: 31, Term: 3, Base: 30, End: 31},
			entries: []*raftpb.Entry{{Index: proto.Uint64(31), Term: proto.Uint64(3), Type: raftpb.EntryConfChangeV2.Enum()}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := encodeIncremental(t, tc.h, tc.batches, tc.entries)
			if Kind(data) != KindIncremental {
				t.Fatalf("Kind = %q", Kind(data))
			}
			inc, err := ReadIncremental(bytes.NewReader(data), testLimit)
			if err != nil {
				t.Fatal(err)
			}
			if inc.IncrementalHeader != tc.h || inc.Bytes != int64(len(data)) || len(inc.Batches) != len(tc.batches) || len(inc.Entries) != len(tc.entries) {
				t.Fatalf("decoded %+v, %d bytes, %d batches, %d entries", inc.IncrementalHeader, inc.Bytes, len(inc.Batches), len(inc.Entries))
			}
			var batchBytes int64
			for i, raw := range tc.batches {
				batchBytes += int64(len(raw))
				file, _ := raftlog.DecodeCompactedBatch(raw)
				want, _ := logcompact.DecodeBatch(file)
				if got := inc.Batches[i]; got.FirstIndex != want.FirstIndex || got.LastIndex != want.LastIndex || len(got.Records) != len(want.Records) {
					t.Errorf("batch %d: %d..%d with %d records, want %d..%d with %d", i, got.FirstIndex, got.LastIndex, len(got.Records),
						want.FirstIndex, want.LastIndex, len(want.Records))
				}
			}
			if inc.BatchBytes != batchBytes {
				t.Errorf("BatchBytes %d, want %d", inc.BatchBytes, batchBytes)
			}
			for i, e := range tc.entries {
				if !proto.Equal(inc.Entries[i], e) {
					t.Errorf("entry %d: %v, want %v", i, inc.Entries[i], e)
				}
			}
		})
	}
}

func TestKind(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		want   string
	}{
		{"STRATASN\x01", KindFull},
		{"STRATAIS", KindIncremental},
		{"STRATAI", ""},
		{"STRATACB", ""},
		{"", ""},
	} {
		if got := Kind([]byte(tc.prefix)); got != tc.want {
			t.Errorf("Kind(%q) = %q, want %q", tc.prefix, got, tc.want)
		}
	}
}

// TestReadIncrementalRejects: every rule of FORMAT.md's list refuses a
// stream that breaks it, with ErrCorrupt.
func TestReadIncrementalRejects(t *testing.T) {
	h, batches, entries := validStream(t)
	good := encodeIncremental(t, h, batches, entries)
	entriesAt := len(good) - incTrailerSize - 3*(incEntryFixed+1) // the first entry's header
	with := func(f func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry)) []byte {
		h2, b2, e2 := h, append([][]byte(nil), batches...), append([]*raftpb.Entry(nil), entries...)
		f(&h2, &b2, &e2)
		return encodeIncremental(t, h2, b2, e2)
	}
	patch := func(off int, v uint64, size int) []byte {
		p := bytes.Clone(good)
		if size == 8 {
			binary.LittleEndian.PutUint64(p[off:], v)
		} else {
			binary.LittleEndian.PutUint32(p[off:], uint32(v))
		}
		return reseal(p)
	}
	for _, tc := range []struct {
		name   string
		stream []byte
		limit  int64
		tooBig bool
	}{
		{name: "bad magic", stream: reseal(append([]byte("STRATASN"), good[8:]...))},
		{name: "header checksum", stream: func() []byte { p := bytes.Clone(good); p[20]++; return p }()},
		{name: "unknown version", stream: patch(8, 2, 4)},
		{name: "reserved bytes", stream: patch(12, 1, 4)},
		{name: "base at the end", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) { h.Base = 33 })},
		{name: "snapshot beyond the end", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) { h.Index = 34 })},
		{name: "base beyond the snapshot", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) { h.Index = 11 })},
		{name: "first batch starts after base+1", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) { h.Base = 8 })},
		{name: "first batch ends at base", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) { h.Base = 20 })},
		{name: "gap between batches", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) {
			(*b)[1] = testBatch(t, 22, 30, 3, raftpb.EntryNormal)
		})},
		{name: "conf change kept in a batch", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) {
			(*b)[1] = testBatch(t, 21, 30, 3, raftpb.EntryConfChangeV2)
		})},
		{name: "batch beyond the end", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) {
			h.Index, h.End, *e = 28, 28, nil
		})},
		{name: "term at the snapshot index", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) { h.Term = 4 })},
		{name: "term of the batch at the snapshot index", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) {
			h.Index, h.Term, h.End, *e = 30, 2, 30, nil
		})},
		{name: "entries do not follow the batches", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) {
			*e = testEntries(32, 33, 3)
		})},
		{name: "entries end before the end", stream: patch(48, 34, 8)},
		{name: "batches end before the end", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) {
			h.Index, h.End, *e = 30, 31, nil
		})},
		{name: "entry index out of order", stream: patch(entriesAt, 40, 8)},
		{name: "entry of unknown type", stream: patch(entriesAt+16, 7, 4)},
		{name: "entry data beyond the stream", stream: patch(entriesAt+20, 1<<19, 4)},
		{name: "nothing", stream: with(func(h *IncrementalHeader, b *[][]byte, e *[]*raftpb.Entry) {
			h.Base, *b, *e = 32, nil, nil
		})},
		{name: "batch damaged", stream: func() []byte {
			p := bytes.Clone(good)
			p[incHeaderSize+8+100]++
			return reseal(p)
		}()},
		{name: "batch count too large", stream: patch(56, 1<<20, 4)},
		{name: "batch length too large", stream: patch(incHeaderSize, 1<<40, 8)},
		{name: "trailer checksum", stream: func() []byte { p := bytes.Clone(good); p[len(p)-6]++; return p }()},
		{name: "trailer count", stream: func() []byte { p := bytes.Clone(good); p[len(p)-16]++; return p }()},
		{name: "trailer magic", stream: func() []byte { p := bytes.Clone(good); p[len(p)-1]++; return p }()},
		{name: "truncated", stream: good[:len(good)-1]},
		{name: "bytes after the trailer", stream: append(bytes.Clone(good), 0)},
		{name: "above the limit", stream: good, limit: int64(len(good)) - 1, tooBig: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit := tc.limit
			if limit == 0 {
				limit = testLimit
			}
			_, err := ReadIncremental(bytes.NewReader(tc.stream), limit)
			t.Log(err)
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("ReadIncremental = %v, want ErrCorrupt", err)
			}
			if tc.tooBig != errors.Is(err, ErrTooLarge) {
				t.Fatalf("ReadIncremental = %v; ErrTooLarge expected: %v", err, tc.tooBig)
			}
		})
	}
	if _, err := ReadIncremental(bytes.NewReader(good), testLimit); err != nil {
		t.Fatalf("the unaltered stream: %v", err)
	}
}

// TestWriteIncrementalRefuses: the writer refuses entries that are not
// consecutive or do not end at the end index, and a batch source shorter
// than its size.
func TestWriteIncrementalRefuses(t *testing.T) {
	h, batches, entries := validStream(t)
	for _, tc := range []struct {
		name    string
		h       IncrementalHeader
		batches []BatchSource
		entries []*raftpb.Entry
	}{
		{name: "gap in entries", h: h, entries: []*raftpb.Entry{entries[0], entries[2]}},
		{name: "entries end early", h: h, entries: entries[:2]},
		{name: "short batch", h: h, batches: []BatchSource{{Size: int64(len(batches[0])) + 1, R: bytes.NewReader(batches[0])}}, entries: entries},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := WriteIncremental(&bytes.Buffer{}, tc.h, tc.batches, tc.entries); err == nil {
				t.Fatal("WriteIncremental accepted it")
			}
		})
	}
}

// FuzzReadIncremental: the stream arrives from the network. The decoder
// never panics, never accepts more than the limit, and what it accepts
// re-encodes to the same stream: the same bytes, but for a batch file of
// an older version, which is written in today's.
func FuzzReadIncremental(f *testing.F) {
	h, batches, entries := validStream(f)
	f.Add(encodeIncremental(f, h, batches, entries))
	f.Add(encodeIncremental(f, IncrementalHeader{Index: 33, Term: 3, Base: 30, End: 33}, nil, entries))
	f.Add([]byte(IncrementalMagic))
	f.Fuzz(func(t *testing.T, p []byte) {
		const limit = 64 << 10
		inc, err := ReadIncremental(bytes.NewReader(p), limit)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		if inc.Bytes > limit || inc.Bytes != int64(len(p)) {
			t.Fatalf("accepted %d bytes of %d, limit %d", inc.Bytes, len(p), limit)
		}
		var raw [][]byte
		for _, b := range inc.Batches {
			if b.CompactRevision == logcompact.UnknownCompactRevision {
				return // a version 1 file: read, never written again
			}
			raw = append(raw, encodeBatch(t, b))
		}
		again := encodeIncremental(t, inc.IncrementalHeader, raw, inc.Entries)
		if bytes.Equal(again, p) {
			return
		}
		inc2, err := ReadIncremental(bytes.NewReader(again), 2*limit)
		if err != nil {
			t.Fatalf("re-encoded stream does not read: %v", err)
		}
		if !reflect.DeepEqual(inc2.Batches, inc.Batches) || !reflect.DeepEqual(inc2.Entries, inc.Entries) ||
			inc2.IncrementalHeader != inc.IncrementalHeader {
			t.Fatalf("accepted stream re-encodes differently")
		}
	})
}
