package logrotate

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestRotation: the file is renamed aside under a time stamp once a write
// would take it past MaxSize; at most MaxBackups old files stay, none
// older than MaxAge days; Compress gzips them.
func TestRotation(t *testing.T) {
	line := bytes.Repeat([]byte("x"), 400<<10) // 400 KiB: two fit in a file of 1 MB
	for _, tc := range []struct {
		name      string
		cfg       Config
		writes    int
		step      time.Duration // clock advance per write
		wantFiles []string      // besides strata.log, by suffix pattern
	}{
		{name: "no rotation below the size", cfg: Config{MaxSize: 1}, writes: 2, step: time.Second, wantFiles: nil},
		{name: "rotated, all kept", cfg: Config{MaxSize: 1}, writes: 7, step: time.Second, wantFiles: []string{".log", ".log", ".log"}},
		{name: "max backups", cfg: Config{MaxSize: 1, MaxBackups: 1}, writes: 7, step: time.Second, wantFiles: []string{".log"}},
		{name: "max age", cfg: Config{MaxSize: 1, MaxAge: 1}, writes: 7, step: 20 * time.Hour, wantFiles: []string{".log"}},
		{name: "compressed", cfg: Config{MaxSize: 1, Compress: true}, writes: 4, step: time.Second, wantFiles: []string{".log.gz"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "strata.log")
			w, err := Open(path, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			clock := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			w.now = func() time.Time { return clock }
			for range tc.writes {
				if _, err := w.Write(line); err != nil {
					t.Fatal(err)
				}
				clock = clock.Add(tc.step)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range entries {
				if e.Name() == "strata.log" {
					continue
				}
				if !strings.HasPrefix(e.Name(), "strata-2026-01-") {
					t.Errorf("unexpected file %s", e.Name())
				}
				got = append(got, filepath.Ext(strings.TrimSuffix(e.Name(), ".gz"))+map[bool]string{true: ".gz", false: ""}[strings.HasSuffix(e.Name(), ".gz")])
				if strings.HasSuffix(e.Name(), ".gz") {
					f, _ := os.Open(filepath.Join(dir, e.Name()))
					zr, err := gzip.NewReader(f)
					if err != nil {
						t.Fatal(err)
					}
					data, _ := io.ReadAll(zr)
					f.Close()
					if len(data) == 0 || len(data)%len(line) != 0 {
						t.Errorf("%s holds %d bytes, not whole writes", e.Name(), len(data))
					}
				}
			}
			sort.Strings(got)
			if strings.Join(got, ",") != strings.Join(tc.wantFiles, ",") {
				t.Errorf("old files %v, want %v", got, tc.wantFiles)
			}
			if st, err := os.Stat(path); err != nil || st.Size() > 1<<20 {
				t.Errorf("current file: %v, %v", st, err)
			}
		})
	}
}

// TestParseConfig: etcd's default and etcd's errors.
func TestParseConfig(t *testing.T) {
	c, err := ParseConfig(`{"maxsize": 100, "maxage": 0, "maxbackups": 0, "localtime": false, "compress": false}`)
	if err != nil || c.MaxSize != 100 {
		t.Fatalf("etcd's default: %+v, %v", c, err)
	}
	if _, err := ParseConfig(`{"maxsize": 100`); err == nil || !strings.HasPrefix(err.Error(), "improperly formatted log rotation config") {
		t.Errorf("syntax error: %v", err)
	}
	if _, err := ParseConfig(`{"maxsize": "big"}`); err == nil || !strings.HasPrefix(err.Error(), "invalid log rotation config") {
		t.Errorf("type error: %v", err)
	}
}
