package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// A compacted batch file stands for the committed, applied entries
// [FirstIndex, LastIndex] of the log (docs/design.md, "The log format";
// FORMAT.md, "Compacted batch files"). What stands for them is the
// payload, which the log does not read: its writer (package logcompact)
// encodes there whatever recovery needs to rebuild the state at LastIndex
// from a state at any index inside the batch. The log keeps the index
// range and the last term, which raft needs, checks the whole file with a
// checksum, and reports how many records the writer says the payload
// holds.
//
// The file is written once, under a temporary name, synced, renamed and
// its directory synced; it is never appended to. A file that does not
// decode is therefore corruption, never a torn write.

// The constants below are wire format (FORMAT.md, "Compacted batch files").
const (
	batchFileMagic   = "STRATACB"
	batchFileVersion = 3
	batchFileSuffix  = ".cbatch"
	// batchFileHeaderSize is the header of version 3. Versions 1 and 2,
	// written by older releases, had headers of 64 and 72 bytes whose
	// bytes from 48 to the reserved word held their payload's fields.
	batchFileHeaderSize   = 56
	batchFileHeaderSizeV1 = 64
	batchFileHeaderSizeV2 = 72
	batchTrailerSize      = 16
	batchTrailerMagic     = 0x44455453 // "STED" little-endian: end of a batch file
	// maxBatchFileSize bounds what a reader allocates for one file.
	maxBatchFileSize = 1 << 30
)

// CompactedBatch is a compacted batch file, decoded: the index range it
// stands for and its opaque payload.
type CompactedBatch struct {
	// FirstIndex and LastIndex bound the entries the batch stands for.
	FirstIndex, LastIndex uint64
	// LastTerm is the term of the entry at LastIndex, so that raft's view
	// of the log's terms survives the entries themselves.
	LastTerm uint64
	// Records is how many records the payload holds, as its writer
	// counted them. The log reports it (Inspect, Stats) and checks nothing
	// against it.
	Records uint64
	// PayloadFormat names the payload's encoding; its writer chooses it,
	// from 3 up. A file of version 1 or 2 predates opaque payloads: its
	// PayloadFormat is the file's version and Payload the whole file, a
	// layout its owner still decodes (FORMAT.md). Such a batch encodes as
	// that file again, byte for byte.
	PayloadFormat uint32
	// Payload stands for the entries. It aliases the bytes decoded.
	Payload []byte
}

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

// EncodeCompactedBatch returns the bytes of a compacted batch file:
// format version 3, or, for a batch read from a file of version 1 or 2
// (PayloadFormat 1 or 2), that file.
func EncodeCompactedBatch(b *CompactedBatch) ([]byte, error) {
	if b.LastIndex < b.FirstIndex || b.FirstIndex == 0 {
		return nil, fmt.Errorf("raftlog: compacted batch of indexes %d..%d", b.FirstIndex, b.LastIndex)
	}
	switch {
	case b.PayloadFormat == 1 || b.PayloadFormat == 2:
		// An older release's file, kept as it is. Decoding it again checks
		// that the fields agree with the bytes.
		old, err := DecodeCompactedBatch(b.Payload)
		if err != nil {
			return nil, fmt.Errorf("raftlog: compacted batch %d..%d of payload format %d: %w", b.FirstIndex, b.LastIndex, b.PayloadFormat, err)
		}
		if old.FirstIndex != b.FirstIndex || old.LastIndex != b.LastIndex || old.LastTerm != b.LastTerm ||
			old.Records != b.Records || old.PayloadFormat != b.PayloadFormat {
			return nil, fmt.Errorf("raftlog: compacted batch %d..%d: fields disagree with its version %d file", b.FirstIndex, b.LastIndex, b.PayloadFormat)
		}
		return b.Payload, nil
	case b.PayloadFormat < batchFileVersion:
		return nil, fmt.Errorf("raftlog: compacted batch %d..%d: payload format %d (want 3 or more)", b.FirstIndex, b.LastIndex, b.PayloadFormat)
	}
	size := batchFileHeaderSize + len(b.Payload) + batchTrailerSize
	if size > maxBatchFileSize {
		return nil, fmt.Errorf("raftlog: compacted batch of %d bytes above limit %d", size, maxBatchFileSize)
	}
	buf := make([]byte, batchFileHeaderSize, size)
	copy(buf[0:8], batchFileMagic)
	binary.LittleEndian.PutUint32(buf[8:12], batchFileVersion)
	binary.LittleEndian.PutUint32(buf[12:16], b.PayloadFormat)
	binary.LittleEndian.PutUint64(buf[16:24], b.FirstIndex)
	binary.LittleEndian.PutUint64(buf[24:32], b.LastIndex)
	binary.LittleEndian.PutUint64(buf[32:40], b.LastTerm)
	binary.LittleEndian.PutUint64(buf[40:48], b.Records)
	binary.LittleEndian.PutUint32(buf[52:56], crc32.Checksum(buf[0:52], castagnoli))
	buf = append(buf, b.Payload...)
	crc := crc32.Checksum(buf, castagnoli)
	buf = binary.LittleEndian.AppendUint64(buf, uint64(len(b.Payload)))
	buf = binary.LittleEndian.AppendUint32(buf, crc)
	buf = binary.LittleEndian.AppendUint32(buf, batchTrailerMagic)
	return buf, nil
}

// batchHeader is the header of a compacted batch file, decoded.
type batchHeader struct {
	size    int // of the header: 56 (version 3), 64 (1) or 72 (2)
	version uint32
	// batch holds the header's fields, no payload.
	batch CompactedBatch
}

// decodeBatchHeader decodes and checks the header at the start of p (p
// may hold more), of any version. Errors are the reason alone, for the
// caller to wrap in ErrCorrupt.
func decodeBatchHeader(p []byte) (batchHeader, error) {
	if len(p) < 12 {
		return batchHeader{}, fmt.Errorf("%d bytes, shorter than a header", len(p))
	}
	if string(p[0:8]) != batchFileMagic {
		return batchHeader{}, fmt.Errorf("bad magic %q", p[0:8])
	}
	h := batchHeader{version: binary.LittleEndian.Uint32(p[8:12])}
	switch h.version {
	case 1:
		h.size = batchFileHeaderSizeV1
	case 2:
		h.size = batchFileHeaderSizeV2
	case batchFileVersion:
		h.size = batchFileHeaderSize
	default:
		return batchHeader{}, fmt.Errorf("unsupported version %d", h.version)
	}
	if len(p) < h.size {
		return batchHeader{}, fmt.Errorf("%d bytes, shorter than a header of %d", len(p), h.size)
	}
	if got, want := binary.LittleEndian.Uint32(p[h.size-4:h.size]), crc32.Checksum(p[0:h.size-4], castagnoli); got != want {
		return batchHeader{}, fmt.Errorf("header checksum %08x, want %08x", got, want)
	}
	if binary.LittleEndian.Uint32(p[h.size-8:h.size-4]) != 0 {
		return batchHeader{}, errors.New("reserved header bytes are not zero")
	}
	h.batch = CompactedBatch{
		FirstIndex: binary.LittleEndian.Uint64(p[16:24]),
		LastIndex:  binary.LittleEndian.Uint64(p[24:32]),
		LastTerm:   binary.LittleEndian.Uint64(p[32:40]),
		Records:    binary.LittleEndian.Uint64(p[40:48]),
	}
	if h.version == batchFileVersion {
		h.batch.PayloadFormat = binary.LittleEndian.Uint32(p[12:16])
		if h.batch.PayloadFormat < batchFileVersion {
			return batchHeader{}, fmt.Errorf("payload format %d in a version %d file", h.batch.PayloadFormat, h.version)
		}
	} else {
		if binary.LittleEndian.Uint32(p[12:16]) != 0 {
			return batchHeader{}, errors.New("reserved header bytes are not zero")
		}
		h.batch.PayloadFormat = h.version
	}
	if h.batch.FirstIndex == 0 || h.batch.LastIndex < h.batch.FirstIndex {
		return batchHeader{}, fmt.Errorf("indexes %d..%d", h.batch.FirstIndex, h.batch.LastIndex)
	}
	return h, nil
}

// DecodeCompactedBatch decodes a whole compacted batch file, of any
// version. Any mismatch (magic, version, checksums, the payload's length)
// is an error wrapping ErrCorrupt. The payload aliases p.
func DecodeCompactedBatch(p []byte) (*CompactedBatch, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: compacted batch: %s", ErrCorrupt, fmt.Sprintf(format, args...))
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
		return nil, bad("trailer says %d payload bytes, file holds %d", n, end-h.size)
	}
	if got, want := binary.LittleEndian.Uint32(t[8:12]), crc32.Checksum(p[:end], castagnoli); got != want {
		return nil, bad("checksum %08x, want %08x", got, want)
	}
	b := &h.batch
	if h.version == batchFileVersion {
		b.Payload = p[h.size:end:end]
	} else {
		b.Payload = p
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
