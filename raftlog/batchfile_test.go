package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// sampleBatch stands for entries 10..19 with a payload the log does not
// read.
func sampleBatch() *CompactedBatch {
	return &CompactedBatch{FirstIndex: 10, LastIndex: 19, LastTerm: 3, Records: 4, PayloadFormat: 3,
		Payload: []byte("four records, in a format of the writer's")}
}

func sameBatch(t *testing.T, got, want *CompactedBatch) {
	t.Helper()
	if got.FirstIndex != want.FirstIndex || got.LastIndex != want.LastIndex || got.LastTerm != want.LastTerm ||
		got.Records != want.Records || got.PayloadFormat != want.PayloadFormat || !bytes.Equal(got.Payload, want.Payload) {
		t.Fatalf("batch %+v, want %+v", got, want)
	}
}

// checkDamageDetected: every single-byte change and every truncation of
// a batch file's bytes is ErrCorrupt.
func checkDamageDetected(t *testing.T, data []byte) {
	t.Helper()
	for i := range data {
		bad := bytes.Clone(data)
		bad[i] ^= 0x40
		if _, err := DecodeCompactedBatch(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d flipped: %v, want ErrCorrupt", i, err)
		}
	}
	for n := range len(data) {
		if _, err := DecodeCompactedBatch(data[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d: %v, want ErrCorrupt", n, err)
		}
	}
}

// TestCompactedBatchRoundTrip: a batch survives its encoding, its payload
// untouched; every damage is ErrCorrupt.
func TestCompactedBatchRoundTrip(t *testing.T) {
	empty := sampleBatch()
	empty.Payload, empty.Records = nil, 0
	for name, want := range map[string]*CompactedBatch{"payload": sampleBatch(), "empty payload": empty} {
		t.Run(name, func(t *testing.T) {
			data, err := EncodeCompactedBatch(want)
			if err != nil {
				t.Fatal(err)
			}
			if v := binary.LittleEndian.Uint32(data[8:12]); v != batchFileVersion {
				t.Fatalf("written as version %d, want %d", v, batchFileVersion)
			}
			got, err := DecodeCompactedBatch(data)
			if err != nil {
				t.Fatal(err)
			}
			sameBatch(t, got, want)
			if got.Commands() != 10 {
				t.Fatalf("Commands = %d, want 10", got.Commands())
			}
			checkDamageDetected(t, data)
		})
	}
}

func TestEncodeCompactedBatchRejects(t *testing.T) {
	v1, err := os.ReadFile(filepath.Join("testdata", "cbatch-v1", batchFileName(3, 10)))
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(b *CompactedBatch){
		"empty range":          func(b *CompactedBatch) { b.LastIndex = b.FirstIndex - 1 },
		"first index 0":        func(b *CompactedBatch) { b.FirstIndex = 0 },
		"payload format 0":     func(b *CompactedBatch) { b.PayloadFormat = 0 },
		"format 1, not a file": func(b *CompactedBatch) { b.PayloadFormat = 1 },
		"format 2, a version 1 file": func(b *CompactedBatch) {
			b.PayloadFormat, b.Payload = 2, v1
		},
		"format 1, a version 1 file of other indexes": func(b *CompactedBatch) {
			b.PayloadFormat, b.Payload, b.LastIndex = 1, v1, 20
		},
	} {
		b := sampleBatch()
		mutate(b)
		if _, err := EncodeCompactedBatch(b); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

// TestCompactedBatchFile writes a batch file next to segments and checks
// that Inspect reports it with the commands it stands for and the records
// it holds, and that the log itself still opens.
func TestCompactedBatchFile(t *testing.T) {
	fs := vfs.NewMem()
	l := openLog(t, fs, 0)
	mustAppend(t, l, ents(1, 3, 1), hs(1, 1, 3))
	_ = l.Close()
	name := batchFileName(0, 10)
	if err := WriteCompactedBatch(fs, testDir, name, sampleBatch()); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCompactedBatch(fs, fs.PathJoin(testDir, name))
	if err != nil {
		t.Fatal(err)
	}
	sameBatch(t, got, sampleBatch())
	infos, err := Inspect(fs, []string{testDir})
	if err != nil {
		t.Fatal(err)
	}
	if len(infos) != 2 || !infos[0].Compacted || infos[0].Commands != 10 || infos[0].Records != 4 ||
		infos[0].FirstIndex != 10 || infos[0].LastIndex != 19 || infos[1].Compacted || infos[1].Commands != 3 {
		t.Fatalf("Inspect = %+v", infos)
	}
	names, _ := fs.List(testDir)
	for _, n := range names {
		if filepath.Ext(n) == tempSuffix {
			t.Fatalf("temporary file %s left behind", n)
		}
	}
}

// TestGoldenCompactedBatch pins the versions of the compacted batch file:
// version 3 (written today: an opaque payload), and versions 1 and 2
// (written by older releases, whose layouts held the payload's fields in
// the header): these still read, as a batch of payload format 1 or 2
// whose payload is the whole file, and encode as that file again.
func TestGoldenCompactedBatch(t *testing.T) {
	path := func(dir string) string { return filepath.Join("testdata", dir, batchFileName(3, 10)) }
	t.Run("cbatch-v3", func(t *testing.T) {
		want, err := EncodeCompactedBatch(sampleBatch())
		if err != nil {
			t.Fatal(err)
		}
		if *update {
			if err := os.MkdirAll(filepath.Dir(path("cbatch-v3")), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path("cbatch-v3"), want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(path("cbatch-v3"))
		if err != nil {
			t.Fatalf("%v (run with -update to create)", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("the encoder no longer writes version 3 byte for byte")
		}
		b, err := DecodeCompactedBatch(got)
		if err != nil {
			t.Fatal(err)
		}
		sameBatch(t, b, sampleBatch())
	})
	for _, version := range []uint32{1, 2} {
		dir := fmt.Sprintf("cbatch-v%d", version)
		t.Run(dir, func(t *testing.T) {
			data, err := os.ReadFile(path(dir))
			if err != nil {
				t.Fatal(err)
			}
			b, err := DecodeCompactedBatch(data)
			if err != nil {
				t.Fatal(err)
			}
			sameBatch(t, b, &CompactedBatch{FirstIndex: 10, LastIndex: 19, LastTerm: 3, Records: 4,
				PayloadFormat: version, Payload: data})
			again, err := EncodeCompactedBatch(b)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(again, data) {
				t.Fatalf("a version %d batch no longer encodes as its file", version)
			}
			checkDamageDetected(t, data)
		})
	}
}

// FuzzDecodeCompactedBatch: the decoder never panics or over-allocates,
// and whatever it accepts re-encodes to the same bytes.
func FuzzDecodeCompactedBatch(f *testing.F) {
	data, _ := EncodeCompactedBatch(sampleBatch())
	f.Add(data)
	f.Add(data[:batchFileHeaderSize])
	for _, dir := range []string{"cbatch-v1", "cbatch-v2"} {
		if old, err := os.ReadFile(filepath.Join("testdata", dir, batchFileName(3, 10))); err == nil {
			f.Add(old)
		}
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := DecodeCompactedBatch(p)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again, err := EncodeCompactedBatch(b)
		if err != nil {
			t.Fatalf("decoded batch does not encode: %v", err)
		}
		if !bytes.Equal(again, p) {
			t.Fatal("decoded batch re-encodes differently")
		}
	})
}

// TestOpenBatchFileEveryVersion: the header that OpenCompactedBatches reads
// from each file (to send a lagging member its batches) is read whatever
// the file's version and however small its payload. A 56-byte read with an
// 80-byte minimum once refused version 1 and 2 files (64- and 72-byte
// headers) and version 3 files of under 8 payload bytes as corrupt, and the
// leader sent a full snapshot instead.
func TestOpenBatchFileEveryVersion(t *testing.T) {
	tiny := &CompactedBatch{FirstIndex: 5, LastIndex: 5, LastTerm: 2, Records: 1, PayloadFormat: 3, Payload: []byte{7}}
	tinyData, err := EncodeCompactedBatch(tiny)
	if err != nil {
		t.Fatal(err)
	}
	tinyPath := filepath.Join(t.TempDir(), batchFileName(5, 5))
	if err := os.WriteFile(tinyPath, tinyData, 0o644); err != nil {
		t.Fatal(err)
	}
	golden := func(dir string) string { return filepath.Join("testdata", dir, batchFileName(3, 10)) }
	for _, tc := range []struct {
		name        string
		path        string
		first, last uint64
	}{
		{"version 1", golden("cbatch-v1"), 10, 19},
		{"version 2", golden("cbatch-v2"), 10, 19},
		{"version 3", golden("cbatch-v3"), 10, 19},
		{"version 3, a one-byte payload", tinyPath, 5, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bf, err := openBatchFile(vfs.Default, tc.path)
			if err != nil {
				t.Fatalf("openBatchFile: %v", err)
			}
			defer bf.f.Close()
			if bf.First != tc.first || bf.Last != tc.last {
				t.Fatalf("openBatchFile read %d..%d, want %d..%d", bf.First, bf.Last, tc.first, tc.last)
			}
		})
	}
}
