package logger

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/strata-kv/strata/datadir"
)

// The logger's data directory (docs/logger.md, "Data directory"):
//
//	<data-dir>/LOCK                                held by the running logger
//	<data-dir>/clusters/<cluster-id>/cluster.json  the cluster record
//	<data-dir>/clusters/<cluster-id>/log/          the cluster's raftlog
//	<data-dir>/clusters/<cluster-id>/gaps.json     the gap record
//
// <cluster-id> is the cluster ID in hex. A cluster directory appears whole:
// Join builds it under clusters/.join-<cluster-id> and renames it.

func clustersDir(dataDir string) string { return filepath.Join(dataDir, "clusters") }

func clusterDir(dataDir string, clusterID uint64) string {
	return filepath.Join(clustersDir(dataDir), strconv.FormatUint(clusterID, 16))
}

func lockPath(dataDir string) string { return filepath.Join(dataDir, "LOCK") }

const (
	recordFile = "cluster.json"
	gapsFile   = "gaps.json"
	logDirName = "log"
	joinPrefix = ".join-"
)

// ClusterRecord is what the logger knows of a cluster it joined: written by
// Join, rewritten when a membership change the learner sees adds, removes or
// moves a peer.
type ClusterRecord struct {
	// ClusterID is the cluster's ID; MemberID the logger's member ID in it
	// (a learner the operator added).
	ClusterID uint64 `json:"cluster_id"`
	MemberID  uint64 `json:"member_id"`
	// Name is the name the operator gave the logger in this cluster.
	Name string `json:"name,omitempty"`
	// PeerURLs are the logger's advertised peer URLs it joined with.
	PeerURLs []string `json:"peer_urls"`
	// Peers are the other members' peer URLs, by member ID.
	Peers map[uint64][]string `json:"peers"`
	// Voters are the members whose Truncate requests count (the
	// cluster's voters; the logger never is one).
	Voters []uint64 `json:"voters"`
	// Removed are the IDs of the members removed since the logger joined,
	// sorted: the members refuse a change that adds one again, and so does
	// the logger (followMembership).
	Removed []uint64 `json:"removed,omitempty"`
	// Published are the attributes (name, marked client URLs) the logger
	// last saw committed for itself in the cluster's log (publish.go).
	Published *Attributes `json:"published,omitempty"`
	// Joined is when Join wrote the record.
	Joined time.Time `json:"joined"`
}

func readRecord(fs vfs.FS, dir string) (*ClusterRecord, error) {
	raw, err := readFile(fs, filepath.Join(dir, recordFile))
	if err != nil {
		return nil, err
	}
	var rec ClusterRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Join(dir, recordFile), err)
	}
	if rec.ClusterID == 0 || rec.MemberID == 0 {
		return nil, fmt.Errorf("%s: cluster or member ID missing", filepath.Join(dir, recordFile))
	}
	return &rec, nil
}

func writeRecord(fs vfs.FS, dir string, rec *ClusterRecord) error {
	raw, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return datadir.WriteFileAtomic(fs, filepath.Join(dir, recordFile), append(raw, '\n'))
}

// Gap is one snapshot the leader sent the logger instead of entries: the
// logger never received the entries up to SnapshotIndex, and restarted its
// log after it (docs/logger.md, "Snapshots and the gap record").
type Gap struct {
	// SnapshotIndex and SnapshotTerm are the snapshot's: the logger holds
	// entries from SnapshotIndex+1 on.
	SnapshotIndex uint64 `json:"snapshot_index"`
	SnapshotTerm  uint64 `json:"snapshot_term"`
	// DiscardedFirst and DiscardedLast are the range the logger held before
	// and dropped with the restart (0, 0: none, or unknown when
	// Reconciled).
	DiscardedFirst uint64 `json:"discarded_first,omitempty"`
	DiscardedLast  uint64 `json:"discarded_last,omitempty"`
	// Reconciled says the gap was found at open (the log's snapshot point
	// above the last gap recorded: a crash came between the log's restart
	// and the record), so the discarded range is unknown.
	Reconciled bool      `json:"reconciled,omitempty"`
	At         time.Time `json:"at"`
}

// String describes the gap for errors and logs.
func (g Gap) String() string {
	s := fmt.Sprintf("entries up to %d were never received (the leader sent a snapshot at index %d, term %d, at %s)",
		g.SnapshotIndex, g.SnapshotIndex, g.SnapshotTerm, g.At.UTC().Format(time.RFC3339))
	if g.DiscardedLast > 0 {
		s += fmt.Sprintf("; the entries [%d, %d] held before were discarded", g.DiscardedFirst, g.DiscardedLast)
	}
	return s
}

type gapRecord struct {
	Gaps []Gap `json:"gaps"`
}

func readGaps(fs vfs.FS, dir string) ([]Gap, error) {
	raw, err := readFile(fs, filepath.Join(dir, gapsFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r gapRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Join(dir, gapsFile), err)
	}
	return r.Gaps, nil
}

func writeGaps(fs vfs.FS, dir string, gaps []Gap) error {
	raw, err := json.MarshalIndent(gapRecord{Gaps: gaps}, "", "  ")
	if err != nil {
		return err
	}
	return datadir.WriteFileAtomic(fs, filepath.Join(dir, gapsFile), append(raw, '\n'))
}

func readFile(fs vfs.FS, path string) ([]byte, error) {
	f, err := fs.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	buf := make([]byte, st.Size())
	if _, err := f.ReadAt(buf, 0); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return buf, nil
}

// listClusters returns the cluster IDs of the complete cluster directories
// under dataDir, ignoring directories a Join is still building.
func listClusters(fs vfs.FS, dataDir string) ([]uint64, error) {
	names, err := fs.List(clustersDir(dataDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", clustersDir(dataDir), err)
	}
	var ids []uint64
	for _, n := range names {
		if strings.HasPrefix(n, ".") {
			continue
		}
		id, err := strconv.ParseUint(n, 16, 64)
		if err != nil || id == 0 {
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// addCluster writes a new cluster directory holding rec, whole or not at
// all: it is built under a temporary name and renamed into place.
func addCluster(fs vfs.FS, dataDir string, rec *ClusterRecord) error {
	final := clusterDir(dataDir, rec.ClusterID)
	if _, err := fs.Stat(final); err == nil {
		return fmt.Errorf("%w: cluster %x (%s)", ErrAlreadyJoined, rec.ClusterID, final)
	}
	if err := datadir.MkdirAllSynced(fs, clustersDir(dataDir)); err != nil {
		return fmt.Errorf("create %s: %w", clustersDir(dataDir), err)
	}
	tmp := filepath.Join(clustersDir(dataDir), joinPrefix+strconv.FormatUint(rec.ClusterID, 16))
	if err := fs.RemoveAll(tmp); err != nil {
		return fmt.Errorf("remove %s: %w", tmp, err)
	}
	if err := fs.MkdirAll(tmp, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if err := writeRecord(fs, tmp, rec); err != nil {
		return err
	}
	if err := fs.Rename(tmp, final); err != nil {
		return fmt.Errorf("rename %s to %s: %w", tmp, final, err)
	}
	return datadir.SyncDir(fs, clustersDir(dataDir))
}
