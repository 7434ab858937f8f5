package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/strata-kv/strata/internal/testutil"
)

// segment is one log segment as `strata inspect log --json` describes it.
type segment struct {
	path        string
	first, last uint64
	bytes       int64  // bytes of records; 0 if inspect did not say
	tornTail    string // inspect's description of a torn tail, if any
}

// inspectLog runs `strata inspect log --data-dir dir --json` and returns
// the segments in the order printed (ascending index).
func inspectLog(t *testing.T, dataDir string) []segment {
	t.Helper()
	res := testutil.RunToExit(t, 30*time.Second, "", nil, binary(t, strata), "inspect", "log", "--data-dir", dataDir, "--json")
	if res.Code != 0 {
		t.Fatalf("strata inspect log: exit %d\nstdout:\n%s\nstderr:\n%s", res.Code, res.Stdout, res.Stderr)
	}
	segs, err := parseSegments([]byte(res.Stdout), dataDir)
	if err != nil {
		t.Fatalf("strata inspect log --json: %v\n%s", err, res.Stdout)
	}
	t.Logf("log segments: %+v", segs)
	return segs
}

// parseSegments decodes the output of `strata inspect log --json`.
//
// It is deliberately lenient about the JSON's shape: a list of objects, or
// an object holding one, with the file as "path"/"file" or "dir"+"name",
// and index and size fields matched case-insensitively with or without
// underscores (FirstIndex, first_index, ...). What it needs is only where
// each segment is and how many bytes of records it holds. Relative paths
// are taken relative to dataDir unless they exist as given.
func parseSegments(out []byte, dataDir string) ([]segment, error) {
	var doc any
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	list, ok := doc.([]any)
	if obj, isObj := doc.(map[string]any); isObj {
		for _, v := range obj {
			if l, isList := v.([]any); isList {
				list, ok = l, true
				break
			}
		}
	}
	if !ok {
		return nil, fmt.Errorf("no list of segments")
	}
	var segs []segment
	for _, item := range list {
		obj, _ := item.(map[string]any)
		fields := map[string]any{}
		for k, v := range obj {
			fields[strings.ToLower(strings.ReplaceAll(k, "_", ""))] = v
		}
		str := func(names ...string) string {
			for _, n := range names {
				if s, ok := fields[n].(string); ok && s != "" {
					return s
				}
			}
			return ""
		}
		num := func(names ...string) float64 {
			for _, n := range names {
				if f, ok := fields[n].(float64); ok {
					return f
				}
			}
			return 0
		}
		path := str("path", "file", "filename")
		if name := str("name"); path == "" && name != "" {
			path = filepath.Join(str("dir", "directory"), name)
		}
		if path == "" {
			return nil, fmt.Errorf("segment %v names no file", obj)
		}
		if !filepath.IsAbs(path) {
			if _, err := os.Stat(path); err != nil {
				path = filepath.Join(dataDir, path)
			}
		}
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("the file of segment %v: %w", obj, err)
		}
		segs = append(segs, segment{
			path:     path,
			first:    uint64(num("firstindex", "first")),
			last:     uint64(num("lastindex", "last")),
			bytes:    int64(num("bytes", "size")),
			tornTail: str("torntail"),
		})
	}
	if len(segs) == 0 {
		return nil, fmt.Errorf("no segments")
	}
	return segs, nil
}

// dataEnd is where a segment's records end: the byte count inspect
// reports if it is inside the file (the rest is preallocated space),
// else the file's size.
func dataEnd(t *testing.T, s segment) int64 {
	t.Helper()
	fi, err := os.Stat(s.path)
	if err != nil {
		t.Fatal(err)
	}
	if s.bytes > 0 && s.bytes < fi.Size() {
		return s.bytes
	}
	return fi.Size()
}

// putAll puts keys log/000... with values tagged by round and records the
// acknowledged puts in h.
func putAll(t *testing.T, p *testutil.Process, round string, n int, h *history) {
	t.Helper()
	cli := p.Client(t)
	for i := range n {
		k, v := fmt.Sprintf("log/%03d", i), fmt.Sprintf("%s-%03d", round, i)
		ctxPut(t, cli, k, v, h)
	}
}

// TestLogTornTail damages the tail of the last log segment after a
// SIGKILL: the server must start, keep every acknowledged put, and say in
// its log that it truncated a torn tail.
func TestLogTornTail(t *testing.T) {
	t.Parallel()
	p := start(t, strata)
	h := &history{}
	putAll(t, p, "before", 50, h)
	p.Kill()

	segs := inspectLog(t, p.DataDir())
	last := segs[len(segs)-1]
	end := dataEnd(t, last)
	garbage := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef, 0x5a, 0xa5, 0x13, 0x37}, 16)
	f, err := os.OpenFile(last.path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("open last segment: %v", err)
	}
	if _, err := f.WriteAt(garbage, end); err != nil {
		t.Fatalf("write garbage at %s:%d: %v", last.path, end, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d garbage bytes at %s offset %d", len(garbage), last.path, end)

	damaged := inspectLog(t, p.DataDir())
	if tail := damaged[len(damaged)-1]; tail.tornTail == "" {
		t.Errorf("strata inspect log does not report the torn tail of %s", tail.path)
	}

	p.Restart()
	// The test's temp dir is named after the test and so contains
	// "TornTail": match the log with the data dir's path taken out.
	out := strings.ReplaceAll(p.CurrentOutput(), p.DataDir(), "<data-dir>")
	if line := regexp.MustCompile(`(?i).*(torn[ -]tail|truncat).*`).FindString(out); line != "" {
		t.Logf("restart logged: %s", line)
	} else {
		t.Errorf("restart after a garbage tail did not log a torn-tail truncation; its output:\n%s", out)
	}
	verify(t, p.Client(t), h, nil)
	// The log goes on after the truncated tail: new writes are durable too.
	putAll(t, p, "after", 20, h)
	p.Kill()
	p.Restart()
	verify(t, p.Client(t), h, nil)
}

// TestLogCorruptMiddle flips one byte inside a record in the middle of the
// log (in a sealed segment if there is one): start-up must fail and name
// the file and the offset, never skip the record silently.
func TestLogCorruptMiddle(t *testing.T) {
	t.Parallel()
	p := start(t, strata)
	h := &history{}
	putAll(t, p, "early", 100, h)
	marker := "MIDDLE-MARKER-0123456789abcdef"
	ctxPut(t, p.Client(t), "log/marker", marker, h)
	putAll(t, p, "late", 100, h)
	p.Kill()

	segs := inspectLog(t, p.DataDir())
	// Prefer a sealed segment; with a single segment, the marker's record
	// still has a hundred valid records after it.
	var target segment
	var off int64 = -1
	for _, s := range segs {
		data, err := os.ReadFile(s.path)
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.Index(data, []byte(marker)); i >= 0 {
			target, off = s, int64(i+len(marker)/2)
			break
		}
	}
	if off < 0 {
		// Values may be stored compressed; fall back to the middle of the
		// first segment's records.
		target = segs[0]
		off = dataEnd(t, target) / 2
		t.Logf("marker not found verbatim in any segment; flipping the middle byte of %s", target.path)
	}
	flipByte(t, target.path, off)
	t.Logf("flipped the byte at %s offset %d", target.path, off)

	res := testutil.RunToExit(t, 30*time.Second, "", nil, binary(t, strata), p.Args()...)
	if res.Code == 0 {
		t.Fatalf("strata started on a log with a corrupt record in the middle (exit 0)")
	}
	msg := res.Stderr + res.Stdout
	t.Logf("strata refused to start (exit %d):\n%s", res.Code, res.Stderr)
	if !strings.Contains(msg, filepath.Base(target.path)) {
		t.Errorf("start-up error does not name the segment %s:\n%s", filepath.Base(target.path), msg)
	}
	if !regexp.MustCompile(`(?i)offset\D{0,3}\d+|:\d+\b`).MatchString(msg) {
		t.Errorf("start-up error does not name an offset:\n%s", msg)
	}
	// A nearby offset is fine (a record's start rather than the byte
	// itself), but the number printed should point at or before the byte.
	if m := regexp.MustCompile(`(?i)offset\D{0,3}(\d+)`).FindStringSubmatch(msg); m != nil {
		if n, _ := strconv.ParseInt(m[1], 10, 64); n > off {
			t.Errorf("start-up error names offset %d, after the flipped byte at %d", n, off)
		}
	}
}

// flipByte inverts the bits of the byte at off in path.
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("read %s:%d: %v", path, off, err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatalf("write %s:%d: %v", path, off, err)
	}
}

// TestParseSegments pins the shapes of `strata inspect log --json` output
// the damage tests understand.
func TestParseSegments(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	logDir := filepath.Join(dir, "log")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"0000000000000001-0000000000000001.seg", "0000000000000002-0000000000000050.seg"} {
		if err := os.WriteFile(filepath.Join(logDir, n), make([]byte, 64), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	abs := filepath.Join(logDir, "0000000000000002-0000000000000050.seg")
	want := []segment{
		{path: filepath.Join(logDir, "0000000000000001-0000000000000001.seg"), first: 1, last: 49, bytes: 4096},
		{path: abs, first: 50, last: 70, bytes: 300},
	}
	tests := []struct {
		name string
		out  string
	}{
		{name: "Go field names, absolute dir", out: fmt.Sprintf(`[
			{"Dir":%q,"Name":"0000000000000001-0000000000000001.seg","FirstIndex":1,"LastIndex":49,"Records":49,"Bytes":4096},
			{"Dir":%q,"Name":"0000000000000002-0000000000000050.seg","FirstIndex":50,"LastIndex":70,"Records":21,"Bytes":300}]`, logDir, logDir)},
		{name: "snake case in an object, relative dir", out: `{"segments":[
			{"dir":"log","name":"0000000000000001-0000000000000001.seg","first_index":1,"last_index":49,"bytes":4096},
			{"dir":"log","name":"0000000000000002-0000000000000050.seg","first_index":50,"last_index":70,"bytes":300}]}`},
		{name: "path field", out: fmt.Sprintf(`[
			{"path":"log/0000000000000001-0000000000000001.seg","first":1,"last":49,"size":4096},
			{"path":%q,"first":50,"last":70,"size":300}]`, abs)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSegments([]byte(tt.out), dir)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("got %+v\nwant %+v", got, want)
			}
		})
	}
	if _, err := parseSegments([]byte(`[{"name":"missing.seg"}]`), dir); err == nil {
		t.Error("a segment whose file does not exist was accepted")
	}
}

// FuzzParseSegments feeds arbitrary bytes to the inspect-output decoder:
// it may refuse them, but must not panic.
func FuzzParseSegments(f *testing.F) {
	f.Add([]byte(`[{"Dir":"log","Name":"x.log","FirstIndex":1,"LastIndex":2,"Bytes":10}]`))
	f.Add([]byte(`{"segments":[{"path":"a","first_index":-1,"bytes":1e300}]}`))
	f.Add([]byte(`[1, "two", null, {"name": 3}]`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		segs, err := parseSegments(data, dir)
		if err == nil && len(segs) == 0 {
			t.Errorf("no error and no segments for %q", data)
		}
	})
}
