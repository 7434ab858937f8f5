// Package logrotate is etcd's --enable-log-rotation for strata's log: a
// writer of one log file that, once the file would exceed MaxSize
// megabytes, renames it aside under a time stamp and starts a new one,
// keeping at most MaxBackups old files, none older than MaxAge days,
// gzip-compressed if Compress. Config reads etcd's
// --log-rotation-config-json; the old files are named as etcd's rotation
// (lumberjack) names them: <name>-<2006-01-02T15-04-05.000><ext>[.gz], in
// UTC unless LocalTime.
//
// Concurrency: Write, Sync and Close may be called from any goroutine; a
// mutex orders them. Compression runs on a goroutine of its own, which
// Close waits for.
package logrotate

import (
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Config is etcd's --log-rotation-config-json.
type Config struct {
	// MaxSize is the size in megabytes at which the file is rotated
	// (0: 100).
	MaxSize int `json:"maxsize"`
	// MaxAge is how many days old files are kept (0: no limit).
	MaxAge int `json:"maxage"`
	// MaxBackups is how many old files are kept (0: no limit).
	MaxBackups int `json:"maxbackups"`
	// LocalTime names old files in local time rather than UTC.
	LocalTime bool `json:"localtime"`
	// Compress gzips old files.
	Compress bool `json:"compress"`
}

// ParseConfig reads --log-rotation-config-json; the errors are etcd's.
func ParseConfig(s string) (Config, error) {
	var c Config
	if err := json.Unmarshal([]byte(s), &c); err != nil {
		var syntaxErr *json.SyntaxError
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syntaxErr):
			return Config{}, fmt.Errorf("improperly formatted log rotation config: %w", err)
		case errors.As(err, &typeErr):
			return Config{}, fmt.Errorf("invalid log rotation config: %w", err)
		default:
			return Config{}, fmt.Errorf("fail to unmarshal log rotation config: %w", err)
		}
	}
	return c, nil
}

// backupTimeFormat is the time stamp in old files' names.
const backupTimeFormat = "2006-01-02T15-04-05.000"

// Writer writes the log file at its path and rotates it. See the package
// comment.
type Writer struct {
	cfg  Config
	path string
	// now is the clock of rotations (time.Now; tests set it).
	now func() time.Time

	mu struct {
		sync.Mutex
		f    *os.File // nil after Close
		size int64
	}
	compressing sync.WaitGroup
}

// Open opens (appending) or creates the log file at path.
func Open(path string, cfg Config) (*Writer, error) {
	w := &Writer{cfg: cfg, path: path, now: time.Now}
	if err := w.openFile(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *Writer) maxSize() int64 {
	mb := w.cfg.MaxSize
	if mb <= 0 {
		mb = 100
	}
	return int64(mb) << 20
}

// openFile opens the current file. REQUIRES: mu held, or w not shared yet.
func (w *Writer) openFile() error {
	if err := os.MkdirAll(filepath.Dir(w.path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	w.mu.f, w.mu.size = f, st.Size()
	return nil
}

// Write appends p to the file, first rotating it if p would take it past
// MaxSize. A single write larger than MaxSize goes whole into a new file.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mu.f == nil {
		return 0, os.ErrClosed
	}
	if w.mu.size > 0 && w.mu.size+int64(len(p)) > w.maxSize() {
		if err := w.rotateLocked(); err != nil {
			return 0, err
		}
	}
	n, err := w.mu.f.Write(p)
	w.mu.size += int64(n)
	return n, err
}

// Sync syncs the current file.
func (w *Writer) Sync() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.mu.f == nil {
		return nil
	}
	return w.mu.f.Sync()
}

// Close closes the file and waits for compressions under way.
func (w *Writer) Close() error {
	w.mu.Lock()
	var err error
	if w.mu.f != nil {
		err = w.mu.f.Close()
		w.mu.f = nil
	}
	w.mu.Unlock()
	w.compressing.Wait()
	return err
}

// rotateLocked renames the file aside, opens a new one and prunes the old
// files. REQUIRES: mu held.
func (w *Writer) rotateLocked() error {
	if err := w.mu.f.Close(); err != nil {
		return err
	}
	w.mu.f = nil
	t := w.now()
	if !w.cfg.LocalTime {
		t = t.UTC()
	}
	ext := filepath.Ext(w.path)
	backup := strings.TrimSuffix(w.path, ext) + "-" + t.Format(backupTimeFormat) + ext
	if err := os.Rename(w.path, backup); err != nil {
		return err
	}
	if err := w.openFile(); err != nil {
		return err
	}
	w.prune(t)
	if w.cfg.Compress {
		w.compressing.Add(1)
		go func() {
			defer w.compressing.Done()
			_ = compress(backup)
		}()
	}
	return nil
}

// prune removes old files beyond MaxBackups and older than MaxAge,
// oldest first; now is the time of the rotation.
func (w *Writer) prune(now time.Time) {
	ext := filepath.Ext(w.path)
	prefix := filepath.Base(strings.TrimSuffix(w.path, ext)) + "-"
	entries, err := os.ReadDir(filepath.Dir(w.path))
	if err != nil {
		return
	}
	// One backup per time stamp: a file being compressed is there twice,
	// with and without .gz, for a moment.
	type backup struct {
		names []string
		t     time.Time
	}
	byStamp := map[string]*backup{}
	for _, e := range entries {
		name := e.Name()
		stamp, ok := strings.CutPrefix(name, prefix)
		if !ok {
			continue
		}
		stamp = strings.TrimSuffix(strings.TrimSuffix(stamp, ".gz"), ext)
		t, err := time.ParseInLocation(backupTimeFormat, stamp, now.Location())
		if err != nil {
			continue
		}
		if b := byStamp[stamp]; b != nil {
			b.names = append(b.names, name)
		} else {
			byStamp[stamp] = &backup{names: []string{name}, t: t}
		}
	}
	var backups []*backup
	for _, b := range byStamp {
		backups = append(backups, b)
	}
	sort.Slice(backups, func(i, j int) bool { return backups[i].t.After(backups[j].t) }) // newest first
	for i, b := range backups {
		tooMany := w.cfg.MaxBackups > 0 && i >= w.cfg.MaxBackups
		tooOld := w.cfg.MaxAge > 0 && now.Sub(b.t) > time.Duration(w.cfg.MaxAge)*24*time.Hour
		if tooMany || tooOld {
			for _, name := range b.names {
				_ = os.Remove(filepath.Join(filepath.Dir(w.path), name))
			}
		}
	}
}

// compress gzips path into path.gz and removes path.
func compress(path string) error {
	in, err := os.Open(path)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(path+".gz", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(out)
	if _, err := io.Copy(zw, in); err != nil {
		out.Close()
		return err
	}
	if err := zw.Close(); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Remove(path)
}
