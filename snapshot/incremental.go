package snapshot

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/raftlog"
)

// Incremental snapshots (FORMAT.md, "Incremental snapshot stream";
// docs/log-compaction.md, "Incremental snapshots"): instead of every key of
// its engine, the leader sends the compacted raft log batches that cover a
// lagging member's gap, then the raft entries after them up to the
// snapshot. WriteIncremental and ReadIncremental are the two ends; the
// first 8 bytes (IncrementalMagic or the full stream's) tell the streams
// apart.

// The constants below are wire format.
const (
	// IncrementalMagic starts an incremental snapshot stream.
	IncrementalMagic   = "STRATAIS"
	incrementalVersion = 1
	incHeaderSize      = 64
	incTrailerSize     = 16
	incTrailerMagic    = 0x53494154
	incEntryFixed      = 8 + 8 + 4 + 4 // index, term, type, data length
	maxBatchBytes      = 1 << 30       // raftlog's batch file limit
	minBatchBytes      = 64 + 16       // a batch file's header and trailer
	incBatchLengthSize = 8
	incEntryCountSize  = 4
	fullMagic          = magic
	streamMagicSize    = 8
)

// Kind says which stream a snapshot's first bytes start: KindFull or
// KindIncremental, or "" if neither.
func Kind(prefix []byte) string {
	if len(prefix) < streamMagicSize {
		return ""
	}
	switch string(prefix[:streamMagicSize]) {
	case fullMagic:
		return KindFull
	case IncrementalMagic:
		return KindIncremental
	}
	return ""
}

// Kinds of snapshot stream, as Kind names them (and metrics label them).
const (
	KindFull        = "full"
	KindIncremental = "incremental"
)

// IncrementalHeader is what an incremental stream says about itself.
type IncrementalHeader struct {
	// Index and Term are the raft snapshot's (its MsgSnap metadata).
	Index, Term uint64
	// Base is the index up to which the receiver's log holds the
	// sender's entries; BaseTerm the term there, 0 if the sender does not
	// know it.
	Base, BaseTerm uint64
	// End is the index the receiver's engine holds after the install.
	End uint64
}

// BatchSource is one compacted batch file to send: its size and a reader
// of exactly that many bytes (raftlog.BatchFile).
type BatchSource struct {
	Size int64
	R    io.Reader
}

// Incremental is a decoded incremental snapshot stream.
type Incremental struct {
	IncrementalHeader
	// Batches are consecutive; the first ends above Base and starts at or
	// below Base+1.
	Batches []*logcompact.Batch
	// Entries follow the last batch (or Base) consecutively up to End.
	Entries []*raftpb.Entry
	// Bytes is the stream's length, BatchBytes the part of it that is
	// batch files.
	Bytes, BatchBytes int64
}

// ErrTooLarge marks an incremental stream above the receiver's limit.
var ErrTooLarge = errors.New("snapshot: incremental stream above the size limit")

// WriteIncremental writes an incremental snapshot stream to w: h, the
// batch files (each exactly its Size bytes), the entries. It returns the
// bytes written. It checks only what it can without decoding the batches:
// the entries are consecutive and end at h.End if there are any.
func WriteIncremental(w io.Writer, h IncrementalHeader, batches []BatchSource, entries []*raftpb.Entry) (int64, error) {
	for i, e := range entries {
		if i > 0 && e.GetIndex() != entries[i-1].GetIndex()+1 {
			return 0, fmt.Errorf("snapshot: incremental stream: entry %d follows %d", e.GetIndex(), entries[i-1].GetIndex())
		}
	}
	if n := len(entries); n > 0 && entries[n-1].GetIndex() != h.End {
		return 0, fmt.Errorf("snapshot: incremental stream: entries end at %d, not at the end index %d", entries[n-1].GetIndex(), h.End)
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	cw := &crcWriter{w: bw, crc: crc32.New(castagnoli)}
	var hdr [incHeaderSize]byte
	copy(hdr[0:8], IncrementalMagic)
	binary.LittleEndian.PutUint32(hdr[8:12], incrementalVersion)
	binary.LittleEndian.PutUint64(hdr[16:24], h.Index)
	binary.LittleEndian.PutUint64(hdr[24:32], h.Term)
	binary.LittleEndian.PutUint64(hdr[32:40], h.Base)
	binary.LittleEndian.PutUint64(hdr[40:48], h.BaseTerm)
	binary.LittleEndian.PutUint64(hdr[48:56], h.End)
	binary.LittleEndian.PutUint32(hdr[56:60], uint32(len(batches)))
	binary.LittleEndian.PutUint32(hdr[60:64], crc32.Checksum(hdr[0:60], castagnoli))
	if _, err := cw.Write(hdr[:]); err != nil {
		return cw.n, err
	}
	var word [8]byte
	for i, b := range batches {
		binary.LittleEndian.PutUint64(word[:], uint64(b.Size))
		if _, err := cw.Write(word[:]); err != nil {
			return cw.n, err
		}
		if n, err := io.CopyN(cw, b.R, b.Size); err != nil {
			return cw.n, fmt.Errorf("snapshot: incremental stream: batch %d: %d of %d bytes: %w", i, n, b.Size, err)
		}
	}
	binary.LittleEndian.PutUint32(word[:4], uint32(len(entries)))
	if _, err := cw.Write(word[:4]); err != nil {
		return cw.n, err
	}
	var eh [incEntryFixed]byte
	for _, e := range entries {
		binary.LittleEndian.PutUint64(eh[0:8], e.GetIndex())
		binary.LittleEndian.PutUint64(eh[8:16], e.GetTerm())
		binary.LittleEndian.PutUint32(eh[16:20], uint32(e.GetType()))
		binary.LittleEndian.PutUint32(eh[20:24], uint32(len(e.GetData())))
		if _, err := cw.Write(eh[:]); err != nil {
			return cw.n, err
		}
		if _, err := cw.Write(e.GetData()); err != nil {
			return cw.n, err
		}
	}
	var tr [incTrailerSize]byte
	binary.LittleEndian.PutUint64(tr[0:8], uint64(cw.n))
	binary.LittleEndian.PutUint32(tr[8:12], cw.crc.Sum32())
	binary.LittleEndian.PutUint32(tr[12:16], incTrailerMagic)
	if _, err := cw.Write(tr[:]); err != nil {
		return cw.n, err
	}
	return cw.n, bw.Flush()
}

// crcWriter counts and checksums what it writes.
type crcWriter struct {
	w   io.Writer
	crc hash.Hash32
	n   int64
}

func (c *crcWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.crc.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// incReader reads a stream within a byte budget, checksumming and
// counting.
type incReader struct {
	r     io.Reader
	crc   hash.Hash32
	n     int64
	limit int64
}

func (r *incReader) read(n int64, what string) ([]byte, error) {
	if n < 0 || n > r.limit-r.n {
		return nil, fmt.Errorf("%w: incremental stream: %s of %d bytes after %d: %w", ErrCorrupt, what, n, r.n, ErrTooLarge)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r.r, p); err != nil {
		return nil, fmt.Errorf("%w: incremental stream: %s at byte %d: %v", ErrCorrupt, what, r.n, err)
	}
	r.crc.Write(p)
	r.n += n
	return p, nil
}

// ReadIncremental decodes and checks a whole incremental snapshot stream
// of at most limit bytes (FORMAT.md, "Incremental snapshot stream", rules
// 1-6). Any damage is an error wrapping ErrCorrupt; a stream above limit
// wraps ErrTooLarge as well. The stream comes from the network: every
// length is bounded before anything is allocated for it.
func ReadIncremental(r io.Reader, limit int64) (*Incremental, error) {
	in := &incReader{r: r, crc: crc32.New(castagnoli), limit: limit}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: incremental stream: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	hdr, err := in.read(incHeaderSize, "header")
	if err != nil {
		return nil, err
	}
	if string(hdr[0:8]) != IncrementalMagic {
		return nil, bad("bad magic %q", hdr[0:8])
	}
	if got, want := binary.LittleEndian.Uint32(hdr[60:64]), crc32.Checksum(hdr[0:60], castagnoli); got != want {
		return nil, bad("header checksum %08x, want %08x", got, want)
	}
	if v := binary.LittleEndian.Uint32(hdr[8:12]); v != incrementalVersion {
		return nil, bad("unknown version %d", v)
	}
	if binary.LittleEndian.Uint32(hdr[12:16]) != 0 {
		return nil, bad("reserved header bytes are not zero")
	}
	inc := &Incremental{IncrementalHeader: IncrementalHeader{
		Index:    binary.LittleEndian.Uint64(hdr[16:24]),
		Term:     binary.LittleEndian.Uint64(hdr[24:32]),
		Base:     binary.LittleEndian.Uint64(hdr[32:40]),
		BaseTerm: binary.LittleEndian.Uint64(hdr[40:48]),
		End:      binary.LittleEndian.Uint64(hdr[48:56]),
	}}
	h := inc.IncrementalHeader
	if h.Base >= h.End || h.Base > h.Index || h.Index > h.End {
		return nil, bad("base %d, snapshot index %d, end %d", h.Base, h.Index, h.End)
	}
	count := int64(binary.LittleEndian.Uint32(hdr[56:60]))
	if count > (limit-in.n)/(incBatchLengthSize+minBatchBytes) {
		return nil, bad("%d batches cannot fit in %d bytes", count, limit-in.n)
	}
	next := h.Base + 1 // the first index the stream must cover next
	for i := int64(0); i < count; i++ {
		word, err := in.read(incBatchLengthSize, "batch length")
		if err != nil {
			return nil, err
		}
		size := binary.LittleEndian.Uint64(word)
		if size > maxBatchBytes {
			return nil, bad("batch %d of %d bytes, above the batch file limit", i, size)
		}
		raw, err := in.read(int64(size), "batch")
		if err != nil {
			return nil, err
		}
		file, err := raftlog.DecodeCompactedBatch(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: incremental stream: batch %d: %w", ErrCorrupt, i, err)
		}
		b, err := logcompact.DecodeBatch(file)
		if err != nil {
			return nil, fmt.Errorf("%w: incremental stream: batch %d: %w", ErrCorrupt, i, err)
		}
		switch {
		case i == 0 && (b.FirstIndex > next || b.LastIndex < next):
			return nil, bad("first batch %d..%d does not cover index %d after the base", b.FirstIndex, b.LastIndex, next)
		case i > 0 && b.FirstIndex != next:
			return nil, bad("batch %d..%d follows one ending at %d", b.FirstIndex, b.LastIndex, next-1)
		case b.LastIndex > h.End:
			return nil, bad("batch %d..%d ends beyond the end index %d", b.FirstIndex, b.LastIndex, h.End)
		case b.LastIndex == h.Index && b.LastTerm != h.Term:
			return nil, bad("batch ending at the snapshot index %d has term %d, the snapshot %d", h.Index, b.LastTerm, h.Term)
		}
		for _, r := range b.Records {
			if r.Kind == logcompact.RecordEntry && r.Entry.GetType() != raftpb.EntryNormal {
				return nil, bad("batch %d..%d keeps a configuration change at index %d", b.FirstIndex, b.LastIndex, r.Index)
			}
		}
		inc.Batches = append(inc.Batches, b)
		inc.BatchBytes += int64(size)
		next = b.LastIndex + 1
	}
	word, err := in.read(incEntryCountSize, "entry count")
	if err != nil {
		return nil, err
	}
	n := int64(binary.LittleEndian.Uint32(word))
	if n > (limit-in.n)/incEntryFixed {
		return nil, bad("%d entries cannot fit in %d bytes", n, limit-in.n)
	}
	if n == 0 && count == 0 {
		return nil, bad("neither batches nor entries")
	}
	if n > 0 {
		inc.Entries = make([]*raftpb.Entry, 0, n)
	}
	for i := int64(0); i < n; i++ {
		eh, err := in.read(incEntryFixed, "entry header")
		if err != nil {
			return nil, err
		}
		index, term := binary.LittleEndian.Uint64(eh[0:8]), binary.LittleEndian.Uint64(eh[8:16])
		typ := raftpb.EntryType(int32(binary.LittleEndian.Uint32(eh[16:20])))
		if index != next {
			return nil, bad("entry %d where %d was due", index, next)
		}
		if index > h.End {
			return nil, bad("entry %d beyond the end index %d", index, h.End)
		}
		if index == h.Index && term != h.Term {
			return nil, bad("entry at the snapshot index %d has term %d, the snapshot %d", index, term, h.Term)
		}
		switch typ {
		case raftpb.EntryNormal, raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
		default:
			return nil, bad("entry %d of unknown type %d", index, typ)
		}
		data, err := in.read(int64(binary.LittleEndian.Uint32(eh[20:24])), "entry data")
		if err != nil {
			return nil, err
		}
		e := &raftpb.Entry{Index: proto.Uint64(index), Term: proto.Uint64(term), Type: typ.Enum()}
		if len(data) > 0 {
			e.Data = data
		}
		inc.Entries = append(inc.Entries, e)
		next = index + 1
	}
	if next-1 != h.End {
		return nil, bad("the stream ends at index %d, not at the end index %d", next-1, h.End)
	}
	sum, body := in.crc.Sum32(), in.n
	tr, err := in.read(incTrailerSize, "trailer")
	if err != nil {
		return nil, err
	}
	switch {
	case binary.LittleEndian.Uint32(tr[12:16]) != incTrailerMagic:
		return nil, bad("no trailer")
	case binary.LittleEndian.Uint64(tr[0:8]) != uint64(body):
		return nil, bad("trailer says %d bytes, the stream held %d", binary.LittleEndian.Uint64(tr[0:8]), body)
	case binary.LittleEndian.Uint32(tr[8:12]) != sum:
		return nil, bad("checksum mismatch")
	}
	var one [1]byte
	if k, err := io.ReadFull(r, one[:]); k > 0 || !errors.Is(err, io.EOF) {
		if k > 0 {
			return nil, bad("bytes after the trailer")
		}
		return nil, fmt.Errorf("%w: incremental stream: after the trailer: %v", ErrCorrupt, err)
	}
	inc.Bytes = in.n
	return inc, nil
}
