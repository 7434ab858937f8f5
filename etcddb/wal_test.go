package etcddb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// walWriter writes WAL files as etcd's encoder does (server/storage/wal:
// encoder.go, wal.go's Create and cut), for the tests.
type walWriter struct {
	crc  uint32
	file []byte
}

func (w *walWriter) frame(typ int64, data []byte, crcOnly bool) {
	var rec []byte
	rec = protowire.AppendTag(rec, 1, protowire.VarintType)
	rec = protowire.AppendVarint(rec, uint64(typ))
	if !crcOnly {
		w.crc = crc32.Update(w.crc, walCRCTable, data)
	}
	rec = protowire.AppendTag(rec, 2, protowire.VarintType)
	rec = protowire.AppendVarint(rec, uint64(w.crc))
	if data != nil {
		rec = protowire.AppendTag(rec, 3, protowire.BytesType)
		rec = protowire.AppendBytes(rec, data)
	}
	lenField := uint64(len(rec))
	pad := (8 - len(rec)%8) % 8
	if pad != 0 {
		lenField |= uint64(0x80|pad) << 56
	}
	w.file = binary.LittleEndian.AppendUint64(w.file, lenField)
	w.file = append(w.file, rec...)
	w.file = append(w.file, make([]byte, pad)...)
}

// start begins a file: the crc record, the metadata, then a snapshot
// record (the first file) or a state record (a cut).
func (w *walWriter) start(first bool, hs *raftpb.HardState) {
	w.file = nil
	w.frame(walCrcType, nil, true)
	var md []byte
	md = protowire.AppendTag(md, 1, protowire.VarintType)
	md = protowire.AppendVarint(md, 0xa1)
	md = protowire.AppendTag(md, 2, protowire.VarintType)
	md = protowire.AppendVarint(md, 0xc1)
	w.frame(walMetadataType, md, false)
	if first {
		w.frame(walSnapshotType, []byte{}, false)
	} else {
		w.state(hs)
	}
}

func (w *walWriter) entry(index, term uint64, data string) {
	e := &raftpb.Entry{Index: proto.Uint64(index), Term: proto.Uint64(term), Type: raftpb.EntryNormal.Enum(), Data: []byte(data)}
	raw, _ := proto.Marshal(e)
	w.frame(walEntryType, raw, false)
}

func (w *walWriter) state(hs *raftpb.HardState) {
	raw, _ := proto.Marshal(hs)
	w.frame(walStateType, raw, false)
}

func hardState(term, commit uint64) *raftpb.HardState {
	return &raftpb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(0xa1), Commit: proto.Uint64(commit)}
}

// writeWAL writes files (seq 0, 1, ...) into a new directory, each
// followed by zeros as etcd preallocates them.
func writeWAL(t *testing.T, files ...[]byte) string {
	t.Helper()
	dir := t.TempDir()
	for i, f := range files {
		name := filepath.Join(dir, fmt.Sprintf("%016x-%016x.wal", i, i*10))
		if err := os.WriteFile(name, append(f, make([]byte, 4096)...), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// sampleWAL is two files: entries 1-12 in term 2 (10-12 rewritten in
// term 3 in the second file), commit 11.
func sampleWAL() [][]byte {
	var w walWriter
	w.start(true, nil)
	for i := uint64(1); i <= 12; i++ {
		w.entry(i, 2, fmt.Sprintf("e%d", i))
	}
	w.state(hardState(2, 8))
	first := w.file
	w.start(false, hardState(2, 8))
	for i := uint64(10); i <= 12; i++ {
		w.entry(i, 3, fmt.Sprintf("f%d", i))
	}
	w.state(hardState(3, 11))
	return [][]byte{first, w.file}
}

func TestReadWAL(t *testing.T) {
	dir := writeWAL(t, sampleWAL()...)
	w, err := ReadWAL(dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	if w.NodeID != 0xa1 || w.ClusterID != 0xc1 || w.HardState.GetCommit() != 11 || w.FirstIndex != 1 || w.LastIndex != 12 || len(w.Files) != 2 || w.Torn {
		t.Fatalf("read %+v", w)
	}
	var got []string
	for _, e := range w.Entries {
		got = append(got, fmt.Sprintf("%d/%d:%s", e.GetIndex(), e.GetTerm(), e.GetData()))
	}
	if want := "[6/2:e6 7/2:e7 8/2:e8 9/2:e9 10/3:f10 11/3:f11 12/3:f12]"; fmt.Sprint(got) != want {
		t.Errorf("entries %v, want %s", got, want)
	}
	// The database holds everything: nothing to replay.
	if w, err := ReadWAL(dir, 12); err != nil || len(w.Entries) != 0 {
		t.Errorf("after 12: %v, %v", w, err)
	}
}

func TestReadWALTornTail(t *testing.T) {
	files := sampleWAL()
	var w walWriter
	w.start(true, nil)
	w.entry(1, 2, "e1")
	w.state(hardState(2, 1))
	whole := len(w.file)
	w.entry(2, 2, strings.Repeat("x", 2000))
	// The record's last sectors never reached the disk: zeros, as in a
	// preallocated file.
	torn := append(w.file[:whole+600:whole+600], make([]byte, len(w.file)-whole-600)...)
	got, err := ReadWAL(writeWAL(t, torn), 0)
	if err != nil || !got.Torn || got.LastIndex != 1 {
		t.Fatalf("torn tail: %+v, %v; want entry 1 and Torn", got, err)
	}
	// The same in a file that is not the last is corruption.
	if _, err := ReadWAL(writeWAL(t, torn, files[1]), 0); err == nil {
		t.Error("a torn record before the last file was accepted")
	}
}

func TestReadWALRefuses(t *testing.T) {
	files := sampleWAL()
	flip := func(b []byte, at int) []byte {
		c := append([]byte(nil), b...)
		c[at] ^= 0x40
		return c
	}
	for _, c := range []struct {
		name  string
		dir   func() string
		after uint64
		want  error
		says  string
	}{
		{name: "no directory", dir: func() string { return filepath.Join(t.TempDir(), "wal") }, want: ErrWALFileNotFound},
		{name: "no files", dir: func() string { return t.TempDir() }, want: ErrWALFileNotFound},
		{name: "crc of an entry", dir: func() string { return writeWAL(t, flip(files[0], len(files[0])-40), files[1]) }, want: ErrWALCRCMismatch},
		{name: "crc chain across files", dir: func() string { return writeWAL(t, files[0], flip(files[1], 12)) }, want: ErrWALCRCMismatch},
		{name: "truncated", dir: func() string { return writeWALRaw(t, files[0][:len(files[0])-5]) }, want: io.ErrUnexpectedEOF},
		{name: "text", dir: func() string { return writeWALRaw(t, []byte("hello, world, this is not a WAL\n")) }, want: ErrNotWAL},
		{name: "file missing", dir: func() string {
			d := writeWAL(t, files[0], files[1], files[1])
			if err := os.Remove(filepath.Join(d, fmt.Sprintf("%016x-%016x.wal", 1, 10))); err != nil {
				t.Fatal(err)
			}
			return d
		}, want: ErrWALSliceOutOfRange},
		{name: "older than the database", dir: func() string { return writeWAL(t, files...) }, after: 20, want: ErrWALShort, says: "ends at index 12"},
		{name: "starts after the database", dir: func() string {
			var w walWriter
			w.start(true, nil)
			for i := uint64(7); i <= 9; i++ {
				w.entry(i, 2, "e")
			}
			w.state(hardState(2, 9))
			return writeWAL(t, w.file)
		}, after: 3, want: ErrWALShort, says: "start at index 7"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadWAL(c.dir(), c.after)
			if !errors.Is(err, c.want) || !strings.Contains(fmt.Sprint(err), c.says) {
				t.Errorf("err %v, want %v saying %q", err, c.want, c.says)
			}
		})
	}
}

// writeWALRaw writes one file exactly as given (no preallocated zeros).
func writeWALRaw(t *testing.T, b []byte) string {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "0000000000000000-0000000000000000.wal"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// FuzzDecodeWAL feeds the decoder arbitrary files: it must return an
// error or entries that follow each other, and never panic.
func FuzzDecodeWAL(f *testing.F) {
	files := sampleWAL()
	f.Add(files[0], uint64(0))
	f.Add(files[1], uint64(9))
	f.Add(files[0][:40], uint64(0))
	f.Add([]byte("hello"), uint64(0))
	f.Fuzz(func(t *testing.T, raw []byte, after uint64) {
		d := newWALDecoder(after)
		if err := d.file("f.wal", raw, true); err != nil {
			return
		}
		w, err := d.finish()
		if err != nil {
			return
		}
		for i, e := range w.Entries {
			if e.GetIndex() != after+1+uint64(i) {
				t.Fatalf("entry %d at position %d after %d", e.GetIndex(), i, after)
			}
		}
	})
}
