package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// A compacted batch file stands for the committed, applied entries
// [FirstIndex, LastIndex] of the log (docs/design.md, "The log format"; FORMAT.md,
// "Compacted batch files"). Instead of the entries it holds, per key, the
// versions that recovery must rebuild -- each an idempotent "set the key to
// this state at this revision" or a deletion -- and, verbatim, the entries
// that cannot be merged (conf changes, lease grants, revokes and
// checkpoints, revision compactions, member attributes). Records are in
// the order of the entries that produced them, so replaying them in order
// on a state at any index inside the batch yields the state at LastIndex.
//
// The file is written once, under a temporary name, synced, renamed and
// its directory synced; it is never appended to. A file that does not
// decode is therefore corruption, never a torn write.

// The constants below are wire format (FORMAT.md, "Compacted batch files").
const (
	batchFileMagic   = "STRATACB"
	batchFileVersion = 2
	batchFileSuffix  = ".cbatch"
	// batchFileHeaderSize is the header of version 2, which adds the compact
	// revision to version 1's (batchFileHeaderSizeV1).
	batchFileHeaderSize   = 72
	batchFileHeaderSizeV1 = 64
	batchTrailerSize      = 16
	batchTrailerMagic     = 0x44455453 // "STED" little-endian: end of a batch file
	// maxBatchFileSize bounds what a reader allocates for one file.
	maxBatchFileSize = 1 << 30

	recordPutFixed    = 4 + 8*6 + 4 + 4 // kind word, index, main, sub, create, version, lease, key len, value len
	recordDeleteFixed = 4 + 8*3 + 4     // kind word, index, main, sub, key len
	recordEntryFixed  = 4 + 8*2 + 4 + 4 // kind word, index, term, entry type, data len
)

// RecordKind is the kind of a compacted batch record.
type RecordKind uint8

const (
	// RecordPut sets a key to a state: value, create and mod revision,
	// version, lease. Wire value 1.
	RecordPut RecordKind = 1
	// RecordDelete deletes a key at a revision. Wire value 2.
	RecordDelete RecordKind = 2
	// RecordEntry is a raft entry kept verbatim because it cannot be
	// merged. Wire value 3.
	RecordEntry RecordKind = 3
)

func (k RecordKind) String() string {
	switch k {
	case RecordPut:
		return "put"
	case RecordDelete:
		return "delete"
	case RecordEntry:
		return "entry"
	}
	return fmt.Sprintf("RecordKind(%d)", uint8(k))
}

// BatchRecord is one record of a compacted batch.
type BatchRecord struct {
	Kind RecordKind
	// Index is the raft index of the entry that produced the record.
	Index uint64
	// Main and Sub are the revision of the write (RecordPut: the key's
	// mod revision; RecordDelete: the deletion's revision).
	Main, Sub int64
	// Key, and for RecordPut the key's state after the write.
	Key            []byte
	Value          []byte
	CreateRevision int64
	Version        int64
	Lease          int64
	// Entry is the kept entry of a RecordEntry.
	Entry *raftpb.Entry
}

// CompactedBatch is the content of a compacted batch file.
type CompactedBatch struct {
	// FirstIndex and LastIndex bound the entries the batch stands for.
	FirstIndex, LastIndex uint64
	// LastTerm is the term of the entry at LastIndex, so that raft's view
	// of the log's terms survives the entries themselves.
	LastTerm uint64
	// Revision is the store's revision after applying LastIndex.
	Revision int64
	// CompactRevision is the compact revision a store must have once it
	// has replayed the batch: the batch dropped versions superseded, in
	// the batch, by a version at or below it (the history horizon rule),
	// so reads below it would not see them. 0 if it dropped none; at most
	// Revision. UnknownCompactRevision for a batch read from a version 1
	// file, which did not record it (and such a batch is written as
	// version 1 again).
	CompactRevision int64
	// Records, in the order of the entries that produced them.
	Records []BatchRecord
}

// UnknownCompactRevision is the CompactRevision of a batch read from a
// version 1 file.
const UnknownCompactRevision int64 = -1

// Commands is the number of log entries the batch stands for.
func (b *CompactedBatch) Commands() uint64 {
	if b.LastIndex < b.FirstIndex {
		return 0
	}
	return b.LastIndex - b.FirstIndex + 1
}

// batchFileName names a compacted batch file: sequence and first index as
// in a segment name, so that files of one directory sort in log order.
func batchFileName(seq, firstIndex uint64) string {
	return fmt.Sprintf("%016x-%016x%s", seq, firstIndex, batchFileSuffix)
}

// parseBatchFileName is the inverse of batchFileName.
func parseBatchFileName(name string) (seq, firstIndex uint64, ok bool) {
	base, found := strings.CutSuffix(name, batchFileSuffix)
	if !found {
		return 0, 0, false
	}
	seq, firstIndex, ok = parseSegmentName(base + segmentSuffix)
	return seq, firstIndex, ok
}

// EncodeCompactedBatch returns the bytes of a compacted batch file: format
// version 2, or version 1 for a batch whose compact revision is unknown
// (read from a version 1 file), so that such a file re-encodes as it was.
func EncodeCompactedBatch(b *CompactedBatch) ([]byte, error) {
	if b.LastIndex < b.FirstIndex || b.FirstIndex == 0 {
		return nil, fmt.Errorf("raftlog: compacted batch of indexes %d..%d", b.FirstIndex, b.LastIndex)
	}
	version, size := uint32(batchFileVersion), batchFileHeaderSize
	switch {
	case b.CompactRevision == UnknownCompactRevision:
		version, size = 1, batchFileHeaderSizeV1
	case b.CompactRevision < 0 || b.CompactRevision > b.Revision:
		return nil, fmt.Errorf("raftlog: compacted batch %d..%d: compact revision %d outside 0..%d",
			b.FirstIndex, b.LastIndex, b.CompactRevision, b.Revision)
	}
	buf := make([]byte, size, 4096)
	copy(buf[0:8], batchFileMagic)
	binary.LittleEndian.PutUint32(buf[8:12], version)
	binary.LittleEndian.PutUint64(buf[16:24], b.FirstIndex)
	binary.LittleEndian.PutUint64(buf[24:32], b.LastIndex)
	binary.LittleEndian.PutUint64(buf[32:40], b.LastTerm)
	binary.LittleEndian.PutUint64(buf[40:48], uint64(len(b.Records)))
	binary.LittleEndian.PutUint64(buf[48:56], uint64(b.Revision))
	if version >= 2 {
		binary.LittleEndian.PutUint64(buf[56:64], uint64(b.CompactRevision))
	}
	binary.LittleEndian.PutUint32(buf[size-4:size], crc32.Checksum(buf[0:size-4], castagnoli))
	u64 := binary.LittleEndian.AppendUint64
	u32 := binary.LittleEndian.AppendUint32
	var prev uint64
	for i, r := range b.Records {
		if r.Index < b.FirstIndex || r.Index > b.LastIndex || r.Index < prev {
			return nil, fmt.Errorf("raftlog: compacted batch record %d has index %d (batch %d..%d, previous %d)",
				i, r.Index, b.FirstIndex, b.LastIndex, prev)
		}
		prev = r.Index
		switch r.Kind {
		case RecordPut:
			buf = u32(buf, uint32(RecordPut))
			buf = u64(buf, r.Index)
			buf = u64(buf, uint64(r.Main))
			buf = u64(buf, uint64(r.Sub))
			buf = u64(buf, uint64(r.CreateRevision))
			buf = u64(buf, uint64(r.Version))
			buf = u64(buf, uint64(r.Lease))
			buf = u32(buf, uint32(len(r.Key)))
			buf = u32(buf, uint32(len(r.Value)))
			buf = append(buf, r.Key...)
			buf = append(buf, r.Value...)
		case RecordDelete:
			buf = u32(buf, uint32(RecordDelete))
			buf = u64(buf, r.Index)
			buf = u64(buf, uint64(r.Main))
			buf = u64(buf, uint64(r.Sub))
			buf = u32(buf, uint32(len(r.Key)))
			buf = append(buf, r.Key...)
		case RecordEntry:
			if r.Entry.GetIndex() != r.Index {
				return nil, fmt.Errorf("raftlog: compacted batch record %d: entry index %d, record index %d", i, r.Entry.GetIndex(), r.Index)
			}
			buf = u32(buf, uint32(RecordEntry))
			buf = u64(buf, r.Index)
			buf = u64(buf, r.Entry.GetTerm())
			buf = u32(buf, uint32(r.Entry.GetType()))
			buf = u32(buf, uint32(len(r.Entry.GetData())))
			buf = append(buf, r.Entry.GetData()...)
		default:
			return nil, fmt.Errorf("raftlog: compacted batch record %d of unknown kind %d", i, r.Kind)
		}
	}
	body := uint64(len(buf) - size)
	crc := crc32.Checksum(buf, castagnoli)
	buf = u64(buf, body)
	buf = u32(buf, crc)
	buf = u32(buf, batchTrailerMagic)
	if len(buf) > maxBatchFileSize {
		return nil, fmt.Errorf("raftlog: compacted batch of %d bytes above limit %d", len(buf), maxBatchFileSize)
	}
	return buf, nil
}

// batchHeader is the header of a compacted batch file, decoded.
type batchHeader struct {
	size  int // of the header: version 1's or version 2's
	count uint64
	// batch holds the header's fields, no records.
	batch CompactedBatch
}

// decodeBatchHeader decodes and checks the header at the start of p (p
// may hold more). Version 1 (no compact revision) and version 2 are read;
// a version 1 header gives UnknownCompactRevision. Errors are the reason
// alone, for the caller to wrap in ErrCorrupt.
func decodeBatchHeader(p []byte) (batchHeader, error) {
	if len(p) < 12 {
		return batchHeader{}, fmt.Errorf("%d bytes, shorter than a header", len(p))
	}
	if string(p[0:8]) != batchFileMagic {
		return batchHeader{}, fmt.Errorf("bad magic %q", p[0:8])
	}
	var h batchHeader
	switch v := binary.LittleEndian.Uint32(p[8:12]); v {
	case 1:
		h.size = batchFileHeaderSizeV1
	case 2:
		h.size = batchFileHeaderSize
	default:
		return batchHeader{}, fmt.Errorf("unsupported version %d", v)
	}
	if len(p) < h.size {
		return batchHeader{}, fmt.Errorf("%d bytes, shorter than a header of %d", len(p), h.size)
	}
	if got, want := binary.LittleEndian.Uint32(p[h.size-4:h.size]), crc32.Checksum(p[0:h.size-4], castagnoli); got != want {
		return batchHeader{}, fmt.Errorf("header checksum %08x, want %08x", got, want)
	}
	if binary.LittleEndian.Uint32(p[12:16]) != 0 || binary.LittleEndian.Uint32(p[h.size-8:h.size-4]) != 0 {
		return batchHeader{}, errors.New("reserved header bytes are not zero")
	}
	h.count = binary.LittleEndian.Uint64(p[40:48])
	h.batch = CompactedBatch{
		FirstIndex:      binary.LittleEndian.Uint64(p[16:24]),
		LastIndex:       binary.LittleEndian.Uint64(p[24:32]),
		LastTerm:        binary.LittleEndian.Uint64(p[32:40]),
		Revision:        int64(binary.LittleEndian.Uint64(p[48:56])),
		CompactRevision: UnknownCompactRevision,
	}
	if h.size == batchFileHeaderSize {
		h.batch.CompactRevision = int64(binary.LittleEndian.Uint64(p[56:64]))
		if h.batch.CompactRevision < 0 || h.batch.CompactRevision > h.batch.Revision {
			return batchHeader{}, fmt.Errorf("compact revision %d outside 0..%d", h.batch.CompactRevision, h.batch.Revision)
		}
	}
	if h.batch.FirstIndex == 0 || h.batch.LastIndex < h.batch.FirstIndex {
		return batchHeader{}, fmt.Errorf("indexes %d..%d", h.batch.FirstIndex, h.batch.LastIndex)
	}
	return h, nil
}

// DecodeCompactedBatch decodes a whole compacted batch file, of version 1
// or 2. Any mismatch (magic, version, checksums, a length beyond the bytes
// left, a record out of order or outside the batch) is an error wrapping
// ErrCorrupt. Key, value and entry data alias p.
func DecodeCompactedBatch(p []byte) (*CompactedBatch, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: compacted batch: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if len(p) < batchFileHeaderSizeV1+batchTrailerSize {
		return nil, bad("%d bytes, shorter than header and trailer", len(p))
	}
	h, err := decodeBatchHeader(p)
	if err != nil {
		return nil, bad("%v", err)
	}
	if len(p) < h.size+batchTrailerSize {
		return nil, bad("%d bytes, shorter than header and trailer", len(p))
	}
	t := p[len(p)-batchTrailerSize:]
	if binary.LittleEndian.Uint32(t[12:16]) != batchTrailerMagic {
		return nil, bad("no trailer")
	}
	end := len(p) - batchTrailerSize
	if n := binary.LittleEndian.Uint64(t[0:8]); n != uint64(end-h.size) {
		return nil, bad("trailer says %d record bytes, file holds %d", n, end-h.size)
	}
	if got, want := binary.LittleEndian.Uint32(t[8:12]), crc32.Checksum(p[:end], castagnoli); got != want {
		return nil, bad("checksum %08x, want %08x", got, want)
	}
	b := &h.batch
	count := h.count
	body := p[h.size:end]
	// The smallest record is a kept entry with no data (28 bytes; a
	// deletion takes at least 32): the count is bounded by the bytes
	// before anything is allocated.
	if count > uint64(len(body)/min(recordEntryFixed, recordDeleteFixed, recordPutFixed)) {
		return nil, bad("%d records cannot fit %d bytes", count, len(body))
	}
	b.Records = make([]BatchRecord, 0, count)
	off := 0
	take := func(n int) ([]byte, bool) {
		if n < 0 || n > len(body)-off {
			return nil, false
		}
		s := body[off : off+n : off+n]
		off += n
		return s, true
	}
	u64 := func(s []byte, i int) uint64 { return binary.LittleEndian.Uint64(s[i:]) }
	u32 := func(s []byte, i int) int { return int(binary.LittleEndian.Uint32(s[i:])) }
	var prev uint64
	for i := uint64(0); i < count; i++ {
		if len(body)-off < 4 {
			return nil, bad("record %d beyond the end", i)
		}
		var r BatchRecord
		switch kind := RecordKind(body[off]); {
		case body[off+1] != 0 || body[off+2] != 0 || body[off+3] != 0:
			return nil, bad("record %d: reserved bytes are not zero", i)
		case kind == RecordPut:
			h, ok := take(recordPutFixed)
			if !ok {
				return nil, bad("record %d header beyond the end", i)
			}
			r = BatchRecord{Kind: kind, Index: u64(h, 4), Main: int64(u64(h, 12)), Sub: int64(u64(h, 20)),
				CreateRevision: int64(u64(h, 28)), Version: int64(u64(h, 36)), Lease: int64(u64(h, 44))}
			k, ok1 := take(u32(h, 52))
			v, ok2 := take(u32(h, 56))
			if !ok1 || !ok2 {
				return nil, bad("record %d key or value beyond the end", i)
			}
			r.Key, r.Value = k, v
		case kind == RecordDelete:
			h, ok := take(recordDeleteFixed)
			if !ok {
				return nil, bad("record %d header beyond the end", i)
			}
			r = BatchRecord{Kind: kind, Index: u64(h, 4), Main: int64(u64(h, 12)), Sub: int64(u64(h, 20))}
			if r.Key, ok = take(u32(h, 28)); !ok {
				return nil, bad("record %d key beyond the end", i)
			}
		case kind == RecordEntry:
			h, ok := take(recordEntryFixed)
			if !ok {
				return nil, bad("record %d header beyond the end", i)
			}
			r = BatchRecord{Kind: kind, Index: u64(h, 4)}
			data, ok := take(u32(h, 24))
			if !ok {
				return nil, bad("record %d data beyond the end", i)
			}
			r.Entry = &raftpb.Entry{Index: proto.Uint64(r.Index), Term: proto.Uint64(u64(h, 12)),
				Type: raftpb.EntryType(int32(binary.LittleEndian.Uint32(h[20:]))).Enum()}
			if len(data) > 0 {
				r.Entry.Data = data
			}
		default:
			return nil, bad("record %d of unknown kind %d", i, kind)
		}
		if r.Index < b.FirstIndex || r.Index > b.LastIndex || r.Index < prev {
			return nil, bad("record %d has index %d (batch %d..%d, previous %d)", i, r.Index, b.FirstIndex, b.LastIndex, prev)
		}
		prev = r.Index
		b.Records = append(b.Records, r)
	}
	if off != len(body) {
		return nil, bad("%d bytes after the last record", len(body)-off)
	}
	return b, nil
}

// WriteCompactedBatch writes b durably as file name in dir (docs/design.md,
// durability rule 7: temporary name, fsync, rename, directory fsync). The caller
// chooses the name (batchFileName) so that it sorts where the segment it
// replaces did.
func WriteCompactedBatch(fs vfs.FS, dir, name string, b *CompactedBatch) error {
	data, err := EncodeCompactedBatch(b)
	if err != nil {
		return err
	}
	path := fs.PathJoin(dir, name)
	tmp := path + tempSuffix
	if err := writeNewFile(fs, tmp, data, 0); err != nil {
		_ = fs.Remove(tmp)
		return fmt.Errorf("write compacted batch %s: %w", tmp, err)
	}
	if err := fs.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename compacted batch %s: %w", path, err)
	}
	if err := syncDir(fs, dir); err != nil {
		return fmt.Errorf("write compacted batch %s: %w", path, err)
	}
	return nil
}

// ReadCompactedBatch reads and decodes the compacted batch file at path.
func ReadCompactedBatch(fs vfs.FS, path string) (*CompactedBatch, error) {
	f, err := fs.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open compacted batch %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat compacted batch %s: %w", path, err)
	}
	if st.Size() > maxBatchFileSize {
		return nil, fmt.Errorf("%w: compacted batch %s is %d bytes, above limit %d", ErrCorrupt, path, st.Size(), maxBatchFileSize)
	}
	data := make([]byte, st.Size())
	if _, err := f.ReadAt(data, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read compacted batch %s: %w", path, err)
	}
	b, err := DecodeCompactedBatch(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, nil
}
