package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
)

const (
	segmentSuffix = ".log"
	tempSuffix    = ".tmp"
	// scanChunk is the read size when checking the space after the last
	// frame of a segment.
	scanChunk = 1 << 20
)

// segmentName is the file name of a segment: its sequence number and the
// index of the first entry it was created for, both as 16 hex digits, so
// that names sort by sequence.
func segmentName(seq, firstIndex uint64) string {
	return fmt.Sprintf("%016x-%016x%s", seq, firstIndex, segmentSuffix)
}

// parseSegmentName is the inverse of segmentName.
func parseSegmentName(name string) (seq, firstIndex uint64, ok bool) {
	base, found := strings.CutSuffix(name, segmentSuffix)
	if !found || len(base) != 33 || base[16] != '-' {
		return 0, 0, false
	}
	var a, b uint64
	if _, err := fmt.Sscanf(base, "%016x-%016x", &a, &b); err != nil || segmentName(a, b) != name {
		return 0, 0, false
	}
	return a, b, true
}

// listSegments returns the segment file names in dir in sequence order and
// the names of leftover temporary files.
func listSegments(fs vfs.FS, dir string) (segs []string, temps []string, err error) {
	names, err := fs.List(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("list log dir %s: %w", dir, err)
	}
	seqs := map[uint64]string{}
	for _, name := range names {
		if strings.HasSuffix(name, segmentSuffix+tempSuffix) {
			temps = append(temps, name)
			continue
		}
		if !strings.HasSuffix(name, segmentSuffix) {
			continue // not ours (the caller's lock file, for example)
		}
		seq, _, ok := parseSegmentName(name)
		if !ok {
			return nil, nil, fmt.Errorf("%w: unexpected file name %s in log dir %s", ErrCorrupt, name, dir)
		}
		if other, dup := seqs[seq]; dup {
			return nil, nil, fmt.Errorf("%w: segments %s and %s share sequence %d", ErrCorrupt, other, name, seq)
		}
		seqs[seq] = name
		segs = append(segs, name)
	}
	sort.Strings(segs)
	return segs, temps, nil
}

// segment is one open segment file.
//
// Concurrency: the immutable fields and f are safe from any goroutine
// (ReadAt is); the writer alone writes to f. The mutable fields are guarded
// by Log.mu. The file is closed when refs drops to zero: the Log holds one
// reference while the segment is in its list, each reader one while it
// reads, so a segment deleted by log compaction stays readable until its
// last reader is done.
type segment struct {
	dir, name string
	hdr       segmentHeader
	f         vfs.File
	refs      atomic.Int32
	// capacity is the file's preallocated size: the writer rolls to a new
	// segment rather than write past it (unless one frame is larger than
	// a whole segment). A segment reopened after Options.SegmentSize
	// changed keeps the size it was created with.
	capacity int64

	// Guarded by Log.mu.
	end       int64  // offset just past the last frame
	lastIndex uint64 // highest entry index written to this segment, 0 if none
	// firstOp, in a log with several directories, is the op of the
	// segment's opening state frame: every frame in it has an op at least
	// this, and below the next segment's of the same lane. Set before
	// the segment is listed, never changed.
	firstOp uint64
	// lastRewriteOp, in a log with several directories, is the highest op
	// of a write in the segment that replaced entries (an Append starting
	// at or below the last index) or reset the log (ApplySnapshot); 0 if
	// none. Replay of the other lanes depends on such a write being there
	// (Log.deleteSegments).
	lastRewriteOp uint64
	frames        int // frames in the segment
	entries       int // entry sub-records in the segment
}

func (s *segment) path(fs vfs.FS) string { return fs.PathJoin(s.dir, s.name) }

func (s *segment) acquire() { s.refs.Add(1) }

func (s *segment) release() {
	if s.refs.Add(-1) == 0 {
		_ = s.f.Close() // read-only use or already synced: nothing to lose
	}
}

// readFrame reads and verifies the frame at off and returns its header and
// payload. The payload is freshly allocated and owned by the caller.
func (s *segment) readFrame(off, size int64) (frameHeader, []byte, error) {
	var h [frameHeaderSize]byte
	if _, err := s.f.ReadAt(h[:], off); err != nil {
		return frameHeader{}, nil, fmt.Errorf("read frame header in %s at offset %d: %w", s.name, off, err)
	}
	fh, err := decodeFrameHeader(h[:], size-off)
	if err != nil {
		return frameHeader{}, nil, fmt.Errorf("%w: %s at offset %d: %v", ErrCorrupt, s.name, off, err)
	}
	frame := make([]byte, frameHeaderSize+padded(fh.payloadLen))
	if _, err := s.f.ReadAt(frame, off); err != nil {
		return frameHeader{}, nil, fmt.Errorf("read frame in %s at offset %d: %w", s.name, off, err)
	}
	if err := verifyFrame(s.hdr.salt, frame); err != nil {
		return frameHeader{}, nil, fmt.Errorf("%w: %s at offset %d: %v", ErrCorrupt, s.name, off, err)
	}
	return fh, frame[frameHeaderSize : frameHeaderSize+fh.payloadLen], nil
}

// newSalt returns a random non-zero salt.
func newSalt() uint64 {
	for {
		if s := rand.Uint64(); s != 0 {
			return s
		}
	}
}

// createSegment writes a new segment durably (docs/design.md, durability rule 7): header and
// first frames (built by first, given the new salt) at the start of a file
// zero-filled to size, so that later fdatasyncs need not touch metadata;
// the file synced, renamed to the segment name, and the directory synced.
//
// If spare names a prepared file (zero-filled to size and synced, see
// prepareSpare), only the first frames are written into it and synced,
// which costs one small write instead of writing the whole segment.
// Otherwise a temporary file is created and filled here.
//
// It returns the segment open for reading and writing.
func createSegment(fs vfs.FS, dir string, version uint32, seq, firstIndex uint64, size int64, spare string,
	first func(buf []byte, salt uint64) ([]byte, error)) (*segment, error) {
	hdr := segmentHeader{version: version, seq: seq, firstIndex: firstIndex, salt: newSalt()}
	buf := make([]byte, segmentHeaderSize, 4096)
	hdr.encode(buf)
	buf, err := first(buf, hdr.salt)
	if err != nil {
		return nil, err
	}
	name := segmentName(seq, firstIndex)
	path := fs.PathJoin(dir, name)
	tmp := spare
	if tmp == "" {
		tmp = path + tempSuffix
		err = writeNewFile(fs, tmp, buf, size)
	} else {
		err = overwriteSynced(fs, tmp, buf)
	}
	if err != nil {
		_ = fs.Remove(tmp)
		return nil, fmt.Errorf("create segment %s: %w", name, err)
	}
	if err := fs.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("rename segment %s: %w", name, err)
	}
	if err := syncDir(fs, dir); err != nil {
		return nil, fmt.Errorf("create segment %s: %w", name, err)
	}
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return nil, fmt.Errorf("open segment %s: %w", name, err)
	}
	s := &segment{dir: dir, name: name, hdr: hdr, f: f, end: int64(len(buf)), capacity: size}
	s.refs.Store(1)
	return s, nil
}

// spareName is the name of the n-th spare file prepared for future
// segments. It ends like a temporary segment, so Open deletes leftovers.
func spareName(n uint64) string {
	return fmt.Sprintf("spare-%016x%s%s", n, segmentSuffix, tempSuffix)
}

// overwriteSynced writes data at offset 0 of an existing, preallocated
// file and fdatasyncs it.
func overwriteSynced(fs vfs.FS, path string, data []byte) (err error) {
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err := f.WriteAt(data, 0); err != nil {
		return err
	}
	return f.SyncData()
}

// writeNewFile writes data at the start of a new file, preallocates and
// zero-fills it up to size, and syncs it (data and metadata).
func writeNewFile(fs vfs.FS, path string, data []byte, size int64) (err error) {
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	if size > int64(len(data)) {
		if err := f.Preallocate(0, size); err != nil {
			return fmt.Errorf("preallocate %d bytes: %w", size, err)
		}
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	zeros := make([]byte, min(scanChunk, max(size-int64(len(data)), 0)))
	for off := int64(len(data)); off < size; {
		n := min(int64(len(zeros)), size-off)
		if _, err := f.Write(zeros[:n]); err != nil {
			return fmt.Errorf("zero-fill: %w", err)
		}
		off += n
		// Start writeback chunk by chunk: a whole segment of dirty pages
		// would make the kernel throttle the log's own writes.
		if _, err := f.SyncTo(off); err != nil {
			return fmt.Errorf("zero-fill: %w", err)
		}
	}
	return f.Sync()
}

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("open dir %s: %w", dir, err)
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return d.Close()
}

// scanResult is what scanning one segment found.
type scanResult struct {
	hdr         segmentHeader
	size        int64 // file size
	end         int64 // offset just past the last good frame
	firstFrames int64 // offset just past the first frame (the segment's opening state)
	frames      int
	// dirtyEnd > end means non-zero bytes that are no frame lie in
	// [end, dirtyEnd): a torn tail.
	dirtyEnd int64
	// tornReason says why the frame at end was rejected, if dirtyEnd > end.
	tornReason string
}

// frameVisitor is called for every verified frame in order. payload is only
// valid during the call. An error stops the scan; it is returned wrapped
// with the file and offset as corruption.
type frameVisitor func(off int64, typ byte, payload []byte) error

// scanSegment reads and verifies every frame of the segment file at path.
//
// It stops at the first frame that does not verify and then checks the
// rest of the file: any later frame that verifies makes the segment
// corrupt (ErrCorrupt naming the file and the offset of the bad frame). In
// a sealed segment (last == false) any non-zero byte after the last frame
// is corruption too. In the last segment, non-zero bytes with no valid
// frame after them are a torn tail, reported in the result for the caller
// to truncate. scanSegment never writes.
func scanSegment(f vfs.File, name string, last bool, visit frameVisitor) (scanResult, error) {
	var r scanResult
	st, err := f.Stat()
	if err != nil {
		return r, fmt.Errorf("stat segment %s: %w", name, err)
	}
	r.size = st.Size()
	hb := make([]byte, segmentHeaderSize)
	if r.size < segmentHeaderSize {
		return r, fmt.Errorf("%w: segment %s is %d bytes, shorter than its header", ErrCorrupt, name, r.size)
	}
	if _, err := f.ReadAt(hb, 0); err != nil {
		return r, fmt.Errorf("read header of segment %s: %w", name, err)
	}
	if r.hdr, err = decodeSegmentHeader(hb); err != nil {
		return r, fmt.Errorf("%w: segment %s at offset 0: %v", ErrCorrupt, name, err)
	}
	seq, first, _ := parseSegmentName(name)
	if r.hdr.seq != seq || r.hdr.firstIndex != first {
		return r, fmt.Errorf("%w: segment %s at offset 0: header says sequence %d, first index %d",
			ErrCorrupt, name, r.hdr.seq, r.hdr.firstIndex)
	}

	rd := &chunkReader{f: f, size: r.size}
	off := int64(segmentHeaderSize)
	var bad error
	for off+frameHeaderSize <= r.size {
		h, err := rd.read(off, frameHeaderSize)
		if err != nil {
			return r, fmt.Errorf("read segment %s at offset %d: %w", name, off, err)
		}
		fh, herr := decodeFrameHeader(h, r.size-off)
		if herr != nil {
			bad = herr
			break
		}
		frame, err := rd.read(off, frameHeaderSize+padded(fh.payloadLen))
		if err != nil {
			return r, fmt.Errorf("read segment %s at offset %d: %w", name, off, err)
		}
		if verr := verifyFrame(r.hdr.salt, frame); verr != nil {
			bad = verr
			break
		}
		if err := visit(off, fh.typ, frame[frameHeaderSize:frameHeaderSize+fh.payloadLen]); err != nil {
			return r, fmt.Errorf("%w: %s at offset %d: %v", ErrCorrupt, name, off, err)
		}
		off += int64(len(frame))
		r.frames++
		if r.frames == 1 {
			r.firstFrames = off
		}
	}
	r.end = off
	if bad == nil {
		bad = errNoFrame
	}
	validAt, dirtyEnd, err := scanRest(f, r.hdr.salt, off, r.size)
	if err != nil {
		return r, fmt.Errorf("read segment %s after offset %d: %w", name, off, err)
	}
	switch {
	case validAt >= 0:
		return r, fmt.Errorf("%w: %s at offset %d: %v, yet a valid frame follows at offset %d",
			ErrCorrupt, name, off, bad, validAt)
	case dirtyEnd > off && !last:
		return r, fmt.Errorf("%w: sealed segment %s at offset %d: %v", ErrCorrupt, name, off, bad)
	case r.frames == 0:
		// Every segment opens with a state frame, written before it was
		// renamed into place: its absence is never a torn write.
		return r, fmt.Errorf("%w: segment %s at offset %d: no opening state frame: %v", ErrCorrupt, name, off, bad)
	}
	r.dirtyEnd = max(dirtyEnd, off)
	if r.dirtyEnd > off {
		r.tornReason = bad.Error()
	}
	return r, nil
}

// scanRest examines [from, size) of a segment after its last good frame.
// It returns the offset of the first aligned frame that verifies (-1 if
// none) and the end of the last non-zero 8-byte word (from if none).
func scanRest(f vfs.File, salt uint64, from, size int64) (validAt, dirtyEnd int64, err error) {
	validAt, dirtyEnd = -1, from
	buf := make([]byte, scanChunk)
	zeros := make([]byte, scanChunk)
	var h [frameHeaderSize]byte
	for base := from; base < size; base += scanChunk {
		n := int(min(scanChunk, size-base))
		if _, err := f.ReadAt(buf[:n], base); err != nil && !errors.Is(err, io.EOF) {
			return -1, 0, err
		}
		if bytes.Equal(buf[:n], zeros[:n]) {
			continue // the common case: preallocated space never written
		}
		for i := 0; i < n; i += 8 {
			var w uint64
			if i+8 <= n {
				w = binary.LittleEndian.Uint64(buf[i:])
			} else {
				for _, c := range buf[i:n] {
					w |= uint64(c)
				}
			}
			if w == 0 {
				continue
			}
			o := base + int64(i)
			dirtyEnd = min(o+8, size)
			if o == from || o+frameHeaderSize > size {
				continue // the frame at from was already rejected
			}
			if _, err := f.ReadAt(h[:], o); err != nil {
				return -1, 0, err
			}
			fh, herr := decodeFrameHeader(h[:], size-o)
			if herr != nil {
				continue
			}
			frame := make([]byte, frameHeaderSize+padded(fh.payloadLen))
			if _, err := f.ReadAt(frame, o); err != nil {
				return -1, 0, err
			}
			if verifyFrame(salt, frame) == nil {
				return o, dirtyEnd, nil
			}
		}
	}
	return validAt, dirtyEnd, nil
}

// chunkReader serves small reads of a file from a buffer refilled in large
// chunks, so that scanning a segment costs few system calls. A slice it
// returns is valid until the next call.
type chunkReader struct {
	f     vfs.File
	size  int64
	buf   []byte
	start int64
}

func (c *chunkReader) read(off int64, n int) ([]byte, error) {
	if off >= c.start && off+int64(n) <= c.start+int64(len(c.buf)) {
		return c.buf[off-c.start : off-c.start+int64(n)], nil
	}
	want := int(min(max(int64(n), scanChunk), c.size-off))
	if want < n {
		return nil, io.ErrUnexpectedEOF
	}
	if cap(c.buf) < want {
		c.buf = make([]byte, want)
	}
	c.buf = c.buf[:want]
	c.start = off
	if _, err := c.f.ReadAt(c.buf, off); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return c.buf[:n], nil
}
