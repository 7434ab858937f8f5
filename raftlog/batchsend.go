package raftlog

import (
	"errors"
	"fmt"
	"io"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Sending compacted batches to a member that is behind (docs/log-compaction.md,
// "Incremental snapshots"): the leader streams the batch files that cover
// the member's gap instead of its whole engine. The files must outlive the
// transfer, but log truncation (Compact) deletes them once the engine
// holds their entries durably, at any time. OpenCompactedBatches therefore
// opens them under the writer mutex, which Compact also holds while it
// deletes: a file opened here stays readable until it is closed, whether
// or not it is deleted meanwhile (POSIX unlink semantics; pebble's MemFS
// behaves the same).

// BatchFile is an open compacted batch file, as its bytes are on disk
// (FORMAT.md, "Compacted batch files"), with what its header says.
//
// Concurrency: one goroutine reads a BatchFile at a time.
type BatchFile struct {
	// First and Last are the indexes the batch stands for; LastTerm is
	// the term of the entry at Last.
	First, Last, LastTerm uint64
	// Size is the file's length in bytes.
	Size int64
	f    vfs.File
}

// Reader returns a reader of the file's bytes from the start. Each call
// starts again at offset 0.
func (b *BatchFile) Reader() io.Reader { return io.NewSectionReader(b.f, 0, b.Size) }

// Close releases the file.
func (b *BatchFile) Close() error { return b.f.Close() }

// CloseBatchFiles closes every file of files.
func CloseBatchFiles(files []*BatchFile) {
	for _, f := range files {
		_ = f.Close()
	}
}

// OpenCompactedBatches opens the compacted batch files whose last index is
// above after, oldest first, and returns them with the log's snapshot
// index at that instant. The files are consecutive and, when there are
// any, the last one ends at that snapshot index (log compaction moves the
// snapshot point to the end of each batch it writes, and Compact deletes
// every batch at or below a later point). The caller closes the files
// (CloseBatchFiles).
func (l *Log) OpenCompactedBatches(after uint64) (snapIndex uint64, files []*BatchFile, err error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.RLock()
	closed := l.mu.closed
	snapIndex = l.mu.mem.snapIndex
	l.mu.RUnlock()
	if closed {
		return 0, nil, ErrClosed
	}
	defer func() {
		if err != nil {
			CloseBatchFiles(files)
			files = nil
		}
	}()
	for _, bi := range l.w.batches {
		if bi.last <= after {
			continue
		}
		bf, err := openBatchFile(l.fs, l.fs.PathJoin(bi.dir, bi.name))
		if err != nil {
			return 0, files, err
		}
		files = append(files, bf)
		if bf.First != bi.first || bf.Last != bi.last {
			return 0, files, fmt.Errorf("%w: compacted batch %s holds %d..%d, the log lists it as %d..%d",
				ErrCorrupt, bi.name, bf.First, bf.Last, bi.first, bi.last)
		}
	}
	return snapIndex, files, nil
}

// openBatchFile opens a compacted batch file and reads its header (checked;
// the body is checked by whoever decodes it).
func openBatchFile(fs vfs.FS, path string) (*BatchFile, error) {
	f, err := fs.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open compacted batch %s: %w", path, err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("stat compacted batch %s: %w", path, err)
	}
	// The largest header of any version (2's); the smallest whole file is
	// version 3's header and trailer around an empty payload.
	var buf [batchFileHeaderSizeV2]byte
	if st.Size() < batchFileHeaderSize+batchTrailerSize {
		_ = f.Close()
		return nil, fmt.Errorf("%w: compacted batch %s is %d bytes", ErrCorrupt, path, st.Size())
	}
	n, err := f.ReadAt(buf[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		_ = f.Close()
		return nil, fmt.Errorf("read compacted batch %s: %w", path, err)
	}
	h, err := decodeBatchHeader(buf[:n])
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%w: compacted batch %s: bad header: %v", ErrCorrupt, path, err)
	}
	return &BatchFile{
		First:    h.batch.FirstIndex,
		Last:     h.batch.LastIndex,
		LastTerm: h.batch.LastTerm,
		Size:     st.Size(),
		f:        f,
	}, nil
}
