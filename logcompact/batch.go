package logcompact

import (
	"encoding/binary"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/raftlog"
)

// A Batch stands for the committed, applied entries [FirstIndex,
// LastIndex] of the raft log (docs/design.md, "The log format";
// FORMAT.md in this directory). Instead of the entries it holds, per key,
// the versions that recovery must rebuild -- each an idempotent "set the
// key to this state at this revision" or a deletion -- and, verbatim, the
// entries that cannot be merged (lease grants, revokes and checkpoints,
// revision compactions, member attributes). Records are in the order of
// the entries that produced them, so replaying them in order on a state at
// any index inside the batch yields the state at LastIndex.
//
// The raft log stores a Batch as the opaque payload of a compacted batch
// file (raftlog.CompactedBatch): EncodeBatch and DecodeBatch convert.

// The constants below are wire format (FORMAT.md).
const (
	// payloadFormat is the format of the payloads EncodeBatch writes.
	// Formats 1 and 2 are the layouts of the raft log's batch files of
	// versions 1 and 2, which older releases wrote (legacy.go).
	payloadFormat = 3
	// payloadHeaderSize: revision and compact revision.
	payloadHeaderSize = 16

	recordPutFixed    = 4 + 8*6 + 4 + 4 // kind word, index, main, sub, create, version, lease, key len, value len
	recordDeleteFixed = 4 + 8*3 + 4     // kind word, index, main, sub, key len
	recordEntryFixed  = 4 + 8*2 + 4 + 4 // kind word, index, term, entry type, data len
	// recordMinSize bounds the record count by the bytes before anything
	// is allocated: a kept entry with no data is the smallest record.
	recordMinSize = min(recordPutFixed, recordDeleteFixed, recordEntryFixed)
)

// ErrCorrupt reports a payload that does not decode. Any error of
// DecodeBatch wraps it, and raftlog.ErrCorrupt too, so callers that treat
// a damaged file as corruption need not know which layer found it.
var ErrCorrupt = fmt.Errorf("logcompact: corrupt batch payload: %w", raftlog.ErrCorrupt)

// RecordKind is the kind of a batch record.
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

// Record is one record of a batch.
type Record struct {
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

// Batch is a run of applied entries, compacted.
type Batch struct {
	// FirstIndex and LastIndex bound the entries the batch stands for.
	FirstIndex, LastIndex uint64
	// LastTerm is the term of the entry at LastIndex.
	LastTerm uint64
	// Revision is the store's revision after applying LastIndex.
	Revision int64
	// CompactRevision is the compact revision a store must have once it
	// has replayed the batch: the batch dropped versions superseded, in
	// the batch, by a version at or below it (the history horizon rule),
	// so reads below it would not see them. 0 if it dropped none; at most
	// Revision. UnknownCompactRevision for a batch read from a version 1
	// file, which did not record it.
	CompactRevision int64
	// Records, in the order of the entries that produced them.
	Records []Record
}

// UnknownCompactRevision is the CompactRevision of a batch read from a
// version 1 file.
const UnknownCompactRevision int64 = -1

// CompactRevisionAfter is the compact revision a store must have once it
// has replayed b: the one b records, or, for a batch read from a version 1
// file, which does not record it, the most the history horizon it may have
// been built with allows (min(horizon, b.Revision): the batch's revision
// with --history latest).
func (b *Batch) CompactRevisionAfter(horizon int64) int64 {
	if b.CompactRevision == UnknownCompactRevision {
		return min(horizon, b.Revision)
	}
	return b.CompactRevision
}

// EncodeBatch returns the compacted batch file the raft log stores for b:
// its index range and last term, and b as a payload of the current format.
// A batch read from a version 1 file (its compact revision unknown) is not
// encoded again: the log keeps that file as it is.
func EncodeBatch(b *Batch) (*raftlog.CompactedBatch, error) {
	switch {
	case b.LastIndex < b.FirstIndex || b.FirstIndex == 0:
		return nil, fmt.Errorf("logcompact: batch of indexes %d..%d", b.FirstIndex, b.LastIndex)
	case b.CompactRevision < 0 || b.CompactRevision > b.Revision:
		return nil, fmt.Errorf("logcompact: batch %d..%d: compact revision %d outside 0..%d",
			b.FirstIndex, b.LastIndex, b.CompactRevision, b.Revision)
	}
	buf := make([]byte, payloadHeaderSize, 4096)
	binary.LittleEndian.PutUint64(buf[0:8], uint64(b.Revision))
	binary.LittleEndian.PutUint64(buf[8:16], uint64(b.CompactRevision))
	buf, err := appendRecords(buf, b)
	if err != nil {
		return nil, err
	}
	return &raftlog.CompactedBatch{FirstIndex: b.FirstIndex, LastIndex: b.LastIndex, LastTerm: b.LastTerm,
		Records: uint64(len(b.Records)), PayloadFormat: payloadFormat, Payload: buf}, nil
}

// appendRecords appends b's records to buf in their wire layout, checking
// that their indexes lie in the batch and never decrease.
func appendRecords(buf []byte, b *Batch) ([]byte, error) {
	u64 := binary.LittleEndian.AppendUint64
	u32 := binary.LittleEndian.AppendUint32
	var prev uint64
	for i, r := range b.Records {
		if r.Index < b.FirstIndex || r.Index > b.LastIndex || r.Index < prev {
			return nil, fmt.Errorf("logcompact: batch record %d has index %d (batch %d..%d, previous %d)",
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
				return nil, fmt.Errorf("logcompact: batch record %d: entry index %d, record index %d", i, r.Entry.GetIndex(), r.Index)
			}
			buf = u32(buf, uint32(RecordEntry))
			buf = u64(buf, r.Index)
			buf = u64(buf, r.Entry.GetTerm())
			buf = u32(buf, uint32(r.Entry.GetType()))
			buf = u32(buf, uint32(len(r.Entry.GetData())))
			buf = append(buf, r.Entry.GetData()...)
		default:
			return nil, fmt.Errorf("logcompact: batch record %d of unknown kind %d", i, r.Kind)
		}
	}
	return buf, nil
}

// DecodeBatch decodes the payload of a compacted batch file: of the
// current format, or of an older release's file (payload formats 1 and
// 2, legacy.go). Any mismatch (a length beyond the bytes left, a record
// count the bytes cannot hold or that differs from the file's, a record
// out of order or outside the batch) is an error wrapping ErrCorrupt. Key,
// value and entry data alias the payload.
func DecodeBatch(cb *raftlog.CompactedBatch) (*Batch, error) {
	switch cb.PayloadFormat {
	case 1, 2:
		return decodeLegacy(cb)
	case payloadFormat:
	default:
		return nil, fmt.Errorf("%w: batch %d..%d: unknown payload format %d", ErrCorrupt, cb.FirstIndex, cb.LastIndex, cb.PayloadFormat)
	}
	p := cb.Payload
	if len(p) < payloadHeaderSize {
		return nil, fmt.Errorf("%w: batch %d..%d: payload of %d bytes", ErrCorrupt, cb.FirstIndex, cb.LastIndex, len(p))
	}
	b := &Batch{FirstIndex: cb.FirstIndex, LastIndex: cb.LastIndex, LastTerm: cb.LastTerm,
		Revision: int64(binary.LittleEndian.Uint64(p[0:8])), CompactRevision: int64(binary.LittleEndian.Uint64(p[8:16]))}
	if b.CompactRevision < 0 || b.CompactRevision > b.Revision {
		return nil, fmt.Errorf("%w: batch %d..%d: compact revision %d outside 0..%d",
			ErrCorrupt, b.FirstIndex, b.LastIndex, b.CompactRevision, b.Revision)
	}
	if err := decodeRecords(b, p[payloadHeaderSize:], cb.Records); err != nil {
		return nil, fmt.Errorf("%w: batch %d..%d: %w", ErrCorrupt, b.FirstIndex, b.LastIndex, err)
	}
	return b, nil
}

// decodeRecords decodes count records filling body exactly into b.
// Errors are the reason alone, for the caller to wrap in ErrCorrupt.
func decodeRecords(b *Batch, body []byte, count uint64) error {
	if count > uint64(len(body)/recordMinSize) {
		return fmt.Errorf("%d records cannot fit %d bytes", count, len(body))
	}
	b.Records = make([]Record, 0, count)
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
			return fmt.Errorf("record %d beyond the end", i)
		}
		var r Record
		switch kind := RecordKind(body[off]); {
		case body[off+1] != 0 || body[off+2] != 0 || body[off+3] != 0:
			return fmt.Errorf("record %d: reserved bytes are not zero", i)
		case kind == RecordPut:
			h, ok := take(recordPutFixed)
			if !ok {
				return fmt.Errorf("record %d header beyond the end", i)
			}
			r = Record{Kind: kind, Index: u64(h, 4), Main: int64(u64(h, 12)), Sub: int64(u64(h, 20)),
				CreateRevision: int64(u64(h, 28)), Version: int64(u64(h, 36)), Lease: int64(u64(h, 44))}
			k, ok1 := take(u32(h, 52))
			v, ok2 := take(u32(h, 56))
			if !ok1 || !ok2 {
				return fmt.Errorf("record %d key or value beyond the end", i)
			}
			r.Key, r.Value = k, v
		case kind == RecordDelete:
			h, ok := take(recordDeleteFixed)
			if !ok {
				return fmt.Errorf("record %d header beyond the end", i)
			}
			r = Record{Kind: kind, Index: u64(h, 4), Main: int64(u64(h, 12)), Sub: int64(u64(h, 20))}
			if r.Key, ok = take(u32(h, 28)); !ok {
				return fmt.Errorf("record %d key beyond the end", i)
			}
		case kind == RecordEntry:
			h, ok := take(recordEntryFixed)
			if !ok {
				return fmt.Errorf("record %d header beyond the end", i)
			}
			r = Record{Kind: kind, Index: u64(h, 4)}
			data, ok := take(u32(h, 24))
			if !ok {
				return fmt.Errorf("record %d data beyond the end", i)
			}
			r.Entry = &raftpb.Entry{Index: proto.Uint64(r.Index), Term: proto.Uint64(u64(h, 12)),
				Type: raftpb.EntryType(int32(binary.LittleEndian.Uint32(h[20:]))).Enum()}
			if len(data) > 0 {
				r.Entry.Data = data
			}
		default:
			return fmt.Errorf("record %d of unknown kind %d", i, kind)
		}
		if r.Index < b.FirstIndex || r.Index > b.LastIndex || r.Index < prev {
			return fmt.Errorf("record %d has index %d (batch %d..%d, previous %d)", i, r.Index, b.FirstIndex, b.LastIndex, prev)
		}
		prev = r.Index
		b.Records = append(b.Records, r)
	}
	if off != len(body) {
		return fmt.Errorf("%d bytes after the last record", len(body)-off)
	}
	return nil
}
