package logcompact

import (
	"encoding/binary"
	"fmt"

	"github.com/strata-kv/strata/raftlog"
)

// Payload formats 1 and 2 are the raft log's compacted batch files of
// versions 1 and 2, which older releases wrote with the state machine's
// fields in the file's own layout (FORMAT.md, "Formats 1 and 2"). The log
// has checked such a file's checksums and hands it over whole; these
// offsets are where its fields are.
const (
	legacyRevisionOffset        = 48
	legacyCompactRevisionOffset = 56 // format 2 only
	legacyHeaderSizeV1          = 64
	legacyHeaderSizeV2          = 72
	legacyTrailerSize           = 16
)

// decodeLegacy decodes a batch file of version 1 or 2 (cb.Payload is the
// whole file). A version 1 batch did not record its compact revision:
// it reads as UnknownCompactRevision.
func decodeLegacy(cb *raftlog.CompactedBatch) (*Batch, error) {
	p := cb.Payload
	size := legacyHeaderSizeV1
	if cb.PayloadFormat == 2 {
		size = legacyHeaderSizeV2
	}
	if len(p) < size+legacyTrailerSize {
		return nil, fmt.Errorf("%w: batch %d..%d: a version %d file of %d bytes", ErrCorrupt, cb.FirstIndex, cb.LastIndex, cb.PayloadFormat, len(p))
	}
	b := &Batch{FirstIndex: cb.FirstIndex, LastIndex: cb.LastIndex, LastTerm: cb.LastTerm,
		Revision: int64(binary.LittleEndian.Uint64(p[legacyRevisionOffset:])), CompactRevision: UnknownCompactRevision}
	if cb.PayloadFormat == 2 {
		b.CompactRevision = int64(binary.LittleEndian.Uint64(p[legacyCompactRevisionOffset:]))
		if b.CompactRevision < 0 || b.CompactRevision > b.Revision {
			return nil, fmt.Errorf("%w: batch %d..%d: compact revision %d outside 0..%d",
				ErrCorrupt, b.FirstIndex, b.LastIndex, b.CompactRevision, b.Revision)
		}
	}
	if err := decodeRecords(b, p[size:len(p)-legacyTrailerSize], cb.Records); err != nil {
		return nil, fmt.Errorf("%w: batch %d..%d (version %d file): %w", ErrCorrupt, b.FirstIndex, b.LastIndex, cb.PayloadFormat, err)
	}
	return b, nil
}
