package engine

// AppliedIndexKey is the reserved key under which every engine stores the
// applied raft index, as an 8-byte big-endian integer, in the same key
// space as the data. It is a wire format: an engine's export (raft
// snapshots, backups) carries it like any other key, so a stream taken
// from one engine installs into another. Do not change it.
var AppliedIndexKey = []byte("\x00\x00engine/applied-index")

// ExportView is a consistent view of an engine's whole content, reserved
// keys (AppliedIndexKey) included, for sending as a raft snapshot or
// writing as a backup.
type ExportView interface {
	// AppliedIndex is the applied index the view holds.
	AppliedIndex() uint64
	// ForEach calls fn with every key and value of the view in key order.
	// The slices passed to fn are valid only during the call.
	ForEach(fn func(key, value []byte) error) error
	// Reader reads the view, for the packages that decode their own
	// records from it (an etcd-format snapshot: mvcc, auth, apply). It is
	// valid until Close.
	Reader() Reader
	// Close releases the view.
	Close() error
}

// SnapshotWriter stages the content of a received snapshot in a file, in
// a form its engine can install. Keys are added in strictly increasing
// order.
type SnapshotWriter interface {
	Add(key, value []byte) error
	// Finish completes and syncs the staged file.
	Finish() error
	// Abort discards an unfinished file's writer (the caller removes the
	// file).
	Abort()
}

// Transferable is an Engine whose whole content can be exported and
// replaced: what raft snapshots, backups and restore need. Both engines
// implement it (package engine/engines adapts them to this interface).
type Transferable interface {
	Engine
	// NewExportView takes a consistent view of the whole engine. It must
	// be closed.
	NewExportView() (ExportView, error)
	// NewSnapshotWriter starts a staged snapshot file at path.
	NewSnapshotWriter(path string) (SnapshotWriter, error)
	// InstallSnapshot atomically and durably replaces the engine's whole
	// content with the file at path (built by a SnapshotWriter of the same
	// engine) and returns the applied index the engine now holds. The
	// caller must not commit batches meanwhile.
	InstallSnapshot(path string) (uint64, error)
}
