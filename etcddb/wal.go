package etcddb

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Records of the WAL's record types, as etcd numbers them.
const (
	walMetadataType int64 = iota + 1
	walEntryType
	walStateType
	walCrcType
	walSnapshotType
)

// Errors of a WAL that cannot be read, in etcd's words.
var (
	// ErrWALCRCMismatch is a record whose CRC breaks the chain.
	ErrWALCRCMismatch = errors.New("wal: crc mismatch")
	// ErrWALFileNotFound is a WAL directory without WAL files.
	ErrWALFileNotFound = errors.New("wal: file not found")
	// ErrWALSliceOutOfRange is an entry that does not follow the entries
	// read before it, or a gap in the files' sequence numbers.
	ErrWALSliceOutOfRange = errors.New("wal: slice bounds out of range")
	// ErrNotWAL is a file that does not start as an etcd WAL file does.
	ErrNotWAL = errors.New("not an etcd WAL file")
	// ErrWALShort is a WAL that does not hold the entries a migration
	// needs: it ends before the database's consistent index, or starts
	// after it (files missing), or its commit index is past its entries.
	ErrWALShort = errors.New("etcd WAL does not reach the database's consistent index")
)

var walCRCTable = crc32.MakeTable(crc32.Castagnoli)

// WAL is what ReadWAL found in a WAL directory.
type WAL struct {
	// Files are the WAL files read, in order.
	Files []string
	// NodeID and ClusterID are the metadata record's.
	NodeID, ClusterID uint64
	// HardState is the last state record: its Commit is the last index
	// the cluster committed as far as this member knew.
	HardState *raftpb.HardState
	// SnapshotIndex is the index of the newest snapshot record.
	SnapshotIndex uint64
	// FirstIndex and LastIndex are the first and last entry indexes the
	// WAL holds (0, 0 if it holds none).
	FirstIndex, LastIndex uint64
	// Entries are the entries after the index ReadWAL was given, up to
	// LastIndex, in index order. Those past HardState.Commit were not
	// known to be committed when the member wrote its last state record:
	// in a one-member cluster they are committed (etcd applies and
	// acknowledges an entry before the state record that says so is
	// written, and commits its whole log when it restarts); in a larger
	// cluster they may be committed or be overwritten by a new leader.
	Entries []*raftpb.Entry
	// Torn is set when the last file ended with a partially written
	// record, which was left out as etcd leaves it out.
	Torn bool
}

// ReadWAL reads the WAL in dir (an etcd member's member/wal) and returns
// its entries after index after (the database's consistent index). It
// refuses a WAL whose CRC chain breaks, whose files' sequence has a gap, a
// file that is not etcd's WAL, and a WAL that does not hold every entry
// from after+1 to its last, or to its commit index, or ends before after
// (ErrWALShort). The format is described in the package comment.
func ReadWAL(dir string, after uint64) (*WAL, error) {
	names, err := walNames(dir)
	if err != nil {
		return nil, err
	}
	d := newWALDecoder(after)
	for i, name := range names {
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("read etcd WAL: %w", err)
		}
		if err := d.file(name, raw, i == len(names)-1); err != nil {
			return nil, fmt.Errorf("read etcd WAL %s: %w", filepath.Join(dir, name), err)
		}
	}
	w, err := d.finish()
	if err != nil {
		return nil, fmt.Errorf("read etcd WAL %s: %w", dir, err)
	}
	w.Files = names
	return w, nil
}

// walNames lists dir's WAL files in sequence order, refusing a gap.
func walNames(dir string) ([]string, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("read etcd WAL %s: %w", dir, ErrWALFileNotFound)
		}
		return nil, fmt.Errorf("read etcd WAL: %w", err)
	}
	var names []string
	for _, de := range des {
		if _, _, ok := parseWALName(de.Name()); ok && de.Type().IsRegular() {
			names = append(names, de.Name())
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("read etcd WAL %s: %w", dir, ErrWALFileNotFound)
	}
	slices.Sort(names)
	for i := 1; i < len(names); i++ {
		prev, _, _ := parseWALName(names[i-1])
		cur, _, _ := parseWALName(names[i])
		if cur != prev+1 {
			return nil, fmt.Errorf("read etcd WAL %s: %w: file sequence %x follows %x (WAL files missing)", dir, ErrWALSliceOutOfRange, cur, prev)
		}
	}
	return names, nil
}

func parseWALName(name string) (seq, index uint64, ok bool) {
	if !strings.HasSuffix(name, ".wal") || len(name) != 16+1+16+4 {
		return 0, 0, false
	}
	_, err := fmt.Sscanf(name, "%016x-%016x.wal", &seq, &index)
	return seq, index, err == nil
}

// walDecoder decodes a WAL's files in order.
type walDecoder struct {
	after uint64
	crc   uint32
	// started is set once a crc record set the running CRC.
	started bool
	w       WAL
	// ents are the entries from after+1 on; held says whether any entry
	// was read at all.
	ents []*raftpb.Entry
	held bool
	done bool // a torn record ended the last file
}

func newWALDecoder(after uint64) *walDecoder {
	return &walDecoder{after: after}
}

// walRecord is a decoded walpb.Record.
type walRecord struct {
	typ    int64
	crc    uint32
	hasCRC bool
	data   []byte
}

func decodeWALRecord(b []byte) (walRecord, error) {
	var r walRecord
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return r, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return r, protowire.ParseError(n)
			}
			r.typ, b = int64(v), b[n:]
		case num == 2 && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return r, protowire.ParseError(n)
			}
			r.crc, r.hasCRC, b = uint32(v), true, b[n:]
		case num == 3 && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return r, protowire.ParseError(n)
			}
			r.data, b = v, b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return r, protowire.ParseError(n)
			}
			b = b[n:]
		}
	}
	return r, nil
}

// file decodes one file's bytes; last says whether it is the WAL's last
// file, where a torn record ends the WAL.
func (d *walDecoder) file(name string, raw []byte, last bool) error {
	if d.done {
		return nil
	}
	off := 0
	first := true
	for {
		if len(raw)-off < 8 {
			if len(raw)-off == 0 || allZero(raw[off:]) {
				return nil
			}
			return fmt.Errorf("%w: %d bytes at offset %d are not a frame (a truncated WAL file)", io.ErrUnexpectedEOF, len(raw)-off, off)
		}
		lenField := binary.LittleEndian.Uint64(raw[off:])
		if lenField == 0 {
			if first {
				return fmt.Errorf("%w: no records", ErrNotWAL)
			}
			return nil // the end of the records, or preallocated space
		}
		recBytes := lenField &^ (uint64(0xff) << 56)
		var padBytes uint64
		if lenField>>63 == 1 {
			padBytes = (lenField >> 56) & 0x7
		}
		end := uint64(off) + 8 + recBytes + padBytes
		if recBytes > uint64(len(raw)) || end > uint64(len(raw)) {
			if first {
				return fmt.Errorf("%w: the first frame's length %d exceeds the file's %d bytes", ErrNotWAL, recBytes, len(raw))
			}
			// etcd preallocates its files and a torn write leaves zeros
			// (isTorn), and etcd's repair cuts a file at a record's end:
			// a record that runs past the end is a truncated file.
			return fmt.Errorf("%w: a record of %d bytes at offset %d runs past the end of the file (a truncated WAL file)", io.ErrUnexpectedEOF, recBytes, off)
		}
		data := raw[uint64(off)+8 : uint64(off)+8+recBytes]
		err := d.record(data, first)
		if err != nil {
			if first && !errors.Is(err, ErrWALCRCMismatch) && !errors.Is(err, ErrWALSliceOutOfRange) {
				return fmt.Errorf("%w: %v", ErrNotWAL, err)
			}
			if last && isTorn(raw[uint64(off)+8:end], off+8) {
				d.w.Torn, d.done = true, true
				return nil
			}
			return fmt.Errorf("%w (record at offset %d)", err, off)
		}
		first = false
		off = int(end)
	}
}

// isTorn is etcd's torn-write test: a record one of whose 512-byte sectors
// is all zeros was not written whole.
func isTorn(data []byte, fileOff int) bool {
	for len(data) > 0 {
		n := min(512-fileOff%512, len(data))
		if allZero(data[:n]) {
			return true
		}
		data, fileOff = data[n:], fileOff+n
	}
	return false
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// record decodes and checks one record and takes in what it says.
func (d *walDecoder) record(raw []byte, firstOfFile bool) error {
	r, err := decodeWALRecord(raw)
	if err != nil {
		return fmt.Errorf("decode record: %w", err)
	}
	if firstOfFile && r.typ != walCrcType {
		return fmt.Errorf("first record of type %d, want a crc record", r.typ)
	}
	if r.typ == walCrcType {
		// A new file: its crc record carries the running CRC of the file
		// before it, which a WAL read from its start must match.
		if d.started && r.crc != d.crc {
			return fmt.Errorf("%w: the file starts from crc %08x, the file before it ends at %08x", ErrWALCRCMismatch, r.crc, d.crc)
		}
		d.crc, d.started = r.crc, true
		return nil
	}
	d.crc = crc32.Update(d.crc, walCRCTable, r.data)
	if !r.hasCRC || r.crc != d.crc {
		return fmt.Errorf("%w: expected: %x computed: %x", ErrWALCRCMismatch, r.crc, d.crc)
	}
	switch r.typ {
	case walMetadataType:
		d.w.NodeID, d.w.ClusterID = decodeWALMetadata(r.data)
	case walEntryType:
		e := &raftpb.Entry{}
		if err := proto.Unmarshal(r.data, e); err != nil {
			return fmt.Errorf("decode entry: %w", err)
		}
		return d.entry(e)
	case walStateType:
		hs := &raftpb.HardState{}
		if err := proto.Unmarshal(r.data, hs); err != nil {
			return fmt.Errorf("decode state: %w", err)
		}
		d.w.HardState = hs
	case walSnapshotType:
		index, err := decodeWALSnapshotIndex(r.data)
		if err != nil {
			return fmt.Errorf("decode snapshot record: %w", err)
		}
		d.w.SnapshotIndex = max(d.w.SnapshotIndex, index)
	default:
		return fmt.Errorf("unexpected block type %d", r.typ)
	}
	return nil
}

// entry takes in one entry: it follows the last entry read, or
// overwrites entries read from its index on.
func (d *walDecoder) entry(e *raftpb.Entry) error {
	i := e.GetIndex()
	switch {
	case !d.held:
		d.held, d.w.FirstIndex = true, i
	case i > d.w.LastIndex+1:
		return fmt.Errorf("%w: entry %d follows entry %d", ErrWALSliceOutOfRange, i, d.w.LastIndex)
	case i < d.w.FirstIndex:
		// A rewrite before the first entry held: everything read is
		// replaced.
		d.w.FirstIndex = i
	}
	d.w.LastIndex = i
	if i <= d.after {
		d.ents = d.ents[:0]
		return nil
	}
	keep := int(min(uint64(len(d.ents)), i-d.after-1))
	d.ents = append(d.ents[:keep], e)
	return nil
}

// finish checks that the WAL holds what a migration from the database at
// index after needs and returns it.
func (d *walDecoder) finish() (*WAL, error) {
	w := d.w
	if w.HardState == nil {
		return nil, fmt.Errorf("%w: no state record", ErrWALShort)
	}
	commit := w.HardState.GetCommit()
	reach := max(w.LastIndex, w.SnapshotIndex)
	if reach < d.after {
		return nil, fmt.Errorf("%w: the WAL ends at index %d, the database holds index %d (a WAL of another member, or older than the database?)", ErrWALShort, reach, d.after)
	}
	if commit > w.LastIndex && commit > d.after {
		return nil, fmt.Errorf("%w: the WAL's entries end at index %d, before its commit index %d", ErrWALShort, w.LastIndex, commit)
	}
	if w.LastIndex <= d.after {
		return &w, nil
	}
	if w.FirstIndex > d.after+1 {
		return nil, fmt.Errorf("%w: the WAL's entries start at index %d, the database holds index %d: the entries between are missing (WAL files purged or lost)", ErrWALShort, w.FirstIndex, d.after)
	}
	w.Entries = d.ents
	return &w, nil
}

// decodeWALMetadata reads etcdserverpb.Metadata {NodeID = 1, ClusterID = 2};
// a field it cannot read is left 0 (the IDs are for messages only).
func decodeWALMetadata(b []byte) (node, cluster uint64) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return node, cluster
		}
		b = b[n:]
		if typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return node, cluster
			}
			b = b[n:]
			switch num {
			case 1:
				node = v
			case 2:
				cluster = v
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return node, cluster
		}
		b = b[n:]
	}
	return node, cluster
}

// decodeWALSnapshotIndex reads the index of a walpb.Snapshot.
func decodeWALSnapshotIndex(b []byte) (uint64, error) {
	var index uint64
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			index, b = v, b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return index, nil
}
