package raftlog

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// SegmentInfo describes one segment file, for `strata inspect log` and
// metrics.
type SegmentInfo struct {
	Dir, Name string
	// FirstIndex and LastIndex are the lowest and highest entry indexes
	// written in the file (both 0 if it holds no entry). After a conflict
	// some of them may be superseded by a later segment.
	FirstIndex, LastIndex uint64
	Records               int   // frames in the file
	Bytes                 int64 // bytes of frames (the rest is preallocated zeros)
	// FileBytes is the file's length: for a segment, its preallocated size
	// (or more, if one write outgrew it).
	FileBytes int64
	// Compacted is true for a compacted batch file (docs/design.md, "The log format";
	// FORMAT.md, "Compacted batch files"). Records is then the number of
	// records its writer says its payload holds.
	Compacted bool
	// Commands is how many entries this file stands for (== entries
	// unless compacted).
	Commands uint64
	// SnapshotIndex is, for a segment, the highest snapshot point its
	// state frames record (the log's snapshot point is the highest over
	// all segments); for a batch file, 0.
	SnapshotIndex uint64
	// LiveCommands and LiveBytes count, for a segment, the entries above
	// the log's snapshot point and the bytes of the frames that hold at
	// least one of them: what raft and recovery still need from the file.
	// Entries at or below the snapshot point were truncated or log-compacted
	// into batch files, and are dead weight until the segment is deleted.
	// For a batch file they equal Commands and Bytes.
	LiveCommands uint64
	LiveBytes    int64
	// TornTail is non-empty if the last segment ends in a torn write that
	// Open would truncate.
	TornTail string
}

// frameSpan is what Inspect remembers of one batch frame until it knows the
// log's snapshot point: its entries (consecutive, FORMAT.md) and its size.
type frameSpan struct {
	first, last uint64
	bytes       int64
}

// Inspect describes every segment and compacted batch file in dirs, per
// directory: batch files in index order, then segments in sequence order
// (batch files stand for entries at or below the snapshot point, segments
// for the rest). It reads them the way recovery does but never modifies a
// file. Corruption is returned as an error wrapping ErrCorrupt, with the
// file and offset.
func Inspect(fs vfs.FS, dirs []string) ([]SegmentInfo, error) {
	var out []SegmentInfo
	var spans [][]frameSpan // per element of out; nil for batch files
	var snap uint64
	for _, dir := range dirs {
		names, _, err := listSegments(fs, dir)
		if err != nil {
			return nil, err
		}
		all, err := fs.List(dir)
		if err != nil {
			return nil, fmt.Errorf("list log dir %s: %w", dir, err)
		}
		var batches []SegmentInfo
		for _, name := range all {
			if _, _, ok := parseBatchFileName(name); !ok {
				continue
			}
			info, err := inspectBatchFile(fs, dir, name)
			if err != nil {
				return out, err
			}
			batches = append(batches, info)
		}
		slices.SortFunc(batches, func(a, b SegmentInfo) int { return cmp.Compare(a.FirstIndex, b.FirstIndex) })
		for _, b := range batches {
			out = append(out, b)
			spans = append(spans, nil)
		}
		for i, name := range names {
			info, fr, err := inspectSegment(fs, dir, name, i == len(names)-1)
			if err != nil {
				return out, err
			}
			snap = max(snap, info.SnapshotIndex)
			out = append(out, info)
			spans = append(spans, fr)
		}
	}
	for i := range out {
		if out[i].Compacted {
			continue
		}
		for _, f := range spans[i] {
			if f.last <= snap {
				continue
			}
			out[i].LiveBytes += f.bytes
			out[i].LiveCommands += f.last - max(f.first, snap+1) + 1
		}
	}
	return out, nil
}

func inspectBatchFile(fs vfs.FS, dir, name string) (SegmentInfo, error) {
	info := SegmentInfo{Dir: dir, Name: name, Compacted: true}
	b, err := ReadCompactedBatch(fs, fs.PathJoin(dir, name))
	if err != nil {
		return info, err
	}
	st, err := fs.Stat(fs.PathJoin(dir, name))
	if err != nil {
		return info, fmt.Errorf("stat %s: %w", name, err)
	}
	info.FirstIndex, info.LastIndex = b.FirstIndex, b.LastIndex
	info.Records, info.Bytes, info.Commands = int(b.Records), st.Size(), b.Commands()
	info.FileBytes, info.LiveBytes, info.LiveCommands = st.Size(), st.Size(), b.Commands()
	return info, nil
}

// inspectSegment describes one segment and returns the span of each of its
// batch frames, for counting what is live once the snapshot point is known.
func inspectSegment(fs vfs.FS, dir, name string, last bool) (SegmentInfo, []frameSpan, error) {
	info := SegmentInfo{Dir: dir, Name: name}
	f, err := fs.Open(fs.PathJoin(dir, name))
	if err != nil {
		return info, nil, fmt.Errorf("open segment %s: %w", name, err)
	}
	defer f.Close()
	var spans []frameSpan
	res, err := scanSegment(f, name, last, func(off int64, typ byte, payload []byte) error {
		size := int64(frameHeaderSize + padded(len(payload)))
		if typ == frameStripe {
			var err error
			if _, typ, payload, err = decodeStripe(payload); err != nil {
				return err
			}
		}
		if typ == frameState {
			st, err := decodeStatePayload(payload)
			info.SnapshotIndex = max(info.SnapshotIndex, st.snapIndex)
			return err
		}
		b, err := decodeBatchPayload(payload)
		if err != nil {
			return err
		}
		for _, e := range b.entries {
			idx := e.GetIndex()
			if info.FirstIndex == 0 || idx < info.FirstIndex {
				info.FirstIndex = idx
			}
			info.LastIndex = max(info.LastIndex, idx)
		}
		if n := len(b.entries); n > 0 {
			spans = append(spans, frameSpan{first: b.entries[0].GetIndex(), last: b.entries[n-1].GetIndex(), bytes: size})
		}
		info.Commands += uint64(len(b.entries))
		return nil
	})
	if err != nil {
		return info, nil, err
	}
	info.Records, info.Bytes, info.FileBytes = res.frames, res.end, res.size
	if res.dirtyEnd > res.end {
		info.TornTail = fmt.Sprintf("offset %d: %s", res.end, res.tornReason)
	}
	return info, spans, nil
}
