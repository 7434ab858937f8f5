package logger

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/strata-kv/strata/datadir"
)

// ErrNotJoined means the data directory holds no such cluster.
var ErrNotJoined = errors.New("logger: cluster not joined")

// leavePrefix names a cluster directory being deleted by Leave: listed by
// nobody, removed again by the next Leave of the same cluster.
const leavePrefix = ".leave-"

// Leave deletes a cluster's directory (its record, log, gap and truncation
// records) from a logger's data directory: the logger's side of leaving a
// cluster, after `etcdctl member remove` of the logger. The logger must be
// stopped: Leave takes the data directory's LOCK and refuses (ErrLocked)
// while a logger runs on it. The directory is first renamed out of the
// clusters' names and that rename synced, so that a crash while deleting
// never leaves a half-deleted cluster that a logger would open.
func Leave(fs vfs.FS, dataDir string, clusterID uint64) error {
	if fs == nil {
		fs = vfs.Default
	}
	lock, err := fs.Lock(lockPath(dataDir))
	if err != nil {
		return fmt.Errorf("%w: %s (lock: %v); stop the logger first", ErrLocked, dataDir, err)
	}
	defer lock.Close()
	dir := clusterDir(dataDir, clusterID)
	if _, err := fs.Stat(dir); err != nil {
		return fmt.Errorf("%w: cluster %x (%s)", ErrNotJoined, clusterID, dir)
	}
	gone := filepath.Join(clustersDir(dataDir), leavePrefix+strconv.FormatUint(clusterID, 16))
	if err := fs.RemoveAll(gone); err != nil {
		return fmt.Errorf("remove %s: %w", gone, err)
	}
	if err := fs.Rename(dir, gone); err != nil {
		return fmt.Errorf("rename %s to %s: %w", dir, gone, err)
	}
	if err := datadir.SyncDir(fs, clustersDir(dataDir)); err != nil {
		return err
	}
	if err := fs.RemoveAll(gone); err != nil {
		return fmt.Errorf("remove %s: %w", gone, err)
	}
	return datadir.SyncDir(fs, clustersDir(dataDir))
}
