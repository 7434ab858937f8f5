package raftlog

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// ReadEntries returns every entry still present in the segments of the
// single-directory log in dir, and the last HardState they record, for
// `strata inspect log --entries` (tools that rebuild a member's history,
// such as the robustness harness in tools/robustness). Unlike Open it keeps
// the entries at or below the snapshot point that the files still hold: a
// segment is deleted only when all of its entries are (FORMAT.md, rule 3 of
// Log), so what it returns starts at the first index of the oldest segment.
// Frames are replayed in sequence order with raft's conflict resolution: a
// batch starting at index i replaces every entry at or after i, and one that
// starts beyond the last entry + 1 (after older segments were deleted)
// discards what came before. Compacted batch files are not read (their
// records are key states, not entries). It never modifies a file; a torn
// tail in the last segment ends the scan as it would in Open.
func ReadEntries(fs vfs.FS, dir string) (*raftpb.HardState, []*raftpb.Entry, error) {
	names, _, err := listSegments(fs, dir)
	if err != nil {
		return nil, nil, err
	}
	hs := hardState{}
	var ents []*raftpb.Entry
	for i, name := range names {
		f, err := fs.Open(fs.PathJoin(dir, name))
		if err != nil {
			return nil, nil, fmt.Errorf("open segment %s: %w", name, err)
		}
		_, err = scanSegment(f, name, i == len(names)-1, func(_ int64, typ byte, payload []byte) error {
			switch typ {
			case frameStripe:
				return errors.New("a striped log (several --log-dir): ReadEntries reads one directory")
			case frameState:
				st, err := decodeStatePayload(payload)
				if err != nil {
					return err
				}
				hs = st.hs
				return nil
			}
			b, err := decodeBatchPayload(payload)
			if err != nil {
				return err
			}
			if b.hasHS {
				hs = b.hs
			}
			if len(b.entries) == 0 {
				return nil
			}
			first := b.entries[0].GetIndex()
			switch {
			case len(ents) == 0:
			case first > ents[len(ents)-1].GetIndex()+1:
				ents = ents[:0]
			case first <= ents[0].GetIndex():
				ents = ents[:0]
			default:
				ents = ents[:first-ents[0].GetIndex()]
			}
			for _, e := range b.entries {
				e := &raftpb.Entry{Index: proto.Uint64(e.GetIndex()), Term: proto.Uint64(e.GetTerm()), Type: e.GetType().Enum(), Data: slices.Clone(e.GetData())}
				ents = append(ents, e)
			}
			return nil
		})
		f.Close()
		if err != nil {
			return nil, nil, err
		}
	}
	return hs.proto(), ents, nil
}
