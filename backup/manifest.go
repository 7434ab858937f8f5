package backup

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Format is the version of the target layout and of a files version's
// manifest (FORMAT.md).
const Format = 1

// FormatLog is the envelope format of a log version's manifest
// (FORMAT.md, "Log versions"): a reader that knows only Format refuses it
// by its number instead of misreading a version that has no files.
const FormatLog = 2

// FormatEngine is the envelope format of a files version of an engine
// other than Pebble (FORMAT.md, "Engines"): its body names the engine,
// and a reader that knows only Format refuses it by its number instead of
// opening another engine's files as Pebble's.
const FormatEngine = 3

// pebbleEngine is the engine of a files version whose manifest names none
// (every version written before other engines could be backed up), the
// --engine name of engines.Pebble.
const pebbleEngine = "pebble"

// knownEngines are the engines a files version of format FormatEngine may
// name: the --engine names of package engines other than Pebble's.
var knownEngines = []string{"bbolt", "appendlog", "hybridlog"}

// Kind says what a version is made of (FORMAT.md, "Log versions").
type Kind string

const (
	// KindFiles is a version that names every engine file of a
	// checkpoint: whole by itself.
	KindFiles Kind = "files"
	// KindLog is a version that names a files version (its base) and the
	// archived raft log objects from the base's index + 1 to its own
	// index: restoring it restores the base and replays that log.
	KindLog Kind = "log"
)

// Prefixes of the target's objects (FORMAT.md).
const (
	filesPrefix     = "files/"
	manifestsPrefix = "manifests/"
	manifestSuffix  = ".json"
)

// maxManifestBytes bounds what is read of a manifest, so that a damaged or
// hostile object cannot make a reader allocate without limit. A manifest
// names each engine file in about 150 bytes: 64 MiB is far above any real
// engine's file count.
const maxManifestBytes = 64 << 20

// ID is a cluster or member ID, written in hex as etcd prints them.
type ID uint64

// MarshalText implements encoding.TextMarshaler.
func (id ID) MarshalText() ([]byte, error) { return []byte(strconv.FormatUint(uint64(id), 16)), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (id *ID) UnmarshalText(b []byte) error {
	v, err := strconv.ParseUint(string(b), 16, 64)
	if err != nil {
		return fmt.Errorf("ID %q: %w", b, err)
	}
	*id = ID(v)
	return nil
}

// ConfState is raft's membership as the manifest records it (FORMAT.md).
type ConfState struct {
	Voters         []uint64 `json:"voters,omitempty"`
	Learners       []uint64 `json:"learners,omitempty"`
	VotersOutgoing []uint64 `json:"voters_outgoing,omitempty"`
	LearnersNext   []uint64 `json:"learners_next,omitempty"`
	AutoLeave      bool     `json:"auto_leave,omitempty"`
}

func confStateOf(cs *raftpb.ConfState) ConfState {
	if cs == nil {
		return ConfState{}
	}
	return ConfState{Voters: cs.GetVoters(), Learners: cs.GetLearners(), VotersOutgoing: cs.GetVotersOutgoing(),
		LearnersNext: cs.GetLearnersNext(), AutoLeave: cs.GetAutoLeave()}
}

// File is one engine file of a version.
type File struct {
	// Name is the engine file's path in the checkpoint, relative, with
	// "/" between its parts (hybridlog's stable region is a directory);
	// check refuses one that could leave the engine directory.
	Name string `json:"name"`
	// SHA256 is the lowercase hex SHA-256 of its bytes; the target holds
	// them under files/<SHA256>.
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// LogObject is one archived raft log object a log version names
// (log/<First>-<Last>, FORMAT.md "Archived log").
type LogObject struct {
	First uint64 `json:"first"`
	Last  uint64 `json:"last"`
	// SHA256 is the lowercase hex SHA-256 of the whole object (header
	// line included), and Size its length in bytes.
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Manifest is one version of the backed-up engine (FORMAT.md, "Manifests"
// and "Log versions").
type Manifest struct {
	// Kind is KindFiles or KindLog; a manifest of format 1 has none and
	// is a files version (Kind reads KindFiles after decoding).
	Kind            Kind      `json:"kind,omitempty"`
	Version         uint64    `json:"version"`
	Created         time.Time `json:"created"`
	ClusterID       ID        `json:"cluster_id"`
	MemberID        ID        `json:"member_id"`
	RaftIndex       uint64    `json:"raft_index"`
	RaftTerm        uint64    `json:"raft_term"`
	ConfState       ConfState `json:"conf_state"`
	Revision        int64     `json:"revision"`
	CompactRevision int64     `json:"compact_revision"`
	// Engine is the engine whose checkpoint Files are (--engine), named
	// only by a files version of format FormatEngine; empty is Pebble
	// (EngineName). A log version names none: it replays on its base's.
	Engine   string `json:"engine,omitempty"`
	Files    []File `json:"files"`
	NewFiles uint64 `json:"new_files"`
	NewBytes uint64 `json:"new_bytes"`

	// The fields of a log version (Kind KindLog; absent in a files
	// version).

	// Base is the files version the log replays on, and BaseIndex its raft
	// index: Log covers BaseIndex+1..RaftIndex.
	Base      uint64 `json:"base,omitempty"`
	BaseIndex uint64 `json:"base_index,omitempty"`
	// Log is the archived log objects the replay reads, by first index.
	Log []LogObject `json:"log,omitempty"`
	// EngineBytes is the bytes of the checkpoint the version's metadata
	// was read from: what a files version of the same state would have
	// named (its Size).
	EngineBytes int64 `json:"engine_bytes,omitempty"`
}

// EngineName is the engine whose files a files version holds: Engine,
// or Pebble's name if it names none.
func (m *Manifest) EngineName() string {
	if m.Engine == "" {
		return pebbleEngine
	}
	return m.Engine
}

// IsLog reports whether m is a log version.
func (m *Manifest) IsLog() bool { return m.Kind == KindLog }

// LogSize is the bytes of the log objects a log version names (0 for a
// files version).
func (m *Manifest) LogSize() int64 {
	var n int64
	for _, o := range m.Log {
		n += o.Size
	}
	return n
}

// Size is the bytes of every file of the version.
func (m *Manifest) Size() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// envelope is what a manifest object holds: the body's bytes as written,
// and their checksum (FORMAT.md).
type envelope struct {
	Format int             `json:"format"`
	SHA256 string          `json:"sha256"`
	Body   json.RawMessage `json:"body"`
}

// manifestName is the object name of a version's manifest.
func manifestName(version uint64) string {
	return fmt.Sprintf("%s%020d%s", manifestsPrefix, version, manifestSuffix)
}

// parseManifestName returns the version a manifest object's name holds.
func parseManifestName(name string) (uint64, bool) {
	s, ok := strings.CutPrefix(name, manifestsPrefix)
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, manifestSuffix)
	if !ok || len(s) != 20 {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v == 0 {
		return 0, false
	}
	return v, true
}

// fileName is the object name of the file whose hash is sum.
func fileName(sum string) string { return filesPrefix + sum }

// EncodeManifest returns the manifest object's bytes. It checks m as
// DecodeManifest would, so that nothing unreadable is ever written.
func EncodeManifest(m *Manifest) ([]byte, error) {
	if err := m.check(); err != nil {
		return nil, err
	}
	// A files version of Pebble is written exactly as before log versions
	// existed (format 1, no kind, no engine), so that an older strata
	// still restores it.
	enc, format := *m, Format
	switch {
	case m.IsLog():
		// It replays on its base's engine and names none.
		format, enc.Engine = FormatLog, ""
	case m.EngineName() != pebbleEngine:
		format = FormatEngine
		enc.Kind = ""
	default:
		enc.Kind, enc.Engine = "", ""
	}
	body, err := json.Marshal(&enc)
	if err != nil {
		return nil, fmt.Errorf("encode manifest %d: %w", m.Version, err)
	}
	out, err := json.Marshal(envelope{Format: format, SHA256: sha256Hex(body), Body: body})
	if err != nil {
		return nil, fmt.Errorf("encode manifest %d: %w", m.Version, err)
	}
	return append(out, '\n'), nil
}

// DecodeManifest reads a manifest object's bytes: the envelope, the
// body's checksum before any field of the body, then the body and its
// checks. Errors wrap ErrCorrupt.
func DecodeManifest(data []byte) (*Manifest, error) {
	if len(data) > maxManifestBytes {
		return nil, fmt.Errorf("%w: manifest of %d bytes, above the limit of %d", ErrCorrupt, len(data), maxManifestBytes)
	}
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		return nil, fmt.Errorf("%w: manifest envelope: %v", ErrCorrupt, err)
	}
	if env.Format != Format && env.Format != FormatLog && env.Format != FormatEngine {
		return nil, fmt.Errorf("%w: manifest format %d, this strata reads %d, %d and %d", ErrCorrupt, env.Format, Format, FormatLog, FormatEngine)
	}
	if env.SHA256 != sha256Hex(env.Body) {
		return nil, fmt.Errorf("%w: manifest checksum mismatch", ErrCorrupt)
	}
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(env.Body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: manifest body: %v", ErrCorrupt, err)
	}
	// The envelope's format and the body's kind and engine must agree: a
	// format 1 body is a files version of Pebble (the writer names no kind
	// and no engine), a format 2 body is a log version (no engine: its
	// base's), a format 3 body a files version of the engine it names,
	// which is not Pebble.
	switch {
	case env.Format == Format && (m.Kind == "" || m.Kind == KindFiles) && m.Engine == "":
		m.Kind = KindFiles
	case env.Format == FormatLog && m.Kind == KindLog && m.Engine == "":
	case env.Format == FormatEngine && (m.Kind == "" || m.Kind == KindFiles) && slices.Contains(knownEngines, m.Engine):
		m.Kind = KindFiles
	default:
		return nil, fmt.Errorf("%w: manifest %d: format %d with kind %q and engine %q", ErrCorrupt, m.Version, env.Format, m.Kind, m.Engine)
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return &m, nil
}

// check refuses a manifest a restore could not use safely.
func (m *Manifest) check() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: manifest %d: %s", ErrCorrupt, m.Version, fmt.Sprintf(format, args...))
	}
	if m.Version == 0 {
		return bad("version 0")
	}
	if m.IsLog() {
		return m.checkLog(bad)
	}
	if m.Kind != "" && m.Kind != KindFiles {
		return bad("kind %q", m.Kind)
	}
	if m.Base != 0 || m.BaseIndex != 0 || len(m.Log) != 0 || m.EngineBytes != 0 {
		return bad("a files version names a base or log objects")
	}
	if len(m.Files) == 0 {
		return bad("no files")
	}
	seen := make(map[string]bool, len(m.Files))
	var newBytes uint64
	for _, f := range m.Files {
		if !localPath(f.Name) {
			return bad("file name %q is not a relative path of plain names", f.Name)
		}
		if seen[f.Name] {
			return bad("file %q named twice", f.Name)
		}
		seen[f.Name] = true
		if len(f.SHA256) != 2*sha256.Size || strings.ToLower(f.SHA256) != f.SHA256 {
			return bad("file %q: sha256 %q is not 64 lowercase hex digits", f.Name, f.SHA256)
		}
		if _, err := hex.DecodeString(f.SHA256); err != nil {
			return bad("file %q: sha256 %q is not 64 lowercase hex digits", f.Name, f.SHA256)
		}
		if f.Size < 0 {
			return bad("file %q: size %d", f.Name, f.Size)
		}
		newBytes += uint64(f.Size)
	}
	if m.NewFiles > uint64(len(m.Files)) || m.NewBytes > newBytes {
		return bad("new files %d (%d bytes) exceed its %d files (%d bytes)", m.NewFiles, m.NewBytes, len(m.Files), newBytes)
	}
	return nil
}

// localPath reports whether name is a path a restore may create below the
// engine directory: relative, parts separated by "/", none of them empty,
// "." or "..", no backslash and no NUL.
func localPath(name string) bool {
	if name == "" || strings.ContainsAny(name, "\\\x00") {
		return false
	}
	for part := range strings.SplitSeq(name, "/") {
		if part == "" || part == "." || part == ".." {
			return false
		}
	}
	return true
}

// checkLog refuses a log version a restore could not use: its base must
// be an earlier version, and its log objects must follow each other with
// no gap or overlap from BaseIndex+1 to RaftIndex (the first may start
// before BaseIndex+1, the last may end after RaftIndex, no other object
// lies wholly past it), each with a well-formed hash.
// A version with no new entry (RaftIndex == BaseIndex) names no object.
func (m *Manifest) checkLog(bad func(string, ...any) error) error {
	if len(m.Files) != 0 {
		return bad("a log version names engine files")
	}
	if m.Base == 0 || m.Base >= m.Version {
		return bad("base version %d, want one before it", m.Base)
	}
	if m.RaftIndex < m.BaseIndex {
		return bad("raft index %d below its base's %d", m.RaftIndex, m.BaseIndex)
	}
	if m.RaftIndex == m.BaseIndex {
		if len(m.Log) != 0 {
			return bad("no entry after its base, yet %d log objects", len(m.Log))
		}
		return nil
	}
	next := m.BaseIndex + 1
	var size uint64
	for i, o := range m.Log {
		if o.First == 0 || o.Last < o.First || (i == 0 && (o.First > next || o.Last < next)) || (i > 0 && o.First != next) {
			return bad("log object %d-%d does not continue from index %d", o.First, o.Last, next)
		}
		if i < len(m.Log)-1 && o.Last >= m.RaftIndex {
			return bad("log object %d-%d reaches the version's index %d, yet more follow", o.First, o.Last, m.RaftIndex)
		}
		if len(o.SHA256) != 2*sha256.Size || strings.ToLower(o.SHA256) != o.SHA256 {
			return bad("log object %d-%d: sha256 %q is not 64 lowercase hex digits", o.First, o.Last, o.SHA256)
		}
		if _, err := hex.DecodeString(o.SHA256); err != nil {
			return bad("log object %d-%d: sha256 %q is not 64 lowercase hex digits", o.First, o.Last, o.SHA256)
		}
		if o.Size <= 0 {
			return bad("log object %d-%d: size %d", o.First, o.Last, o.Size)
		}
		size += uint64(o.Size)
		next = o.Last + 1
	}
	if next <= m.RaftIndex {
		return bad("log objects end at index %d, before the version's %d", next-1, m.RaftIndex)
	}
	if m.NewFiles > uint64(len(m.Log)) || m.NewBytes > size {
		return bad("new objects %d (%d bytes) exceed its %d log objects (%d bytes)", m.NewFiles, m.NewBytes, len(m.Log), size)
	}
	return nil
}

// sha256Hex is the lowercase hex SHA-256 of b.
func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
