package pebble

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// countingFS counts the Write calls that reach its files.
type countingFS struct {
	vfs.FS
	writes *int
}

func (fs countingFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil {
		return nil, err
	}
	return countingFile{File: f, writes: fs.writes}, nil
}

type countingFile struct {
	vfs.File
	writes *int
}

func (f countingFile) Write(p []byte) (int, error) {
	*f.writes++
	return f.File.Write(p)
}

// readAll reads name through a handle of its own, as a reader after a
// crash or another process would.
func readAll(t *testing.T, fs vfs.FS, name string) []byte {
	t.Helper()
	f, err := fs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestTableWriteFS(t *testing.T) {
	pattern := func(n, seed int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*7 + seed)
		}
		return b
	}
	for _, tc := range []struct {
		name  string
		file  string
		sizes []int // the writes, in order
		// maxWrites bounds the writes that reach the file; 0: as many as
		// were made (the file is not buffered).
		maxWrites int
	}{
		{name: "4 KiB writes gather", file: "000001.sst", sizes: repeat(4096, 1000), maxWrites: 4096*1000/writeBufferSize + 1},
		{name: "odd sizes keep their order", file: "000002.sst", sizes: []int{1, 4097, 10, writeBufferSize - 3, 5, 2 * writeBufferSize, 7}, maxWrites: 5},
		{name: "a write larger than the buffer goes straight through", file: "000003.sst", sizes: []int{3 * writeBufferSize}, maxWrites: 1},
		{name: "blob files gather", file: "000004.blob", sizes: repeat(1000, 300), maxWrites: 2},
		{name: "the MANIFEST is not buffered", file: "MANIFEST-000001", sizes: repeat(100, 20)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := vfs.NewMem()
			writes := 0
			fs := tableWriteFS{countingFS{FS: mem, writes: &writes}}
			f, err := fs.Create(tc.file, vfs.WriteCategoryUnspecified)
			if err != nil {
				t.Fatal(err)
			}
			var want []byte
			for i, n := range tc.sizes {
				p := pattern(n, i)
				want = append(want, p...)
				if _, err := f.Write(p); err != nil {
					t.Fatal(err)
				}
			}
			// Invariant 2: Stat and Sync see every accepted byte.
			st, err := f.Stat()
			if err != nil {
				t.Fatal(err)
			}
			if st.Size() != int64(len(want)) {
				t.Fatalf("Stat: size %d, want %d", st.Size(), len(want))
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, mem, tc.file); !bytes.Equal(got, want) {
				t.Fatalf("after Sync the file holds %d bytes, not the %d written in order", len(got), len(want))
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			limit := tc.maxWrites
			if limit == 0 {
				limit = len(tc.sizes)
				if writes != limit {
					t.Fatalf("%d writes reached the file, want each of the %d passed through", writes, limit)
				}
			} else if writes > limit {
				t.Fatalf("%d writes reached the file, want at most %d", writes, limit)
			}
		})
	}
}

func repeat(n, times int) []int {
	out := make([]int, times)
	for i := range out {
		out[i] = n
	}
	return out
}

// TestBufferedFileReadsAndClose: a read or a close of a table being
// written first writes out what is pending (invariant 2).
func TestBufferedFileReadsAndClose(t *testing.T) {
	mem := vfs.NewMem()
	fs := tableWriteFS{mem}
	f, err := fs.Create("000001.sst", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("hello, table")); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, mem, "000001.sst"); len(got) != 0 {
		t.Fatalf("before any flush the file holds %q; the write should still be pending", got)
	}
	p := make([]byte, 5)
	if _, err := f.ReadAt(p, 7); err != nil || string(p) != "table" {
		t.Fatalf("ReadAt = %q, %v; want %q", p, err, "table")
	}
	if _, err := f.Write([]byte("!")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, mem, "000001.sst"); string(got) != "hello, table!" {
		t.Fatalf("after Close the file holds %q", got)
	}
}

// failingFile fails every write after the first ok bytes, then writes
// what it is given once healed.
type failingFile struct {
	vfs.File
	ok     int
	healed bool
}

var errDiskFull = errors.New("no space left on device")

func (f *failingFile) Write(p []byte) (int, error) {
	if f.healed {
		return f.File.Write(p)
	}
	n := min(f.ok, len(p))
	f.ok -= n
	if _, err := f.File.Write(p[:n]); err != nil {
		return 0, err
	}
	if n < len(p) {
		return n, errDiskFull
	}
	return n, nil
}

// TestBufferedFileWriteError: a failed write-out is reported by the call
// that caused it, and the bytes it did not write stay pending, in order
// (invariant 3).
func TestBufferedFileWriteError(t *testing.T) {
	mem := vfs.NewMem()
	raw, err := mem.Create("000001.sst", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	ff := &failingFile{File: raw, ok: 10}
	f := &bufferedFile{File: ff}
	want := bytes.Repeat([]byte("abcdefghij"), 5)
	if _, err := f.Write(want); err != nil {
		t.Fatalf("a buffered write failed: %v", err)
	}
	if err := f.Sync(); !errors.Is(err, errDiskFull) {
		t.Fatalf("Sync = %v, want the write-out's error", err)
	}
	if got := len(f.pending); got != len(want)-10 {
		t.Fatalf("%d bytes pending after a write-out that wrote 10 of %d", got, len(want))
	}
	ff.healed = true
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, mem, "000001.sst"); !bytes.Equal(got, want) {
		t.Fatalf("file holds %q, want %q", got, want)
	}
}
