package backup

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/raft/v3/raftpb"
)

// Format is the version of the target layout and manifest (FORMAT.md).
const Format = 1

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
	// Name is the engine file's name in the checkpoint (no directory).
	Name string `json:"name"`
	// SHA256 is the lowercase hex SHA-256 of its bytes; the target holds
	// them under files/<SHA256>.
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// Manifest is one version of the backed-up engine (FORMAT.md, "Manifests").
type Manifest struct {
	Version         uint64    `json:"version"`
	Created         time.Time `json:"created"`
	ClusterID       ID        `json:"cluster_id"`
	MemberID        ID        `json:"member_id"`
	RaftIndex       uint64    `json:"raft_index"`
	RaftTerm        uint64    `json:"raft_term"`
	ConfState       ConfState `json:"conf_state"`
	Revision        int64     `json:"revision"`
	CompactRevision int64     `json:"compact_revision"`
	Files           []File    `json:"files"`
	NewFiles        uint64    `json:"new_files"`
	NewBytes        uint64    `json:"new_bytes"`
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
	body, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode manifest %d: %w", m.Version, err)
	}
	out, err := json.Marshal(envelope{Format: Format, SHA256: sha256Hex(body), Body: body})
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
	if env.Format != Format {
		return nil, fmt.Errorf("%w: manifest format %d, this strata reads %d", ErrCorrupt, env.Format, Format)
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
	if len(m.Files) == 0 {
		return bad("no files")
	}
	seen := make(map[string]bool, len(m.Files))
	var newBytes uint64
	for _, f := range m.Files {
		if f.Name == "" || f.Name == "." || f.Name == ".." || strings.ContainsAny(f.Name, "/\\\x00") || path.Base(f.Name) != f.Name {
			return bad("file name %q is not a plain name", f.Name)
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

// sha256Hex is the lowercase hex SHA-256 of b.
func sha256Hex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
