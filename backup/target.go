package backup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/strata-kv/strata/datadir"
)

var (
	// ErrNotExist: the target holds no object of that name.
	ErrNotExist = errors.New("backup: no such object in the target")
	// ErrExist: Put found the name taken and wrote nothing.
	ErrExist = errors.New("backup: object already exists in the target")
	// ErrCorrupt: an object's bytes do not match its hash, or a manifest
	// fails its checks (FORMAT.md).
	ErrCorrupt = errors.New("backup: corrupt")
)

// Object is one object of a target.
type Object struct {
	// Name is relative to the target's root, with '/' separators.
	Name string
	Size int64
}

// Target is where backups are kept: a directory or a bucket prefix. Names
// are relative, '/'-separated, without "." or ".." components.
//
// Concurrency: every method is safe from several goroutines.
type Target interface {
	// Put stores the size bytes read from r under name, only if no object
	// has that name (ErrExist otherwise, and nothing is written). When it
	// returns nil the object is durable and whole; a failure or crash
	// leaves the name absent or whole, never partial (FORMAT.md,
	// "Durability assumptions").
	Put(ctx context.Context, name string, r io.Reader, size int64) error
	// Get opens the object name for reading (ErrNotExist if absent).
	Get(ctx context.Context, name string) (io.ReadCloser, error)
	// Stat describes the object name (ErrNotExist if absent).
	Stat(ctx context.Context, name string) (Object, error)
	// List returns every object whose name starts with prefix, sorted by
	// name.
	List(ctx context.Context, prefix string) ([]Object, error)
	// Delete removes the object name; an absent name is not an error.
	Delete(ctx context.Context, name string) error
	// String is the target's URL, for messages.
	String() string
}

// TargetOptions configure OpenTarget. Fields left empty come from the
// environment as the AWS tools read it (s3:// only).
type TargetOptions struct {
	// Endpoint is the S3 endpoint: host:port, or a URL whose scheme says
	// http or https. Empty: AWS_ENDPOINT_URL, else s3.amazonaws.com.
	Endpoint string
	// Region; empty: AWS_REGION, else AWS_DEFAULT_REGION, else the
	// client asks the bucket.
	Region string
	// AccessKey and SecretKey; both empty: AWS_ACCESS_KEY_ID and
	// AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), else the shared
	// credentials file (~/.aws/credentials).
	AccessKey, SecretKey string
	// Insecure uses http for an Endpoint given without a scheme.
	Insecure bool
	// MustExist opens a file:// target only if its directory exists, and
	// without writing to it. Commands that only read or delete (list,
	// verify, prune, restore) set it, so that a mistyped path is refused
	// rather than answered as an empty target created on the spot. (An
	// s3:// bucket must always exist; a prefix with no objects is an
	// empty target either way.)
	MustExist bool
}

// OpenTarget opens the target a URL names: file:///abs/dir (created if
// missing, unless opts.MustExist) or s3://bucket/prefix. An S3 bucket must exist: a target that
// cannot be reached, or refuses the credentials, is an error here rather
// than in the middle of a backup.
func OpenTarget(ctx context.Context, rawURL string, opts TargetOptions) (Target, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("backup target %q: %w", rawURL, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("backup target %q: a file:// URL names a local directory (file:///path)", rawURL)
		}
		if u.Path == "" {
			return nil, fmt.Errorf("backup target %q: no directory", rawURL)
		}
		if opts.MustExist {
			return openExistingFileTarget(u.Path)
		}
		return NewFileTarget(u.Path)
	case "s3":
		return openS3(ctx, u, opts)
	default:
		return nil, fmt.Errorf("backup target %q: want a file:// or s3:// URL", rawURL)
	}
}

// checkName refuses a name that could leave the target's root.
func checkName(name string) error {
	if name == "" || strings.HasPrefix(name, "/") || path.Clean(name) != name || name == "." ||
		slices.Contains(strings.Split(name, "/"), "..") {
		return fmt.Errorf("backup: invalid object name %q", name)
	}
	return nil
}

// FileTarget is a Target on a local directory (file://). Each object is
// a file below the directory; a Put writes under tmp/ first (FORMAT.md).
type FileTarget struct {
	dir string
}

// tmpDir is where a FileTarget stages writes.
const tmpDir = "tmp"

// NewFileTarget opens (creating if needed, synced) the directory dir as a
// target.
func NewFileTarget(dir string) (*FileTarget, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("backup target %s: %w", dir, err)
	}
	if err := datadir.MkdirAllSynced(vfs.Default, filepath.Join(dir, tmpDir)); err != nil {
		return nil, fmt.Errorf("backup target %s: %w", dir, err)
	}
	return &FileTarget{dir: dir}, nil
}

// openExistingFileTarget opens dir as a target if it is a directory,
// writing nothing (Put fails without the tmp/ directory a writer's open
// creates).
func openExistingFileTarget(dir string) (*FileTarget, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("backup target %s: %w", dir, err)
	}
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("backup target file://%s: no such directory", filepath.ToSlash(dir))
	}
	if err != nil {
		return nil, fmt.Errorf("backup target %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("backup target file://%s: not a directory", filepath.ToSlash(dir))
	}
	return &FileTarget{dir: dir}, nil
}

func (t *FileTarget) path(name string) string { return filepath.Join(t.dir, filepath.FromSlash(name)) }

// String implements Target.
func (t *FileTarget) String() string { return "file://" + filepath.ToSlash(t.dir) }

// Put implements Target: the bytes go to a temporary file, which is
// fsynced and then hard-linked to its name (link fails if the name exists,
// so a name is never overwritten, even by a concurrent writer), and the
// directory fsynced (docs/design.md, durability rule 7).
func (t *FileTarget) Put(ctx context.Context, name string, r io.Reader, size int64) (err error) {
	if err := checkName(name); err != nil {
		return err
	}
	if name == tmpDir || strings.HasPrefix(name, tmpDir+"/") {
		return fmt.Errorf("backup: object name %q is reserved", name)
	}
	f, err := os.CreateTemp(filepath.Join(t.dir, tmpDir), "put-")
	if err != nil {
		return fmt.Errorf("put %s: %w", name, err)
	}
	tmp := f.Name()
	defer func() {
		_ = os.Remove(tmp)
	}()
	n, err := io.Copy(f, &ctxReader{ctx: ctx, r: r})
	if err == nil && n != size {
		err = fmt.Errorf("read %d bytes, want %d", n, size)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("put %s: %w", name, err)
	}
	final := t.path(name)
	parent := filepath.Dir(final)
	if err := datadir.MkdirAllSynced(vfs.Default, parent); err != nil {
		return fmt.Errorf("put %s: %w", name, err)
	}
	if err := os.Link(tmp, final); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("put %s: %w", name, ErrExist)
		}
		return fmt.Errorf("put %s: %w", name, err)
	}
	if err := datadir.SyncDir(vfs.Default, parent); err != nil {
		return fmt.Errorf("put %s: %w", name, err)
	}
	return nil
}

// Get implements Target.
func (t *FileTarget) Get(_ context.Context, name string) (io.ReadCloser, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	f, err := os.Open(t.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("get %s: %w", name, ErrNotExist)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", name, err)
	}
	return f, nil
}

// Stat implements Target.
func (t *FileTarget) Stat(_ context.Context, name string) (Object, error) {
	if err := checkName(name); err != nil {
		return Object{}, err
	}
	st, err := os.Stat(t.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return Object{}, fmt.Errorf("stat %s: %w", name, ErrNotExist)
	}
	if err != nil {
		return Object{}, fmt.Errorf("stat %s: %w", name, err)
	}
	return Object{Name: name, Size: st.Size()}, nil
}

// List implements Target. Staged writes under tmp/ are not objects.
func (t *FileTarget) List(_ context.Context, prefix string) ([]Object, error) {
	var out []Object
	err := filepath.WalkDir(t.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(t.dir, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == tmpDir {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasPrefix(rel, prefix) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		out = append(out, Object{Name: rel, Size: info.Size()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %s in %s: %w", prefix, t, err)
	}
	slices.SortFunc(out, func(a, b Object) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Delete implements Target.
func (t *FileTarget) Delete(_ context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	err := os.Remove(t.path(name))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	if err := datadir.SyncDir(vfs.Default, filepath.Dir(t.path(name))); err != nil {
		return fmt.Errorf("delete %s: %w", name, err)
	}
	return nil
}

// RemoveStaged removes the staged writes a crashed Put left under tmp/.
// Only Prune calls it, since a target has one writer at a time (package
// comment).
func (t *FileTarget) RemoveStaged() error {
	entries, err := os.ReadDir(filepath.Join(t.dir, tmpDir))
	if err != nil {
		return fmt.Errorf("remove staged writes in %s: %w", t, err)
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(t.dir, tmpDir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove staged writes in %s: %w", t, err)
		}
	}
	return nil
}

// ctxReader stops a copy once its context is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
