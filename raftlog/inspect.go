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
	// Compacted is true for a compacted batch file (DESIGN.md, "The log";
	// FORMAT.md, "Compacted batch files"). Records is then the number of
	// records it holds: key states, deletions and kept entries.
	Compacted bool
	// Commands is how many entries this file stands for (== entries
	// unless compacted).
	Commands uint64
	// TornTail is non-empty if the last segment ends in a torn write that
	// Open would truncate.
	TornTail string
}

// Inspect describes every segment and compacted batch file in dirs, per
// directory in sequence order, reading them the way recovery does but
// never modifying a file. Corruption is returned as an error wrapping
// ErrCorrupt, with the file and offset.
func Inspect(fs vfs.FS, dirs []string) ([]SegmentInfo, error) {
	var out []SegmentInfo
	for _, dir := range dirs {
		names, _, err := listSegments(fs, dir)
		if err != nil {
			return nil, err
		}
		all, err := fs.List(dir)
		if err != nil {
			return nil, fmt.Errorf("list log dir %s: %w", dir, err)
		}
		type file struct {
			seq   uint64
			name  string
			batch bool
		}
		var files []file
		for _, name := range names {
			seq, _, _ := parseSegmentName(name)
			files = append(files, file{seq: seq, name: name})
		}
		for _, name := range all {
			if seq, _, ok := parseBatchFileName(name); ok {
				files = append(files, file{seq: seq, name: name, batch: true})
			}
		}
		slices.SortFunc(files, func(a, b file) int { return cmp.Compare(a.seq, b.seq) })
		for _, f := range files {
			var info SegmentInfo
			if f.batch {
				info, err = inspectBatchFile(fs, dir, f.name)
			} else {
				info, err = inspectSegment(fs, dir, f.name, f.name == names[len(names)-1])
			}
			if err != nil {
				return out, err
			}
			out = append(out, info)
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
	info.Records, info.Bytes, info.Commands = len(b.Records), st.Size(), b.Commands()
	return info, nil
}

func inspectSegment(fs vfs.FS, dir, name string, last bool) (SegmentInfo, error) {
	info := SegmentInfo{Dir: dir, Name: name}
	f, err := fs.Open(fs.PathJoin(dir, name))
	if err != nil {
		return info, fmt.Errorf("open segment %s: %w", name, err)
	}
	defer f.Close()
	res, err := scanSegment(f, name, last, func(off int64, typ byte, payload []byte) error {
		if typ == frameStripe {
			var err error
			if _, typ, payload, err = decodeStripe(payload); err != nil {
				return err
			}
		}
		if typ == frameState {
			_, err := decodeStatePayload(payload)
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
		info.Commands += uint64(len(b.entries))
		return nil
	})
	if err != nil {
		return info, err
	}
	info.Records, info.Bytes = res.frames, res.end
	if res.dirtyEnd > res.end {
		info.TornTail = fmt.Sprintf("offset %d: %s", res.end, res.tornReason)
	}
	return info, nil
}
