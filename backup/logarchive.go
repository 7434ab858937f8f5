package backup

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// The archived raft log (docs/backup.md, "Point-in-time restore"): objects
// log/<first>-<last>, each the entries first..last behind a header line.
const (
	logPrefix = "log/"
	// logFormat is the version of a log object's layout that is written:
	// 2 adds the samples block (FORMAT.md, "Archived log"); 1 is still
	// read.
	logFormat = 2
	// maxLogHeader bounds a log object's header line.
	maxLogHeader = 4 << 10
	// maxLogObjectBytes bounds a log object's entries when reading.
	maxLogObjectBytes = 1 << 30
	// archiveChunkBytes is about how many bytes of entries one log object
	// holds when written.
	archiveChunkBytes = 16 << 20
)

// ErrLogGap: the archived log does not continue from where it must (the
// member's log was truncated past it, or an object is missing).
var ErrLogGap = errors.New("backup: the archived raft log has a gap")

// LogSource is the raft log as the archiver reads it: raft.Storage's
// FirstIndex and Entries (raftlog.Log).
type LogSource interface {
	FirstIndex() (uint64, error)
	Entries(lo, hi, maxSize uint64) ([]*raftpb.Entry, error)
}

// logHeader is the first line of a log object.
type logHeader struct {
	Format int    `json:"format"`
	First  uint64 `json:"first"`
	Last   uint64 `json:"last"`
	// Samples is how many TimeSamples the samples block holds, and
	// SamplesSHA256 the hex SHA-256 of that block alone (format 2).
	Samples       int    `json:"samples,omitempty"`
	SamplesSHA256 string `json:"samples_sha256,omitempty"`
	// SHA256 is the hex SHA-256 of every byte after the header line.
	SHA256 string `json:"sha256"`
}

// logName is the object name of the archived entries first..last.
func logName(first, last uint64) string {
	return fmt.Sprintf("%s%020d-%020d", logPrefix, first, last)
}

// parseLogName returns the range a log object's name holds.
func parseLogName(name string) (first, last uint64, ok bool) {
	s, ok := strings.CutPrefix(name, logPrefix)
	if !ok {
		return 0, 0, false
	}
	a, b, ok := strings.Cut(s, "-")
	if !ok || len(a) != 20 || len(b) != 20 {
		return 0, 0, false
	}
	first, err1 := strconv.ParseUint(a, 10, 64)
	last, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil || first == 0 || last < first {
		return 0, 0, false
	}
	return first, last, true
}

// LogRange is one archived log object's range of indexes.
type LogRange struct {
	First, Last uint64
}

// ArchivedLog returns the ranges of the archived log objects in t, by
// first index.
func ArchivedLog(ctx context.Context, t Target) ([]LogRange, error) {
	objs, err := t.List(ctx, logPrefix)
	if err != nil {
		return nil, err
	}
	var out []LogRange
	for _, o := range objs {
		if first, last, ok := parseLogName(o.Name); ok {
			out = append(out, LogRange{First: first, Last: last})
		}
	}
	return out, nil // List sorts by name; the zero padding sorts by index
}

// encodeLog returns a log object holding ents (contiguous, not empty) and
// samples (ordered, each index in the object's first-1..last).
func encodeLog(ents []*raftpb.Entry, samples []TimeSample) ([]byte, error) {
	var body bytes.Buffer
	first, last := ents[0].GetIndex(), ents[len(ents)-1].GetIndex()
	sb := encodeSamples(samples)
	if _, err := decodeSamples(sb, first, last); err != nil {
		return nil, fmt.Errorf("backup: archive entries %d-%d: %w", first, last, err)
	}
	body.Write(sb)
	var lenBuf [binary.MaxVarintLen64]byte
	for i, e := range ents {
		if i > 0 && e.GetIndex() != ents[i-1].GetIndex()+1 {
			return nil, fmt.Errorf("backup: archive entries %d then %d: not contiguous", ents[i-1].GetIndex(), e.GetIndex())
		}
		raw, err := proto.Marshal(e)
		if err != nil {
			return nil, fmt.Errorf("backup: encode entry %d: %w", e.GetIndex(), err)
		}
		body.Write(lenBuf[:binary.PutUvarint(lenBuf[:], uint64(len(raw)))])
		body.Write(raw)
	}
	sum := sha256.Sum256(body.Bytes())
	ssum := sha256.Sum256(sb)
	h, err := json.Marshal(logHeader{Format: logFormat, First: first, Last: last,
		Samples: len(samples), SamplesSHA256: hex.EncodeToString(ssum[:]), SHA256: hex.EncodeToString(sum[:])})
	if err != nil {
		return nil, err
	}
	return append(append(h, '\n'), body.Bytes()...), nil
}

// readLogHeader reads and checks the header line of the log object
// first..last, and returns the rest of r after it.
func readLogHeader(r io.Reader, first, last uint64) (*bufio.Reader, logHeader, error) {
	var h logHeader
	br := bufio.NewReader(io.LimitReader(r, maxLogHeader+maxLogObjectBytes+1))
	line, err := br.ReadSlice('\n')
	if err != nil {
		return nil, h, fmt.Errorf("%w: log object %d-%d: header: %v", ErrCorrupt, first, last, err)
	}
	if err := json.Unmarshal(line, &h); err != nil {
		return nil, h, fmt.Errorf("%w: log object %d-%d: header: %v", ErrCorrupt, first, last, err)
	}
	if h.Format != 1 && h.Format != 2 || h.First != first || h.Last != last {
		return nil, h, fmt.Errorf("%w: log object %d-%d: header says format %d, entries %d-%d", ErrCorrupt, first, last, h.Format, h.First, h.Last)
	}
	if h.Format == 1 && (h.Samples != 0 || h.SamplesSHA256 != "") || h.Samples < 0 || h.Samples > maxLogObjectBytes/sampleBytes {
		return nil, h, fmt.Errorf("%w: log object %d-%d: header says format %d, %d samples", ErrCorrupt, first, last, h.Format, h.Samples)
	}
	return br, h, nil
}

// decodeLog checks and decodes a log object named for first..last: its
// entries and its samples (none in format 1).
func decodeLog(r io.Reader, first, last uint64) ([]*raftpb.Entry, []TimeSample, error) {
	br, h, err := readLogHeader(r, first, last)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(br)
	if err != nil {
		return nil, nil, fmt.Errorf("log object %d-%d: %w", first, last, err)
	}
	if len(body) > maxLogObjectBytes {
		return nil, nil, fmt.Errorf("%w: log object %d-%d: more than %d bytes", ErrCorrupt, first, last, maxLogObjectBytes)
	}
	if sum := sha256.Sum256(body); hex.EncodeToString(sum[:]) != h.SHA256 {
		return nil, nil, fmt.Errorf("%w: log object %d-%d: sha256 mismatch", ErrCorrupt, first, last)
	}
	if sb := h.Samples * sampleBytes; sb > len(body) {
		return nil, nil, fmt.Errorf("%w: log object %d-%d: %d samples in %d bytes", ErrCorrupt, first, last, h.Samples, len(body))
	}
	sb := body[:h.Samples*sampleBytes]
	if h.Format == 2 {
		if sum := sha256.Sum256(sb); hex.EncodeToString(sum[:]) != h.SamplesSHA256 {
			return nil, nil, fmt.Errorf("%w: log object %d-%d: samples sha256 mismatch", ErrCorrupt, first, last)
		}
	}
	samples, err := decodeSamples(sb, first, last)
	if err != nil {
		return nil, nil, err
	}
	body = body[len(sb):]
	var ents []*raftpb.Entry
	for want := first; len(body) > 0; want++ {
		n, k := binary.Uvarint(body)
		if k <= 0 || n > uint64(len(body)-k) {
			return nil, nil, fmt.Errorf("%w: log object %d-%d: entry %d: bad length", ErrCorrupt, first, last, want)
		}
		e := &raftpb.Entry{}
		if err := proto.Unmarshal(body[k:k+int(n)], e); err != nil {
			return nil, nil, fmt.Errorf("%w: log object %d-%d: entry %d: %v", ErrCorrupt, first, last, want, err)
		}
		if e.GetIndex() != want {
			return nil, nil, fmt.Errorf("%w: log object %d-%d: entry %d holds index %d", ErrCorrupt, first, last, want, e.GetIndex())
		}
		ents = append(ents, e)
		body = body[k+int(n):]
	}
	if len(ents) == 0 || ents[len(ents)-1].GetIndex() != last {
		return nil, nil, fmt.Errorf("%w: log object %d-%d: entries end early", ErrCorrupt, first, last)
	}
	return ents, samples, nil
}

// ArchiveReport is what ArchiveLog wrote.
type ArchiveReport struct {
	// Objects, Entries and Bytes count what was written.
	Objects, Entries, Bytes uint64
	// First and Last are the range written (0 if nothing).
	First, Last uint64
}

// ArchiveLog archives the entries of src after the last archived one, up
// to applied, each object with the samples of samples (nil: none) that
// fall in its range (docs/backup.md, "Point-in-time restore", rules 1 to
// 3 and 7):
// from the last archived index + 1, or, with no archive or when src no
// longer holds that index, from the latest version's index + 1. With no
// version in t it archives nothing.
func ArchiveLog(ctx context.Context, t Target, src LogSource, applied uint64, samples *Sampler) (ArchiveReport, error) {
	var rep ArchiveReport
	ranges, err := ArchivedLog(ctx, t)
	if err != nil {
		return rep, fmt.Errorf("backup: archive log: %w", err)
	}
	latest, err := latestVersion(ctx, t)
	if err != nil || latest == 0 {
		return rep, err
	}
	m, err := ReadManifest(ctx, t, latest)
	if err != nil {
		return rep, fmt.Errorf("backup: archive log: %w", err)
	}
	from := m.RaftIndex + 1
	if len(ranges) > 0 {
		if next := ranges[len(ranges)-1].Last + 1; next > from || firstIndexAtMost(src, next) {
			from = next
		}
	}
	if !firstIndexAtMost(src, from) {
		return rep, fmt.Errorf("%w: the raft log no longer holds entry %d", ErrLogGap, from)
	}
	_, err = archiveRange(ctx, t, src, from, applied, samples, &rep)
	return rep, err
}

// archivedObject is one log object archiveRange put in the target: its
// range, and the SHA-256 and size of the bytes written; existed says the
// name was taken already (another writer's object of the same range,
// possibly with other samples), so SHA256 is not known and is empty.
type archivedObject struct {
	LogObject
	existed bool
}

// archiveRange archives the entries from..to of src as log objects (about
// archiveChunkBytes each), each carrying the samples in its range, and
// counts them in rep. A log that no longer holds from is ErrLogGap.
func archiveRange(ctx context.Context, t Target, src LogSource, from, to uint64, samples *Sampler, rep *ArchiveReport) ([]archivedObject, error) {
	var out []archivedObject
	for from <= to {
		ents, err := src.Entries(from, to+1, archiveChunkBytes)
		if errors.Is(err, raft.ErrCompacted) {
			return out, fmt.Errorf("%w: the raft log no longer holds entry %d", ErrLogGap, from)
		}
		if err != nil {
			return out, fmt.Errorf("backup: archive log: read entries from %d: %w", from, err)
		}
		if len(ents) == 0 {
			break
		}
		last := ents[len(ents)-1].GetIndex()
		raw, err := encodeLog(ents, samples.within(from, last))
		if err != nil {
			return out, err
		}
		obj := archivedObject{LogObject: LogObject{First: from, Last: last, SHA256: sha256Hex(raw), Size: int64(len(raw))}}
		if err := t.Put(ctx, logName(from, last), bytes.NewReader(raw), int64(len(raw))); errors.Is(err, ErrExist) {
			obj.existed, obj.SHA256, obj.Size = true, "", 0
		} else if err != nil {
			return out, fmt.Errorf("backup: archive log %d-%d: %w", from, last, err)
		}
		out = append(out, obj)
		// In the target now (or another writer's object of the same
		// range is): forget them (Sampler invariant 3).
		samples.drop(last)
		if rep.First == 0 {
			rep.First = from
		}
		rep.Last = last
		rep.Objects++
		rep.Entries += uint64(len(ents))
		rep.Bytes += uint64(len(raw))
		from = last + 1
	}
	return out, nil
}

// ArchiveLog runs ArchiveLog on the Backuper's target, serialised with
// Create and Prune (a prune deletes log objects), and counts it in Stats.
func (b *Backuper) ArchiveLog(ctx context.Context, src LogSource, applied uint64, samples *Sampler) (ArchiveReport, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	rep, err := ArchiveLog(ctx, b.cfg.Target, src, applied, samples)
	b.stats.logEntries.Add(rep.Entries)
	b.stats.logBytes.Add(rep.Bytes)
	if rep.Last != 0 {
		b.stats.logLastIndex.Store(rep.Last)
	}
	if errors.Is(err, ErrLogGap) {
		b.stats.logGaps.Add(1)
	}
	return rep, err
}

// firstIndexAtMost reports whether src still holds index i (its first
// index is at most i).
func firstIndexAtMost(src LogSource, i uint64) bool {
	first, err := src.FirstIndex()
	return err == nil && first <= i
}

// forEachArchived calls fn with each archived entry from index from on,
// in order, until fn says stop or the archive ends; it returns the index
// after the last entry given to fn. Log objects must continue each other
// from from on (ErrLogGap otherwise); each is checked before its entries
// are given.
func forEachArchived(ctx context.Context, t Target, from uint64, fn func(*raftpb.Entry) (stop bool, err error)) (uint64, error) {
	ranges, err := ArchivedLog(ctx, t)
	if err != nil {
		return from, err
	}
	next := from
	for _, r := range ranges {
		if r.Last < next {
			continue
		}
		if r.First > next {
			return next, fmt.Errorf("%w: entry %d is in no log object (the next starts at %d)", ErrLogGap, next, r.First)
		}
		rc, err := t.Get(ctx, logName(r.First, r.Last))
		if err != nil {
			return next, fmt.Errorf("read log object %d-%d: %w", r.First, r.Last, err)
		}
		ents, _, err := decodeLog(rc, r.First, r.Last)
		rc.Close()
		if err != nil {
			return next, err
		}
		for _, e := range ents {
			if e.GetIndex() < next {
				continue
			}
			stop, err := fn(e)
			if err != nil {
				return next, err
			}
			if stop {
				return next, nil
			}
			next = e.GetIndex() + 1
		}
	}
	return next, nil
}

// LogReport is what VerifyLog found.
type LogReport struct {
	// Objects and Entries count the log objects read and their entries.
	Objects, Entries int
	// Bad describes every log object that is missing, damaged or does not
	// match its name.
	Bad []string
}

// VerifyLog reads and checks every archived log object of t (header,
// SHA-256, entry indexes; FORMAT.md, "Archived log"). It returns an error
// wrapping ErrCorrupt if any is damaged, after checking them all. Gaps
// between objects are not errors: `strata backup list` shows them.
func VerifyLog(ctx context.Context, t Target) (LogReport, error) {
	var rep LogReport
	ranges, err := ArchivedLog(ctx, t)
	if err != nil {
		return rep, fmt.Errorf("verify log: %w", err)
	}
	for _, r := range ranges {
		rep.Objects++
		rc, err := t.Get(ctx, logName(r.First, r.Last))
		if err != nil {
			if !errors.Is(err, ErrNotExist) {
				return rep, fmt.Errorf("verify log: %w", err)
			}
			rep.Bad = append(rep.Bad, fmt.Sprintf("%s: %v", logName(r.First, r.Last), err))
			continue
		}
		ents, _, err := decodeLog(rc, r.First, r.Last)
		rc.Close()
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				return rep, fmt.Errorf("verify log: %w", err)
			}
			rep.Bad = append(rep.Bad, fmt.Sprintf("%s: %v", logName(r.First, r.Last), err))
			continue
		}
		rep.Entries += len(ents)
	}
	if len(rep.Bad) > 0 {
		return rep, fmt.Errorf("verify log: %w: %d of %d log objects bad: %s", ErrCorrupt, len(rep.Bad), rep.Objects, strings.Join(rep.Bad, "; "))
	}
	return rep, nil
}
