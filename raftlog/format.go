package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// The constants below are wire format (FORMAT.md): changing any of them
// changes what is on disk and needs a new format version.
const (
	// formatVersion is the version written in the header of a segment of a
	// log with one directory.
	formatVersion = 1
	// formatVersionStriped is the version written in the header of a
	// segment of a log with several directories: it adds stripe frames.
	formatVersionStriped = 2
	// segmentMagic opens every segment file.
	segmentMagic = "STRATARL"
	// segmentHeaderSize is the size of the segment header; the first frame
	// starts right after it.
	segmentHeaderSize = 48
	// frameHeaderSize is the size of a frame header.
	frameHeaderSize = 16
	// frameAlign is the alignment of every frame: a frame header never
	// straddles an 8-byte boundary, so its length word is never torn.
	frameAlign = 8
	// MaxFrameSize caps a frame's payload. A length above it, or above the
	// bytes left in the file, is corruption and is never allocated.
	MaxFrameSize = 256 << 20

	// frameState carries the log state: snapshot point, ConfState, HardState.
	frameState = 1
	// frameBatch carries one Append: entry sub-records and an optional
	// HardState sub-record.
	frameBatch = 2
	// frameStripe wraps a state or batch frame's payload with the log-wide
	// operation sequence that orders frames across directories (version 2).
	frameStripe = 3
	// stripeHeaderSize is the stripe prefix: op sequence, part, parts,
	// inner type, reserved.
	stripeHeaderSize = 16

	// stateFlagReset marks a state frame written by ApplySnapshot: every
	// entry before it is discarded.
	stateFlagReset = 1
	// batchFlagHardState marks a batch that carries a HardState sub-record.
	batchFlagHardState = 1

	stateFixedSize   = 56 // flags .. ConfState length, before the ConfState bytes
	batchFixedSize   = 8  // entry count and flags
	hardStateSize    = 24 // term, vote, commit
	entryFixedSize   = 24 // index, term, type, data length
	maxConfStateSize = 1 << 20
)

// ErrCorrupt marks corruption found in the log: a bad checksum, an
// impossible length or field, a missing segment. Errors wrap it with the
// file and offset.
var ErrCorrupt = errors.New("raftlog: corrupt log")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// segmentHeader is the fixed header at offset 0 of every segment.
type segmentHeader struct {
	version    uint32 // formatVersion or formatVersionStriped; 0 encodes as formatVersion
	seq        uint64 // position of the segment in the log, from 1
	firstIndex uint64 // index of the first entry the segment was created for
	salt       uint64 // random; mixed into every frame checksum of the segment
}

func (h segmentHeader) encode(b []byte) {
	_ = b[segmentHeaderSize-1]
	copy(b[0:8], segmentMagic)
	v := h.version
	if v == 0 {
		v = formatVersion
	}
	binary.LittleEndian.PutUint32(b[8:12], v)
	binary.LittleEndian.PutUint32(b[12:16], 0)
	binary.LittleEndian.PutUint64(b[16:24], h.seq)
	binary.LittleEndian.PutUint64(b[24:32], h.firstIndex)
	binary.LittleEndian.PutUint64(b[32:40], h.salt)
	binary.LittleEndian.PutUint32(b[40:44], 0)
	binary.LittleEndian.PutUint32(b[44:48], crc32.Checksum(b[0:44], castagnoli))
}

func decodeSegmentHeader(b []byte) (segmentHeader, error) {
	if len(b) < segmentHeaderSize {
		return segmentHeader{}, fmt.Errorf("short segment header (%d bytes)", len(b))
	}
	if string(b[0:8]) != segmentMagic {
		return segmentHeader{}, fmt.Errorf("bad magic %q", b[0:8])
	}
	if got, want := binary.LittleEndian.Uint32(b[44:48]), crc32.Checksum(b[0:44], castagnoli); got != want {
		return segmentHeader{}, fmt.Errorf("segment header checksum %08x, want %08x", got, want)
	}
	v := binary.LittleEndian.Uint32(b[8:12])
	if v != formatVersion && v != formatVersionStriped {
		return segmentHeader{}, fmt.Errorf("unsupported format version %d", v)
	}
	return segmentHeader{
		version:    v,
		seq:        binary.LittleEndian.Uint64(b[16:24]),
		firstIndex: binary.LittleEndian.Uint64(b[24:32]),
		salt:       binary.LittleEndian.Uint64(b[32:40]),
	}, nil
}

// padded returns n rounded up to the frame alignment.
func padded(n int) int { return (n + frameAlign - 1) &^ (frameAlign - 1) }

// frameChecksum is the CRC-32C of salt || header[4:16] || payload || padding:
// everything in the frame but the checksum word, keyed by the segment salt
// so that bytes that look like a frame inside an entry's data, or left over
// from another segment, never verify.
func frameChecksum(salt uint64, frame []byte) uint32 {
	var s [8]byte
	binary.LittleEndian.PutUint64(s[:], salt)
	c := crc32.Update(0, castagnoli, s[:])
	return crc32.Update(c, castagnoli, frame[4:])
}

// appendFrame appends a frame of type typ whose payload is written by fill
// into the payloadLen bytes it is given, and returns the extended buffer.
func appendFrame(buf []byte, salt uint64, typ byte, payloadLen int, fill func(p []byte)) []byte {
	start := len(buf)
	total := frameHeaderSize + padded(payloadLen)
	buf = grow(buf, total)
	f := buf[start : start+total]
	clear(f)
	f[4] = typ
	binary.LittleEndian.PutUint32(f[8:12], uint32(payloadLen))
	fill(f[frameHeaderSize : frameHeaderSize+payloadLen])
	binary.LittleEndian.PutUint32(f[0:4], frameChecksum(salt, f))
	return buf
}

func grow(b []byte, n int) []byte {
	if cap(b)-len(b) < n {
		nb := make([]byte, len(b), 2*cap(b)+n)
		copy(nb, b)
		b = nb
	}
	return b[:len(b)+n]
}

// frameHeader is a decoded, not yet verified, frame header.
type frameHeader struct {
	typ        byte
	payloadLen int
}

// errNoFrame reports an all-zero frame header: the end of the written part
// of a preallocated segment, or a zeroed (lost) write.
var errNoFrame = errors.New("no frame (zero header)")

// decodeFrameHeader checks the cheap fields of a header. left is the number
// of bytes from the header to the end of the file: a length that does not
// fit is rejected before anything is allocated.
func decodeFrameHeader(h []byte, left int64) (frameHeader, error) {
	if binary.LittleEndian.Uint64(h[0:8]) == 0 && binary.LittleEndian.Uint64(h[8:16]) == 0 {
		return frameHeader{}, errNoFrame
	}
	typ := h[4]
	if typ != frameState && typ != frameBatch && typ != frameStripe {
		return frameHeader{}, fmt.Errorf("unknown frame type %d", typ)
	}
	if h[5] != 0 || h[6] != 0 || h[7] != 0 || binary.LittleEndian.Uint32(h[12:16]) != 0 {
		return frameHeader{}, errors.New("reserved frame header bytes are not zero")
	}
	n := int64(binary.LittleEndian.Uint32(h[8:12]))
	if n > MaxFrameSize {
		return frameHeader{}, fmt.Errorf("frame length %d above limit %d", n, MaxFrameSize)
	}
	if frameHeaderSize+int64(padded(int(n))) > left {
		return frameHeader{}, fmt.Errorf("frame length %d beyond end of file (%d bytes left)", n, left)
	}
	return frameHeader{typ: typ, payloadLen: int(n)}, nil
}

// verifyFrame checks the checksum of a whole frame (header, payload, padding).
func verifyFrame(salt uint64, frame []byte) error {
	if got, want := binary.LittleEndian.Uint32(frame[0:4]), frameChecksum(salt, frame); got != want {
		return fmt.Errorf("frame checksum %08x, want %08x", got, want)
	}
	return nil
}

// logState is the content of a state frame.
type logState struct {
	reset     bool
	snapIndex uint64
	snapTerm  uint64
	hs        hardState
	cs        *raftpb.ConfState
}

// hardState is raftpb.HardState without the protobuf machinery, so that it
// can be copied and compared.
type hardState struct{ term, vote, commit uint64 }

func hardStateOf(hs *raftpb.HardState) hardState {
	return hardState{term: hs.GetTerm(), vote: hs.GetVote(), commit: hs.GetCommit()}
}

func (h hardState) proto() *raftpb.HardState {
	return &raftpb.HardState{Term: proto.Uint64(h.term), Vote: proto.Uint64(h.vote), Commit: proto.Uint64(h.commit)}
}

func putHardState(b []byte, h hardState) {
	binary.LittleEndian.PutUint64(b[0:8], h.term)
	binary.LittleEndian.PutUint64(b[8:16], h.vote)
	binary.LittleEndian.PutUint64(b[16:24], h.commit)
}

func getHardState(b []byte) hardState {
	return hardState{
		term:   binary.LittleEndian.Uint64(b[0:8]),
		vote:   binary.LittleEndian.Uint64(b[8:16]),
		commit: binary.LittleEndian.Uint64(b[16:24]),
	}
}

// appendStateFrame appends a state frame.
func appendStateFrame(buf []byte, salt uint64, st logState) ([]byte, error) {
	n, fill, err := statePayload(st)
	if err != nil {
		return buf, err
	}
	return appendFrame(buf, salt, frameState, n, fill), nil
}

// statePayload returns the size of st's state payload and a function that
// writes it.
func statePayload(st logState) (int, func(p []byte), error) {
	cs, err := proto.Marshal(raftpb.EnsureConfState(st.cs))
	if err != nil {
		return 0, nil, fmt.Errorf("marshal conf state: %w", err)
	}
	if len(cs) > maxConfStateSize {
		return 0, nil, fmt.Errorf("conf state of %d bytes above limit %d", len(cs), maxConfStateSize)
	}
	return stateFixedSize + len(cs), func(p []byte) {
		if st.reset {
			p[0] = stateFlagReset
		}
		binary.LittleEndian.PutUint64(p[8:16], st.snapIndex)
		binary.LittleEndian.PutUint64(p[16:24], st.snapTerm)
		putHardState(p[24:48], st.hs)
		binary.LittleEndian.PutUint32(p[48:52], uint32(len(cs)))
		copy(p[stateFixedSize:], cs)
	}, nil
}

func decodeStatePayload(p []byte) (logState, error) {
	if len(p) < stateFixedSize {
		return logState{}, fmt.Errorf("state payload of %d bytes, want >= %d", len(p), stateFixedSize)
	}
	if p[0]&^stateFlagReset != 0 {
		return logState{}, fmt.Errorf("unknown state flags %#x", p[0])
	}
	for _, c := range p[1:8] {
		if c != 0 {
			return logState{}, errors.New("reserved state bytes are not zero")
		}
	}
	if binary.LittleEndian.Uint32(p[52:56]) != 0 {
		return logState{}, errors.New("reserved state bytes are not zero")
	}
	n := int(binary.LittleEndian.Uint32(p[48:52]))
	if n != len(p)-stateFixedSize {
		return logState{}, fmt.Errorf("conf state length %d, payload holds %d", n, len(p)-stateFixedSize)
	}
	cs := &raftpb.ConfState{}
	if err := proto.Unmarshal(p[stateFixedSize:], cs); err != nil {
		return logState{}, fmt.Errorf("unmarshal conf state: %w", err)
	}
	return logState{
		reset:     p[0]&stateFlagReset != 0,
		snapIndex: binary.LittleEndian.Uint64(p[8:16]),
		snapTerm:  binary.LittleEndian.Uint64(p[16:24]),
		hs:        getHardState(p[24:48]),
		cs:        cs,
	}, nil
}

// batchPayloadSize is the payload size of a batch frame.
func batchPayloadSize(entries []*raftpb.Entry, withHS bool) int {
	n := batchFixedSize
	if withHS {
		n += hardStateSize
	}
	for _, e := range entries {
		n += entryFixedSize + len(e.GetData())
	}
	return n
}

// appendBatchFrame appends a batch frame holding entries and, if withHS, hs.
func appendBatchFrame(buf []byte, salt uint64, entries []*raftpb.Entry, withHS bool, hs hardState) []byte {
	return appendFrame(buf, salt, frameBatch, batchPayloadSize(entries, withHS), batchFill(entries, withHS, hs))
}

// batchFill returns a function that writes the batch payload of entries
// and, if withHS, hs.
func batchFill(entries []*raftpb.Entry, withHS bool, hs hardState) func(p []byte) {
	return func(p []byte) {
		binary.LittleEndian.PutUint32(p[0:4], uint32(len(entries)))
		off := batchFixedSize
		if withHS {
			p[4] = batchFlagHardState
			putHardState(p[off:off+hardStateSize], hs)
			off += hardStateSize
		}
		for _, e := range entries {
			binary.LittleEndian.PutUint64(p[off:], e.GetIndex())
			binary.LittleEndian.PutUint64(p[off+8:], e.GetTerm())
			binary.LittleEndian.PutUint32(p[off+16:], uint32(e.GetType()))
			binary.LittleEndian.PutUint32(p[off+20:], uint32(len(e.GetData())))
			off += entryFixedSize
			off += copy(p[off:], e.GetData())
		}
	}
}

// batch is a decoded batch frame. Entry data aliases the payload.
type batch struct {
	entries []*raftpb.Entry
	hasHS   bool
	hs      hardState
}

// decodeBatchPayload decodes a verified batch payload. Entries must be
// consecutive; their data aliases p. Every length is checked against the
// bytes left, so a bad payload cannot cause a large allocation: the entry
// slice is bounded by len(p)/entryFixedSize.
func decodeBatchPayload(p []byte) (batch, error) {
	if len(p) < batchFixedSize {
		return batch{}, fmt.Errorf("batch payload of %d bytes, want >= %d", len(p), batchFixedSize)
	}
	count := int64(binary.LittleEndian.Uint32(p[0:4]))
	flags := binary.LittleEndian.Uint32(p[4:8])
	if flags&^batchFlagHardState != 0 {
		return batch{}, fmt.Errorf("unknown batch flags %#x", flags)
	}
	var b batch
	off := batchFixedSize
	if flags&batchFlagHardState != 0 {
		if len(p)-off < hardStateSize {
			return batch{}, errors.New("batch hard state beyond payload")
		}
		b.hasHS = true
		b.hs = getHardState(p[off : off+hardStateSize])
		off += hardStateSize
	}
	if count > int64(len(p)-off)/entryFixedSize {
		return batch{}, fmt.Errorf("batch of %d entries cannot fit %d bytes", count, len(p)-off)
	}
	b.entries = make([]*raftpb.Entry, 0, count)
	for i := int64(0); i < count; i++ {
		if len(p)-off < entryFixedSize {
			return batch{}, fmt.Errorf("entry %d header beyond payload", i)
		}
		index := binary.LittleEndian.Uint64(p[off:])
		term := binary.LittleEndian.Uint64(p[off+8:])
		typ := raftpb.EntryType(int32(binary.LittleEndian.Uint32(p[off+16:])))
		n := int(binary.LittleEndian.Uint32(p[off+20:]))
		off += entryFixedSize
		if n > len(p)-off {
			return batch{}, fmt.Errorf("entry %d data of %d bytes beyond payload", index, n)
		}
		if i > 0 && index != b.entries[i-1].GetIndex()+1 {
			return batch{}, fmt.Errorf("entry index %d follows %d", index, b.entries[i-1].GetIndex())
		}
		e := &raftpb.Entry{Index: proto.Uint64(index), Term: proto.Uint64(term), Type: typ.Enum()}
		if n > 0 {
			e.Data = p[off : off+n : off+n]
		}
		off += n
		b.entries = append(b.entries, e)
	}
	if off != len(p) {
		return batch{}, fmt.Errorf("%d trailing bytes in batch payload", len(p)-off)
	}
	return b, nil
}

// stripe is the prefix of a stripe frame (format version 2): where the
// wrapped state or batch payload stands in the log-wide order of writes.
type stripe struct {
	// op is the log-wide sequence number of the write (Append, Compact,
	// ApplySnapshot) the frame belongs to.
	op uint64
	// part is the frame's position among the op's parts, parts their
	// number. parts == 0 marks a segment's opening state frame, which
	// belongs to no op and replays before op's parts.
	part, parts uint16
}

// appendStripeFrame appends a stripe frame wrapping a payload of type
// inner, of n bytes, written by fill.
func appendStripeFrame(buf []byte, salt uint64, s stripe, inner byte, n int, fill func(p []byte)) []byte {
	return appendFrame(buf, salt, frameStripe, stripeHeaderSize+n, func(p []byte) {
		binary.LittleEndian.PutUint64(p[0:8], s.op)
		binary.LittleEndian.PutUint16(p[8:10], s.part)
		binary.LittleEndian.PutUint16(p[10:12], s.parts)
		p[12] = inner
		fill(p[stripeHeaderSize:])
	})
}

// decodeStripe splits a verified stripe payload into its prefix, the
// wrapped type and the wrapped payload (aliasing p).
func decodeStripe(p []byte) (stripe, byte, []byte, error) {
	if len(p) < stripeHeaderSize {
		return stripe{}, 0, nil, fmt.Errorf("stripe payload of %d bytes, want >= %d", len(p), stripeHeaderSize)
	}
	s := stripe{
		op:    binary.LittleEndian.Uint64(p[0:8]),
		part:  binary.LittleEndian.Uint16(p[8:10]),
		parts: binary.LittleEndian.Uint16(p[10:12]),
	}
	inner := p[12]
	if p[13] != 0 || p[14] != 0 || p[15] != 0 {
		return stripe{}, 0, nil, errors.New("reserved stripe bytes are not zero")
	}
	switch {
	case inner != frameState && inner != frameBatch:
		return stripe{}, 0, nil, fmt.Errorf("stripe wraps frame type %d", inner)
	case s.parts == 0 && (inner != frameState || s.part != 0):
		return stripe{}, 0, nil, errors.New("opening stripe that is not a state frame")
	case s.parts != 0 && s.part >= s.parts:
		return stripe{}, 0, nil, fmt.Errorf("stripe part %d of %d", s.part, s.parts)
	}
	return s, inner, p[stripeHeaderSize:], nil
}
