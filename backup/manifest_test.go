package backup

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func sampleManifest() *Manifest {
	return &Manifest{
		Kind: KindFiles, Version: 3, Created: time.Date(2026, 11, 25, 8, 0, 0, 0, time.UTC), ClusterID: 0xc1, MemberID: 0xa1,
		RaftIndex: 120, RaftTerm: 2, ConfState: ConfState{Voters: []uint64{1, 2, 3}}, Revision: 99, CompactRevision: -1,
		Files: []File{
			{Name: "000005.sst", SHA256: strings.Repeat("ab", 32), Size: 1000},
			{Name: "MANIFEST-000001", SHA256: strings.Repeat("cd", 32), Size: 100},
		},
		NewFiles: 1, NewBytes: 100,
	}
}

func sampleLogManifest() *Manifest {
	return &Manifest{
		Kind: KindLog, Version: 5, Created: time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC), ClusterID: 0xc1, MemberID: 0xa1,
		RaftIndex: 200, RaftTerm: 2, Revision: 170, CompactRevision: -1,
		Base: 3, BaseIndex: 120,
		Log: []LogObject{
			{First: 100, Last: 150, SHA256: strings.Repeat("ef", 32), Size: 900},
			{First: 151, Last: 210, SHA256: strings.Repeat("01", 32), Size: 800},
		},
		NewFiles: 1, NewBytes: 800, EngineBytes: 5000,
	}
}

// TestManifestRoundTrip: what EncodeManifest writes, DecodeManifest reads
// back equal, and the object names sort as the versions do; a files
// version of Pebble is written as before log versions (format 1, no kind,
// no engine), a log version as format 2, a files version of another engine
// as format 3 naming it, with file names in a subdirectory.
func TestManifestRoundTrip(t *testing.T) {
	hybrid := withEngine(sampleManifest(), "hybridlog")
	hybrid.Files[0].Name = "stable/000001.data"
	for _, m := range []*Manifest{sampleManifest(), sampleLogManifest(), hybrid} {
		raw, err := EncodeManifest(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeManifest(raw)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := json.Marshal(m)
		b, _ := json.Marshal(got)
		if !bytes.Equal(a, b) {
			t.Errorf("round trip:\n%s\n%s", a, b)
		}
		wantFormat, wantKind, wantEngine := `{"format":1,`, false, false
		switch {
		case m.IsLog():
			wantFormat, wantKind = `{"format":2,`, true
		case m.Engine != "":
			wantFormat, wantEngine = `{"format":3,`, true
		}
		if !bytes.HasPrefix(raw, []byte(wantFormat)) || bytes.Contains(raw, []byte(`"kind"`)) != wantKind ||
			bytes.Contains(raw, []byte(`"engine"`)) != wantEngine {
			t.Errorf("a %s version of engine %q is written as %s", m.Kind, m.Engine, raw)
		}
	}
	if manifestName(9) >= manifestName(10) || manifestName(3) != "manifests/00000000000000000003.json" {
		t.Errorf("manifest names %s %s %s", manifestName(3), manifestName(9), manifestName(10))
	}
	for name, want := range map[string]uint64{manifestName(12): 12, "manifests/12.json": 0, "manifests/00000000000000000000.json": 0, "files/x": 0} {
		if v, _ := parseManifestName(name); v != want {
			t.Errorf("parseManifestName(%q) = %d, want %d", name, v, want)
		}
	}
}

// TestDecodeManifestRefuses: every damage the format guards against.
func TestDecodeManifestRefuses(t *testing.T) {
	good, err := EncodeManifest(sampleManifest())
	if err != nil {
		t.Fatal(err)
	}
	// reencode edits a good manifest and wraps it with a correct
	// checksum, so that the body's own checks are reached.
	reencode := func(edit func(m *Manifest)) []byte {
		m := sampleManifest()
		edit(m)
		body, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return mustEnvelope(t, body)
	}
	tests := []struct {
		name string
		raw  []byte
		want string
	}{
		{name: "not JSON", raw: []byte("{"), want: "envelope"},
		{name: "flipped body byte", raw: bytes.Replace(good, []byte(`"revision":99`), []byte(`"revision":98`), 1), want: "checksum mismatch"},
		{name: "other format", raw: bytes.Replace(good, []byte(`"format":1`), []byte(`"format":2`), 1), want: "format 2"},
		{name: "path up in a file name", raw: reencode(func(m *Manifest) { m.Files[0].Name = "../x" }), want: "not a relative path"},
		{name: "path up inside a file name", raw: reencode(func(m *Manifest) { m.Files[0].Name = "stable/../../x" }), want: "not a relative path"},
		{name: "absolute file name", raw: reencode(func(m *Manifest) { m.Files[0].Name = "/etc/passwd" }), want: "not a relative path"},
		{name: "empty part in a file name", raw: reencode(func(m *Manifest) { m.Files[0].Name = "stable//x" }), want: "not a relative path"},
		{name: "dot part in a file name", raw: reencode(func(m *Manifest) { m.Files[0].Name = "stable/./x" }), want: "not a relative path"},
		{name: "backslash in a file name", raw: reencode(func(m *Manifest) { m.Files[0].Name = `..\x` }), want: "not a relative path"},
		{name: "dot file name", raw: reencode(func(m *Manifest) { m.Files[0].Name = ".." }), want: "not a relative path"},
		{name: "empty file name", raw: reencode(func(m *Manifest) { m.Files[0].Name = "" }), want: "not a relative path"},
		{name: "unknown format", raw: bytes.Replace(good, []byte(`"format":1`), []byte(`"format":4`), 1), want: "format 4"},
		{name: "engine in format 1", raw: reencode(func(m *Manifest) { m.Engine = "bbolt" }), want: `engine "bbolt"`},
		{name: "Pebble in format 3", raw: reencodeFormat(t, FormatEngine, withEngine(sampleManifest(), "pebble")), want: `format 3 with kind "files" and engine "pebble"`},
		{name: "unknown engine in format 3", raw: reencodeFormat(t, FormatEngine, withEngine(sampleManifest(), "rocksdb")), want: `engine "rocksdb"`},
		{name: "no engine in format 3", raw: reencodeFormat(t, FormatEngine, sampleManifest()), want: `format 3 with kind "files" and engine ""`},
		{name: "duplicate file name", raw: reencode(func(m *Manifest) { m.Files[1].Name = m.Files[0].Name }), want: "named twice"},
		{name: "short hash", raw: reencode(func(m *Manifest) { m.Files[0].SHA256 = "ab" }), want: "64 lowercase hex"},
		{name: "upper-case hash", raw: reencode(func(m *Manifest) { m.Files[0].SHA256 = strings.Repeat("AB", 32) }), want: "64 lowercase hex"},
		{name: "negative size", raw: reencode(func(m *Manifest) { m.Files[0].Size = -1 }), want: "size -1"},
		{name: "version 0", raw: reencode(func(m *Manifest) { m.Version = 0 }), want: "version 0"},
		{name: "no files", raw: reencode(func(m *Manifest) { m.Files = nil }), want: "no files"},
		{name: "more new than all", raw: reencode(func(m *Manifest) { m.NewFiles = 3 }), want: "exceed"},
		{name: "unknown field", raw: mustEnvelope(t, []byte(`{"version":1,"files":[{"name":"a","sha256":"`+strings.Repeat("ab", 32)+`","size":1}],"extra":1}`)), want: "unknown field"},
		{name: "too large", raw: bytes.Repeat([]byte(" "), maxManifestBytes+1), want: "above the limit"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeManifest(tc.raw)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("DecodeManifest = %v, want ErrCorrupt saying %q", err, tc.want)
			}
		})
	}
	// A log version's checks.
	relog := func(format int, edit func(m *Manifest)) []byte {
		m := sampleLogManifest()
		edit(m)
		body, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := json.Marshal(envelope{Format: format, SHA256: sha256Hex(body), Body: body})
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	none := func(*Manifest) {}
	logTests := []struct {
		name string
		raw  []byte
		want string
	}{
		{"log kind in format 1", relog(Format, none), `format 1 with kind "log"`},
		{"files kind in format 2", reencodeFormat(t, FormatLog, sampleManifest()), `format 2 with kind "files"`},
		{"log kind in format 3", relog(FormatEngine, func(m *Manifest) { m.Engine = "bbolt" }), `format 3 with kind "log"`},
		{"engine in a log version", relog(FormatLog, func(m *Manifest) { m.Engine = "bbolt" }), `format 2 with kind "log" and engine "bbolt"`},
		{"log version with files", relog(FormatLog, func(m *Manifest) { m.Files = sampleManifest().Files }), "names engine files"},
		{"files version with a base", reencode(func(m *Manifest) { m.Base = 1 }), "names a base"},
		{"base not before it", relog(FormatLog, func(m *Manifest) { m.Base = 5 }), "base version 5"},
		{"no base", relog(FormatLog, func(m *Manifest) { m.Base = 0 }), "base version 0"},
		{"first object after the base", relog(FormatLog, func(m *Manifest) { m.Log[0].First = 122 }), "does not continue from index 121"},
		{"gap between objects", relog(FormatLog, func(m *Manifest) { m.Log[1].First = 152 }), "does not continue from index 151"},
		{"objects end early", relog(FormatLog, func(m *Manifest) { m.Log[1].Last = 199 }), "before the version's 200"},
		{"object past the index, more follow", relog(FormatLog, func(m *Manifest) {
			m.Log[0].Last, m.Log[1].First = 200, 201
		}), "yet more follow"},
		{"no entry yet objects", relog(FormatLog, func(m *Manifest) { m.RaftIndex = 120 }), "no entry after its base"},
		{"index below the base", relog(FormatLog, func(m *Manifest) { m.RaftIndex = 100 }), "below its base"},
		{"bad object hash", relog(FormatLog, func(m *Manifest) { m.Log[1].SHA256 = "x" }), "64 lowercase hex"},
		{"empty object", relog(FormatLog, func(m *Manifest) { m.Log[1].Size = 0 }), "size 0"},
		{"more new than named", relog(FormatLog, func(m *Manifest) { m.NewBytes = 2000 }), "exceed"},
	}
	for _, tc := range logTests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeManifest(tc.raw)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("DecodeManifest = %v, want ErrCorrupt saying %q", err, tc.want)
			}
		})
	}
	if _, err := EncodeManifest(&Manifest{Version: 1}); !errors.Is(err, ErrCorrupt) {
		t.Errorf("EncodeManifest of a manifest without files = %v, want a refusal", err)
	}
}

// withEngine returns m naming engine.
func withEngine(m *Manifest, engine string) *Manifest {
	m.Engine = engine
	return m
}

// reencodeFormat writes m's body, kind included, in an envelope of format.
func reencodeFormat(t *testing.T, format int, m *Manifest) []byte {
	t.Helper()
	body, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(envelope{Format: format, SHA256: sha256Hex(body), Body: body})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// mustEnvelope wraps body in an envelope with its correct checksum.
func mustEnvelope(t testing.TB, body []byte) []byte {
	t.Helper()
	sum := sha256Hex(body)
	raw, err := json.Marshal(envelope{Format: Format, SHA256: sum, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// FuzzDecodeManifest: no input panics the decoder; whatever it accepts
// encodes again and decodes to the same manifest.
func FuzzDecodeManifest(f *testing.F) {
	good, err := EncodeManifest(sampleManifest())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	goodLog, err := EncodeManifest(sampleLogManifest())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(goodLog)
	f.Add([]byte(`{"format":1,"sha256":"","body":{}}`))
	f.Add(mustEnvelope(f, []byte(`{"version":1,"files":[{"name":"a","sha256":"`+strings.Repeat("0", 64)+`","size":0}]}`)))
	f.Fuzz(func(t *testing.T, raw []byte) {
		m, err := DecodeManifest(raw)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		again, err := EncodeManifest(m)
		if err != nil {
			t.Fatalf("accepted manifest does not encode: %v", err)
		}
		m2, err := DecodeManifest(again)
		if err != nil {
			t.Fatalf("re-encoded manifest does not decode: %v", err)
		}
		a, _ := json.Marshal(m)
		b, _ := json.Marshal(m2)
		if !bytes.Equal(a, b) {
			t.Fatalf("round trip changed the manifest:\n%s\n%s", a, b)
		}
	})
}
