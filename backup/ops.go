package backup

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// List returns the manifests of every version in t, oldest first. A
// manifest that fails its checks is an error: a listing never hides a
// damaged version.
func List(ctx context.Context, t Target) ([]*Manifest, error) {
	vs, err := versions(ctx, t)
	if err != nil {
		return nil, err
	}
	out := make([]*Manifest, 0, len(vs))
	for _, v := range vs {
		m, err := ReadManifest(ctx, t, v)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// VerifyReport is what Verify checked.
type VerifyReport struct {
	Version uint64
	// Base is the files version a log version replays on (0 for a files
	// version), whose files Files counts.
	Base uint64
	// Files and Bytes count the distinct objects read (a file shared by
	// two engine file names is read once); LogObjects the log objects of
	// a log version, whose bytes Bytes includes.
	Files      int
	LogObjects int
	Bytes      int64
	// Bad describes every file that is missing or does not match its
	// hash or size.
	Bad []string
}

// Verify reads every file of version (0: the latest) and checks it
// against its hash and size; for a log version, every file of its base
// and every log object it names (size, SHA-256, then the object's own
// checks). It returns an error wrapping ErrCorrupt if anything is
// missing or damaged (a log version's base included), after checking
// them all.
func Verify(ctx context.Context, t Target, version uint64) (VerifyReport, error) {
	m, err := ReadManifest(ctx, t, version)
	if err != nil {
		return VerifyReport{}, fmt.Errorf("verify: %w", err)
	}
	rep := VerifyReport{Version: m.Version}
	files := m
	if m.IsLog() {
		rep.Base = m.Base
		for _, o := range m.Log {
			rep.LogObjects++
			_, err := readVersionObject(ctx, t, m, o)
			rep.Bytes += o.Size
			if err != nil {
				if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotExist) {
					return rep, fmt.Errorf("verify version %d: %w", m.Version, err)
				}
				rep.Bad = append(rep.Bad, fmt.Sprintf("log object %s: %v", logName(o.First, o.Last), err))
			}
		}
		if files, err = baseOf(ctx, t, m); err != nil {
			rep.Bad = append(rep.Bad, fmt.Sprintf("base version %d: %v", m.Base, err))
			return rep, fmt.Errorf("verify version %d: %w: %s", m.Version, ErrCorrupt, strings.Join(rep.Bad, "; "))
		}
	}
	seen := map[string]bool{}
	for _, f := range files.Files {
		if seen[f.SHA256] {
			continue
		}
		seen[f.SHA256] = true
		rep.Files++
		n, err := verifyFile(ctx, t, f)
		rep.Bytes += n
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNotExist) {
				return rep, fmt.Errorf("verify version %d: %w", m.Version, err)
			}
			rep.Bad = append(rep.Bad, fmt.Sprintf("%s (%s): %v", f.Name, fileName(f.SHA256), err))
		}
	}
	if len(rep.Bad) > 0 {
		return rep, fmt.Errorf("verify version %d: %w: %d of %d files and log objects bad: %s", m.Version, ErrCorrupt, len(rep.Bad), rep.Files+rep.LogObjects, strings.Join(rep.Bad, "; "))
	}
	return rep, nil
}

func verifyFile(ctx context.Context, t Target, f File) (int64, error) {
	r, err := t.Get(ctx, fileName(f.SHA256))
	if err != nil {
		return 0, err
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(h, io.LimitReader(&ctxReader{ctx: ctx, r: r}, f.Size+1))
	if err != nil {
		return n, fmt.Errorf("read %s: %w", fileName(f.SHA256), err)
	}
	return n, checkContent(f, n, h.Sum(nil))
}

// Retention says which versions Prune keeps. A version is kept if any rule
// keeps it; the newest version is always kept (invariant 3 of Backuper).
type Retention struct {
	// KeepLast keeps the newest KeepLast versions.
	KeepLast int
	// KeepWithin keeps the versions created within KeepWithin before Now.
	KeepWithin time.Duration
	// Exponential keeps the newest version of every hour for 24 hours, of
	// every day for 7 days and of every week for 4 weeks before Now
	// (keepExponential, backup/retention.go).
	Exponential bool
	// Now is the clock KeepWithin counts from; nil is time.Now.
	Now func() time.Time
}

// any reports whether r has a rule (else Prune refuses it and the
// continuous mode prunes nothing).
func (r Retention) any() bool { return r.KeepLast > 0 || r.KeepWithin > 0 || r.Exponential }

// PruneReport is what Prune did.
type PruneReport struct {
	Kept, Deleted []uint64
	// FilesDeleted and BytesFreed count the files no kept version names.
	FilesDeleted int
	BytesFreed   int64
	// LogObjectsDeleted counts the archived log objects no kept version
	// can replay (their last index is at most the lowest index of any kept version).
	LogObjectsDeleted int
}

// Prune deletes the versions r does not keep, then every file no kept
// version names (garbage collection), and on a directory target the
// writes a crashed Put left staged. Manifests go first, so a crash in
// between leaves only unnamed files, which the next Prune removes
// (invariant 2 of Backuper). Prune must not run while a Create writes to
// the same target (package comment, "Concurrency").
func Prune(ctx context.Context, t Target, r Retention) (PruneReport, error) {
	if r.KeepLast < 0 || r.KeepWithin < 0 {
		return PruneReport{}, fmt.Errorf("prune: negative retention (keep-last %d, keep-within %s)", r.KeepLast, r.KeepWithin)
	}
	if !r.any() {
		return PruneReport{}, errors.New("prune: no retention given (keep-last, keep-within or keep-exponential)")
	}
	if r.Now == nil {
		r.Now = time.Now
	}
	all, err := List(ctx, t)
	if err != nil {
		return PruneReport{}, fmt.Errorf("prune: %w", err)
	}
	now := r.Now()
	var exp []bool
	if r.Exponential {
		created := make([]time.Time, len(all))
		for i, m := range all {
			created[i] = m.Created
		}
		exp = keepExponential(created, now)
	}
	var rep PruneReport
	// oldestKept is the lowest raft index of a kept version. Versions are
	// numbered in the order they were written, not by index: a follower's
	// version (create --endpoints) or an old leader finishing late may have
	// a higher number and a lower index than the one before it.
	var oldestKept uint64
	named := map[string]bool{}
	namedLog := map[string]bool{} // log objects a kept log version names
	var drop []*Manifest
	keep := make([]bool, len(all))
	index := map[uint64]int{} // version -> its position in all
	for i, m := range all {
		index[m.Version] = i
		newest := i == len(all)-1
		keep[i] = newest || len(all)-i <= r.KeepLast || r.KeepWithin > 0 && now.Sub(m.Created) <= r.KeepWithin || exp != nil && exp[i]
	}
	// Invariant 5: a kept log version keeps its base (whatever the rules
	// say of the base), and the log objects it names.
	for i, m := range all {
		if keep[i] && m.IsLog() {
			if j, ok := index[m.Base]; ok {
				keep[j] = true
			}
			for _, o := range m.Log {
				namedLog[logName(o.First, o.Last)] = true
			}
		}
	}
	for i, m := range all {
		if !keep[i] {
			drop = append(drop, m)
			continue
		}
		rep.Kept = append(rep.Kept, m.Version)
		if oldestKept == 0 || m.RaftIndex < oldestKept {
			oldestKept = m.RaftIndex
		}
		for _, f := range m.Files {
			named[f.SHA256] = true
		}
	}
	for _, m := range drop {
		if err := t.Delete(ctx, manifestName(m.Version)); err != nil {
			return rep, fmt.Errorf("prune: delete version %d: %w", m.Version, err)
		}
		rep.Deleted = append(rep.Deleted, m.Version)
	}
	files, err := t.List(ctx, filesPrefix)
	if err != nil {
		return rep, fmt.Errorf("prune: %w", err)
	}
	for _, o := range files {
		if named[strings.TrimPrefix(o.Name, filesPrefix)] {
			continue
		}
		if err := t.Delete(ctx, o.Name); err != nil {
			return rep, fmt.Errorf("prune: %w", err)
		}
		rep.FilesDeleted++
		rep.BytesFreed += o.Size
	}
	// The archived log a kept version may replay starts after its index
	// (docs/backup.md, "Point-in-time restore", rule 5).
	logs, err := ArchivedLog(ctx, t)
	if err != nil {
		return rep, fmt.Errorf("prune: %w", err)
	}
	for _, l := range logs {
		if oldestKept == 0 || l.Last > oldestKept || namedLog[logName(l.First, l.Last)] {
			continue
		}
		if err := t.Delete(ctx, logName(l.First, l.Last)); err != nil {
			return rep, fmt.Errorf("prune: %w", err)
		}
		rep.LogObjectsDeleted++
	}
	if ft, ok := t.(interface{ RemoveStaged() error }); ok {
		if err := ft.RemoveStaged(); err != nil {
			return rep, fmt.Errorf("prune: %w", err)
		}
	}
	return rep, nil
}
