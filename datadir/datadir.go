// Package datadir owns a member's data directory: where each component keeps
// its files, the identity the directory belongs to, and how files and
// directories are made durable there. cmd/strata, the member and restore all
// go through it, so the layout is written down once.
//
//	<data-dir>/LOCK       flock held while the member runs
//	<data-dir>/identity   member and cluster IDs and the engine's name, written once
//	<data-dir>/engine/    the engine the identity names: Pebble (no WAL of its
//	                      own) or bbolt (engine/bbolt.db)
//	<data-dir>/log/       the raft log, unless --log-dir names other places
//	<data-dir>/snap/      raft snapshots received and not yet installed
//	<data-dir>/backup.tmp/ checkpoints of backup versions while they upload
//
// Invariants:
//
//  1. The identity is written once, atomically (durability rule 7 in
//     docs/design.md): a directory holds no identity or a whole one, and a
//     member never bootstraps over a directory that has one.
//  2. Every directory is created with its parent synced after, so that a
//     power cut cannot bring back an engine or log directory whose entry in
//     its parent was lost (a member would then bootstrap a new cluster).
//  3. The engine is chosen once, when the identity is written, and the
//     identity names it; an identity without a name predates the choice
//     and means DefaultEngine. A directory is opened only with the engine
//     its identity names (LoadOrCreateID refuses any other).
package datadir

import (
	"crypto/sha1"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Engine is the engine's directory.
func Engine(dataDir string) string { return filepath.Join(dataDir, "engine") }

// SnapshotTemp is where a snapshot in etcd's format is built: bbolt writes
// to the operating system's file system, so the data directory when the
// member's files are there (it has room for a copy of the data), else the
// system's temporary directory ("").
func SnapshotTemp(fs vfs.FS, dataDir string) string {
	if fs == vfs.Default {
		return dataDir
	}
	return ""
}

// Log is the raft log's directory when no --log-dir is given.
func Log(dataDir string) string { return filepath.Join(dataDir, "log") }

// Snap holds raft snapshots received and not yet installed.
func Snap(dataDir string) string { return filepath.Join(dataDir, "snap") }

// BackupStaging is where a running member stages the checkpoints of its
// backup versions (package backup): on the engine's file system, so that
// Pebble hard-links the tables into them.
func BackupStaging(dataDir string) string { return filepath.Join(dataDir, "backup.tmp") }

// Identity is the identity file (ID).
func Identity(dataDir string) string { return filepath.Join(dataDir, "identity") }

// Lock is the file locked while a member runs on the directory.
func Lock(dataDir string) string { return filepath.Join(dataDir, "LOCK") }

// ID is what a data directory remembers about whom it belongs to.
type ID struct {
	Name      string `json:"name"`
	MemberID  uint64 `json:"member_id"`
	ClusterID uint64 `json:"cluster_id"`
	// Joined is set for a member added to a running cluster: it starts
	// with an empty log instead of bootstrapping one.
	Joined bool `json:"joined,omitempty"`
	// Engine names the storage engine the directory was bootstrapped with
	// (--engine); empty means DefaultEngine (invariant 3).
	Engine string `json:"engine,omitempty"`
	// Removed is set once the member learned that the cluster removed it:
	// the directory's member never runs again (a restart stops at once,
	// as etcd's removed member does), since its applied state no longer
	// tells a removed member from one whose addition it has yet to apply.
	Removed bool `json:"removed,omitempty"`
}

// DefaultEngine is the engine of a directory whose identity names none:
// every directory written before the engine could be chosen holds Pebble.
const DefaultEngine = "pebble"

// ErrEngineMismatch is returned when a data directory is opened with an
// engine other than the one it was bootstrapped with.
var ErrEngineMismatch = errors.New("data directory holds another engine")

// EngineName returns the engine the identity names (invariant 3).
func (id ID) EngineName() string {
	if id.Engine == "" {
		return DefaultEngine
	}
	return id.Engine
}

// CheckEngine returns nil if requested ("" meaning DefaultEngine) is the
// engine id names, else an ErrEngineMismatch error naming both.
func CheckEngine(dataDir string, id ID, requested string) error {
	if requested == "" {
		requested = DefaultEngine
	}
	if have := id.EngineName(); have != requested {
		return fmt.Errorf("%w: %s was bootstrapped with the %q engine and cannot be opened with --engine %s (start with --engine %s)",
			ErrEngineMismatch, dataDir, have, requested, have)
	}
	return nil
}

// LoadOrCreateID returns the data directory's identity after checking
// that it names engineName ("" meaning DefaultEngine). A directory without
// one gets the identity create returns, with engineName recorded in it,
// written once (invariants 1 and 3): a member calls it before opening its
// engine.
func LoadOrCreateID(fs vfs.FS, dataDir, engineName string, create func() (ID, error)) (ID, error) {
	if engineName == "" {
		engineName = DefaultEngine
	}
	id, ok, err := ReadID(fs, dataDir)
	if err != nil {
		return ID{}, err
	}
	if ok {
		if err := CheckEngine(dataDir, id, engineName); err != nil {
			return ID{}, err
		}
		return id, nil
	}
	if id, err = create(); err != nil {
		return ID{}, err
	}
	id.Engine = engineName
	if err := WriteID(fs, dataDir, id); err != nil {
		return ID{}, err
	}
	return id, nil
}

// ReadID reads the identity of the data directory; ok is false if it has
// none yet.
func ReadID(fs vfs.FS, dataDir string) (id ID, ok bool, err error) {
	path := Identity(dataDir)
	f, err := fs.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return ID{}, false, nil
	}
	if err != nil {
		return ID{}, false, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	if err := json.NewDecoder(f).Decode(&id); err != nil {
		return ID{}, false, fmt.Errorf("read %s: %w", path, err)
	}
	return id, true, nil
}

// WriteID writes the identity of the data directory (invariant 1).
func WriteID(fs vfs.FS, dataDir string, id ID) error {
	raw, err := json.Marshal(id)
	if err != nil {
		return err
	}
	return WriteFileAtomic(fs, Identity(dataDir), raw)
}

// MkdirAllSynced creates dir and its missing parents, syncing each parent
// after creating a child in it (invariant 2).
func MkdirAllSynced(fs vfs.FS, dir string) error {
	dir = filepath.Clean(dir)
	if _, err := fs.Stat(dir); err == nil {
		return nil
	}
	parent := filepath.Dir(dir)
	if parent != dir {
		if err := MkdirAllSynced(fs, parent); err != nil {
			return err
		}
	}
	if err := fs.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return SyncDir(fs, parent)
}

// SyncDir syncs a directory, making the entries created or renamed in it
// durable.
func SyncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// WriteFileAtomic writes a file under a temporary name, syncs it, renames
// it into place and syncs the directory (durability rule 7).
func WriteFileAtomic(fs vfs.FS, path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := fs.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return SyncDir(fs, filepath.Dir(path))
}

// MemberID derives a member's ID from its peer URLs and the cluster token,
// as etcd does, so that the same flags give the same IDs.
func MemberID(peerURLs []string, token string) uint64 {
	urls := slices.Sorted(slices.Values(peerURLs))
	b := []byte(strings.Join(urls, ""))
	b = append(b, []byte(token)...)
	sum := sha1.Sum(b)
	return binary.BigEndian.Uint64(sum[:8])
}

// ClusterID derives the cluster ID from its members' IDs, as etcd does.
func ClusterID(memberIDs map[string]uint64) uint64 {
	ids := make([]uint64, 0, len(memberIDs))
	for _, id := range memberIDs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	b := make([]byte, 8*len(ids))
	for i, id := range ids {
		binary.BigEndian.PutUint64(b[8*i:], id)
	}
	sum := sha1.Sum(b)
	return binary.BigEndian.Uint64(sum[:8])
}

// BootstrapID is the identity a member of a new cluster takes: its ID and
// the cluster's from --initial-cluster and the token.
func BootstrapID(name string, initialCluster map[string][]string, token string) (ID, error) {
	memberIDs := map[string]uint64{}
	for n, urls := range initialCluster {
		memberIDs[n] = MemberID(urls, token)
	}
	self, ok := memberIDs[name]
	if !ok {
		return ID{}, fmt.Errorf("--initial-cluster has no member named %q (--name)", name)
	}
	return ID{Name: name, MemberID: self, ClusterID: ClusterID(memberIDs)}, nil
}
