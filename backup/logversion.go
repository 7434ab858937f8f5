package backup

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/internal/failpoint"
)

// Log versions (FORMAT.md, "Log versions"; docs/backup.md, "Log
// versions"): a version that names a files version, its base, and the
// archived raft log from the base's index + 1 to its own index, instead
// of the engine files. Between two versions Pebble's compactions rewrite
// tables far beyond what changed (docs/bench/backup.md), so a files
// version after a small change uploads many megabytes; the log of that
// change is about the change itself. A restore downloads the base and
// replays the log, so the policy bounds the log a restore replays.

// Policy says when a version may be a log version. A version is a log
// version only if every rule allows it and the member's raft log still
// holds every entry after what the target holds; else it is a files
// version.
type Policy struct {
	// LogRatio bounds the replay: a log version's log objects (the log
	// from its base on) may total at most LogRatio times its base's
	// bytes. 0 turns log versions off.
	LogRatio float64
	// FullEvery, if above 0, makes every FullEvery-th version after a
	// files version a files version again: at most FullEvery-1 log
	// versions share a base.
	FullEvery int
}

// ErrNoLogVersion: a log version was asked for and cannot be taken (the
// message says why: no raft log, a compacted log, the policy).
var ErrNoLogVersion = errors.New("backup: no log version possible")

// logPlan is what planLog found a log version can name and must archive.
type logPlan struct {
	base  *Manifest
	reuse []LogObject // archived objects continuing from base.RaftIndex+1, SHA256 not known yet
	from  uint64      // first index to archive, if at most the checkpoint's
}

// tryLog writes a log version of the checkpoint cp if it can (planLog,
// createLog); else it returns a nil manifest and the reason. force asks
// for one whatever the policy's rules say.
func (b *Backuper) tryLog(ctx context.Context, cp *Manifest, force bool) (*Manifest, string, error) {
	plan, why, err := b.planLog(ctx, cp, force)
	if err != nil {
		return nil, "", fmt.Errorf("backup: %w", err)
	}
	if plan == nil {
		return nil, why, nil
	}
	return b.createLog(ctx, cp, plan)
}

// planLog decides whether the checkpoint described by cp (its applied
// index, revision and so on) can be a log version under the policy (all
// but its log's being held, if force), and what it would name. A nil plan
// comes with the reason; an error is a target that could not be read.
func (b *Backuper) planLog(ctx context.Context, cp *Manifest, force bool) (*logPlan, string, error) {
	p := b.cfg.Policy
	if force {
		p = Policy{LogRatio: math.Inf(1)}
	}
	if b.cfg.Log == nil {
		return nil, "no raft log to read (a stopped member's versions are files versions)", nil
	}
	if p.LogRatio <= 0 {
		return nil, "log versions are off (log ratio 0)", nil
	}
	t := b.cfg.Target
	latestV, err := latestVersion(ctx, t)
	if err != nil {
		return nil, "", err
	}
	if latestV == 0 {
		return nil, "the target holds no version to base it on", nil
	}
	latest, err := ReadManifest(ctx, t, latestV)
	if err != nil {
		return nil, "", err
	}
	base := latest
	if latest.IsLog() {
		if base, err = ReadManifest(ctx, t, latest.Base); err != nil {
			return nil, fmt.Sprintf("the latest version %d's base %d cannot be read (%v)", latest.Version, latest.Base, err), nil
		}
		if base.IsLog() || base.RaftIndex != latest.BaseIndex {
			return nil, fmt.Sprintf("the latest version %d names base %d, which is not its files version", latest.Version, latest.Base), nil
		}
	}
	if base.ClusterID != ID(b.cfg.ID.ClusterID) {
		return nil, fmt.Sprintf("the base version %d is of cluster %x, this member's is %x", base.Version, uint64(base.ClusterID), b.cfg.ID.ClusterID), nil
	}
	if cp.RaftIndex < latest.RaftIndex {
		return nil, fmt.Sprintf("the latest version %d is at index %d, past this member's applied index %d", latest.Version, latest.RaftIndex, cp.RaftIndex), nil
	}
	if p.FullEvery > 0 && latestV+1-base.Version >= uint64(p.FullEvery) {
		return nil, fmt.Sprintf("version %d is %d after its base %d, and every %d is a files version (full-every)", latestV+1, latestV+1-base.Version, base.Version, p.FullEvery), nil
	}
	objs, err := t.List(ctx, logPrefix)
	if err != nil {
		return nil, "", err
	}
	reuse, next := logChain(objs, base.RaftIndex+1, cp.RaftIndex)
	var size int64
	for _, o := range reuse {
		size += o.Size
	}
	if next <= cp.RaftIndex {
		n, err := entryBytes(b.cfg.Log, next, cp.RaftIndex)
		if errors.Is(err, ErrLogGap) {
			return nil, fmt.Sprintf("the target's log reaches index %d and the member's raft log no longer holds entry %d (a snapshot truncated it, or log compaction replaced it by batches)", next-1, next), nil
		}
		if err != nil {
			return nil, "", err
		}
		size += n
	}
	if budget := p.LogRatio * float64(base.Size()); float64(size) > budget {
		return nil, fmt.Sprintf("the log since base version %d would be about %d bytes, above %g of the base's %d bytes (log ratio)", base.Version, size, p.LogRatio, base.Size()), nil
	}
	return &logPlan{base: base, reuse: reuse, from: next}, "", nil
}

// logChain picks, from the archived objects objs, a run of objects that
// continue each other from index from until one reaches to: at each step
// the object holding the next index that reaches furthest. It returns the
// run and the index after it (from if there is none).
func logChain(objs []Object, from, to uint64) ([]LogObject, uint64) {
	var out []LogObject
	next := from
	for next <= to {
		var best *LogObject
		for _, o := range objs {
			first, last, ok := parseLogName(o.Name)
			if ok && first <= next && next <= last && (best == nil || last > best.Last) {
				best = &LogObject{First: first, Last: last, Size: o.Size}
			}
		}
		if best == nil {
			break
		}
		out = append(out, *best)
		next = best.Last + 1
	}
	return out, next
}

// entryBytes returns about how many bytes the entries from..to of src take
// in log objects (each entry's encoding and its length), reading them;
// ErrLogGap if src no longer holds from.
func entryBytes(src LogSource, from, to uint64) (int64, error) {
	if first, err := src.FirstIndex(); err != nil || first > from {
		return 0, fmt.Errorf("%w: the raft log no longer holds entry %d", ErrLogGap, from)
	}
	var n int64
	for from <= to {
		ents, err := src.Entries(from, to+1, archiveChunkBytes)
		if errors.Is(err, raft.ErrCompacted) {
			return 0, fmt.Errorf("%w: the raft log no longer holds entry %d", ErrLogGap, from)
		}
		if err != nil {
			return 0, fmt.Errorf("backup: read entries from %d: %w", from, err)
		}
		if len(ents) == 0 {
			return 0, fmt.Errorf("backup: the raft log gave no entry at %d of %d-%d", from, from, to)
		}
		for _, e := range ents {
			sz := proto.Size(e)
			n += int64(sz + uvarintLen(uint64(sz)))
		}
		from = ents[len(ents)-1].GetIndex() + 1
	}
	return n, nil
}

func uvarintLen(x uint64) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutUvarint(buf[:], x)
}

// createLog writes a log version of the checkpoint cp under plan: the
// entries the target lacks are archived, every object named is hashed
// (read back and checked unless this Backuper wrote it), the base and the
// reused objects are checked once more, and then the manifest is written
// (invariants 1 and 4). A log truncated meanwhile returns a nil manifest
// and the reason. REQUIRES: b.mu held.
func (b *Backuper) createLog(ctx context.Context, cp *Manifest, plan *logPlan) (*Manifest, string, error) {
	t := b.cfg.Target
	m := *cp
	m.Kind, m.Base, m.BaseIndex, m.Files = KindLog, plan.base.Version, plan.base.RaftIndex, nil
	named := append([]LogObject(nil), plan.reuse...)
	var rep ArchiveReport
	if plan.from <= cp.RaftIndex {
		written, err := archiveRange(ctx, t, b.cfg.Log, plan.from, cp.RaftIndex, b.cfg.Samples, &rep)
		b.stats.logEntries.Add(rep.Entries)
		b.stats.logBytes.Add(rep.Bytes)
		if errors.Is(err, ErrLogGap) {
			return nil, fmt.Sprintf("the member's raft log was truncated while archiving (%v)", err), nil
		}
		if err != nil {
			return nil, "", err
		}
		for _, w := range written {
			if !w.existed {
				m.NewFiles++
				m.NewBytes += uint64(w.Size)
				b.logSums[logName(w.First, w.Last)] = w.LogObject
			}
			named = append(named, w.LogObject)
		}
		if rep.Last != 0 {
			b.stats.logLastIndex.Store(rep.Last)
		}
	}
	for i, o := range named {
		if o.SHA256 != "" {
			continue
		}
		obj, err := b.checkedLogObject(ctx, o.First, o.Last)
		if err != nil {
			return nil, "", fmt.Errorf("backup: log version: %w", err)
		}
		named[i] = obj
	}
	m.Log = named
	// Invariant 1 with another writer (as for reused files): what this
	// version did not write is checked once more just before the manifest.
	if _, err := t.Stat(ctx, manifestName(plan.base.Version)); err != nil {
		return nil, "", fmt.Errorf("backup: log version: base version %d: %w", plan.base.Version, err)
	}
	for _, o := range plan.reuse {
		if obj, err := t.Stat(ctx, logName(o.First, o.Last)); err != nil || obj.Size != o.Size {
			return nil, "", fmt.Errorf("backup: log version: log object %d-%d went or changed before the manifest (another writer pruning?): %v", o.First, o.Last, err)
		}
	}
	last, err := latestVersion(ctx, t)
	if err != nil {
		return nil, "", fmt.Errorf("backup: %w", err)
	}
	m.Version = last + 1
	raw, err := EncodeManifest(&m)
	if err != nil {
		return nil, "", fmt.Errorf("backup: %w", err)
	}
	failpoint.Hit("backup/before-manifest")
	if err := t.Put(ctx, manifestName(m.Version), bytes.NewReader(raw), int64(len(raw))); err != nil {
		return nil, "", fmt.Errorf("backup: write manifest of version %d: %w", m.Version, err)
	}
	b.cfg.Logger.Info("backup: log version written", zap.Uint64("version", m.Version), zap.Uint64("base", m.Base),
		zap.Uint64("index", m.RaftIndex), zap.Int64("revision", m.Revision), zap.Int("log-objects", len(m.Log)),
		zap.Uint64("new-objects", m.NewFiles), zap.Uint64("new-bytes", m.NewBytes))
	return &m, "", nil
}

// checkedLogObject reads the log object first..last, checks it (decodeLog)
// and returns its hash and size, from b.logSums if this Backuper wrote or
// checked it before. REQUIRES: b.mu held.
func (b *Backuper) checkedLogObject(ctx context.Context, first, last uint64) (LogObject, error) {
	name := logName(first, last)
	if o, ok := b.logSums[name]; ok {
		return o, nil
	}
	raw, err := readLogObject(ctx, b.cfg.Target, first, last)
	if err != nil {
		return LogObject{}, err
	}
	if _, _, err := decodeLog(bytes.NewReader(raw), first, last); err != nil {
		return LogObject{}, err
	}
	o := LogObject{First: first, Last: last, SHA256: sha256Hex(raw), Size: int64(len(raw))}
	b.logSums[name] = o
	return o, nil
}

// readLogObject reads the whole log object first..last, at most
// maxLogHeader+maxLogObjectBytes bytes.
func readLogObject(ctx context.Context, t Target, first, last uint64) ([]byte, error) {
	rc, err := t.Get(ctx, logName(first, last))
	if err != nil {
		return nil, fmt.Errorf("read log object %d-%d: %w", first, last, err)
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(&ctxReader{ctx: ctx, r: rc}, maxLogHeader+maxLogObjectBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read log object %d-%d: %w", first, last, err)
	}
	return raw, nil
}

// versionLog is the log a log version names, as an EntrySource: each
// object is read, checked against the manifest's hash and size, then
// decoded (decodeLog) before any of its entries is given.
type versionLog struct {
	t Target
	m *Manifest
}

// Held returns the range the version's objects cover.
func (v versionLog) Held(context.Context, uint64) ([]LogRange, error) {
	if len(v.m.Log) == 0 {
		return nil, nil
	}
	return []LogRange{{First: v.m.Log[0].First, Last: v.m.Log[len(v.m.Log)-1].Last}}, nil
}

// Entries gives the entries first..last from the version's objects.
func (v versionLog) Entries(ctx context.Context, _ uint64, first, last uint64, fn func(*raftpb.Entry) (bool, error)) error {
	for _, o := range v.m.Log {
		if o.Last < first || o.First > last {
			continue
		}
		ents, err := readVersionObject(ctx, v.t, v.m, o)
		if err != nil {
			return err
		}
		for _, e := range ents {
			if e.GetIndex() < first || e.GetIndex() > last {
				continue
			}
			if stop, err := fn(e); err != nil || stop {
				return err
			}
		}
	}
	return nil
}

func (v versionLog) String() string {
	return fmt.Sprintf("the log of version %d in %s", v.m.Version, v.t)
}

// readVersionObject reads the log object o of log version m and checks it
// against the manifest (size, SHA-256) and its own header and checksums.
// Errors wrap ErrCorrupt or ErrNotExist and name the version and object.
func readVersionObject(ctx context.Context, t Target, m *Manifest, o LogObject) ([]*raftpb.Entry, error) {
	raw, err := readLogObject(ctx, t, o.First, o.Last)
	if err != nil {
		return nil, fmt.Errorf("log version %d: %w", m.Version, err)
	}
	switch {
	case int64(len(raw)) != o.Size:
		return nil, fmt.Errorf("%w: log version %d: %s holds %d bytes, the manifest says %d", ErrCorrupt, m.Version, logName(o.First, o.Last), len(raw), o.Size)
	case sha256Hex(raw) != o.SHA256:
		return nil, fmt.Errorf("%w: log version %d: %s has sha256 %s, the manifest says %s", ErrCorrupt, m.Version, logName(o.First, o.Last), sha256Hex(raw), o.SHA256)
	}
	ents, _, err := decodeLog(bytes.NewReader(raw), o.First, o.Last)
	if err != nil {
		return nil, fmt.Errorf("log version %d: %w", m.Version, err)
	}
	return ents, nil
}

// baseOf reads and checks the base of log version m: present, a files
// version of the same cluster at the index m says. A missing base wraps
// ErrCorrupt (the target lost what a kept version needs) and ErrNotExist.
func baseOf(ctx context.Context, t Target, m *Manifest) (*Manifest, error) {
	base, err := ReadManifest(ctx, t, m.Base)
	if errors.Is(err, ErrNotExist) {
		return nil, fmt.Errorf("%w: version %d is a log version on version %d, which %s no longer holds: %w", ErrCorrupt, m.Version, m.Base, t, err)
	}
	if err != nil {
		return nil, fmt.Errorf("version %d's base: %w", m.Version, err)
	}
	if base.IsLog() || base.RaftIndex != m.BaseIndex || base.ClusterID != m.ClusterID {
		return nil, fmt.Errorf("%w: version %d is a log version on version %d at index %d of cluster %x; version %d is a %s version at index %d of cluster %x",
			ErrCorrupt, m.Version, m.Base, m.BaseIndex, uint64(m.ClusterID), base.Version, base.Kind, base.RaftIndex, uint64(base.ClusterID))
	}
	return base, nil
}

// statLog checks that every object log version m names is in t with its
// size, before a restore downloads anything.
func statLog(ctx context.Context, t Target, m *Manifest) error {
	for _, o := range m.Log {
		obj, err := t.Stat(ctx, logName(o.First, o.Last))
		if errors.Is(err, ErrNotExist) {
			return fmt.Errorf("%w: log version %d names %s, which %s does not hold: %w", ErrCorrupt, m.Version, logName(o.First, o.Last), t, err)
		}
		if err != nil {
			return fmt.Errorf("log version %d: %w", m.Version, err)
		}
		if obj.Size != o.Size {
			return fmt.Errorf("%w: log version %d: %s holds %d bytes, the manifest says %d", ErrCorrupt, m.Version, logName(o.First, o.Last), obj.Size, o.Size)
		}
	}
	return nil
}
