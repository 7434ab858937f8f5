package raftlog

import (
	"cmp"
	"fmt"
	"slices"
	"sync"

	"go.etcd.io/raft/v3/raftpb"
)

// A log with several directories (lanes) writes every frame as a stripe
// frame (FORMAT.md, "Several directories"): the wrapped state or batch
// payload plus the log-wide sequence number of the write it belongs to
// (op) and its part among that write's frames. An Append of n entries is
// split into min(n, lanes) parts of consecutive entries (written whole to
// one lane, the lanes taking turns, if under Options.MinStripeBytes), each part
// written and synced in its lane by a goroutine of its own, all in
// parallel; Append returns when every part is durable. Recovery scans every lane, sorts the
// frames by (op, part) and replays them as a one-directory log would.
//
// Because Append waits for all its parts before the next write starts,
// only the last op can be incomplete after a crash (a part whose sync
// never returned): recovery drops its surviving parts and zeroes them, so
// that an acknowledged write is never followed by half of an
// unacknowledged one. An earlier op may lack parts only because log
// compaction deleted the lane segment holding them, which it does only
// once those entries are below the snapshot point.

// DefaultMinStripeBytes is Options.MinStripeBytes when 0: below it, two
// fdatasyncs cost more than the bytes they share (measured on one device:
// BenchmarkAppend), so the Append goes whole to one directory,
// directories taking turns.
const DefaultMinStripeBytes = 64 << 10

// splitParts cuts entries into at most lanes runs of consecutive entries
// of similar data size; fewer than minBytes make one part. No entries
// give one empty part (a HardState alone).
func splitParts(entries []*raftpb.Entry, lanes, minBytes int) [][]*raftpb.Entry {
	n := min(len(entries), lanes)
	total := 0
	for _, e := range entries {
		total += entryFixedSize + len(e.GetData())
	}
	if n <= 1 || total < minBytes {
		return [][]*raftpb.Entry{entries}
	}
	parts := make([][]*raftpb.Entry, 0, n)
	start, acc := 0, 0
	for i, e := range entries {
		acc += entryFixedSize + len(e.GetData())
		left := len(entries) - i - 1 // entries after this one
		need := n - len(parts) - 1   // parts still to start after this one
		// Close the part once it holds its share, or when every remaining
		// entry is needed to give each remaining part one entry.
		if need > 0 && (acc*n >= total*(len(parts)+1) || left == need) {
			parts = append(parts, entries[start:i+1])
			start = i + 1
		}
	}
	return append(parts, entries[start:])
}

// appendStriped is Append for a log with several lanes: entries (possibly
// none) starting at first, and the HardState h if withHS, carried by part 0.
func (l *Log) appendStriped(entries []*raftpb.Entry, first uint64, withHS bool, h hardState) error {
	parts := splitParts(entries, len(l.w.lanes), l.minStripe)
	l.w.op++
	op := l.w.op
	// Part k goes to lane (first lane + k): an Append of one part goes to
	// the lanes in turn, so that they share the small Appends.
	lanes := len(l.w.lanes)
	firstLane := 0
	if len(parts) == 1 {
		firstLane = int(op % uint64(lanes))
	}
	laneOf := func(k int) *lane { return l.w.lanes[(firstLane+k)%lanes] }
	type result struct {
		seg *segment
		off int64
		err error
	}
	res := make([]result, len(parts))
	write := func(k int) {
		ln, part := laneOf(k), parts[k]
		hsHere := withHS && k == 0
		partFirst := first
		if len(part) > 0 {
			partFirst = part[0].GetIndex()
		}
		size := batchPayloadSize(part, hsHere)
		frameLen := int64(frameHeaderSize + padded(stripeHeaderSize+size))
		if err := l.rollIfFull(ln, frameLen, partFirst, &stripe{op: op}); err != nil {
			res[k].err = err
			return
		}
		seg, off := ln.active, ln.off
		sp := stripe{op: op, part: uint16(k), parts: uint16(len(parts))}
		ln.buf = appendStripeFrame(ln.buf[:0], seg.hdr.salt, sp, frameBatch, size, batchFill(part, hsHere, h))
		if err := l.writeAndSync(ln, ln.buf); err != nil {
			res[k].err = err
			return
		}
		res[k] = result{seg: seg, off: off}
	}
	// One goroutine per extra lane; the caller writes part 0 itself. Each
	// lane is touched only by the goroutine writing its part until Wait.
	var wg sync.WaitGroup
	for k := 1; k < len(parts); k++ {
		wg.Go(func() { write(k) })
	}
	write(0)
	wg.Wait()
	for _, r := range res {
		if r.err != nil {
			l.w.failed = r.err
			return fmt.Errorf("raftlog: %w", r.err)
		}
	}
	l.mu.Lock()
	rewrite := len(entries) > 0 && first <= l.mu.mem.last()
	for k, part := range parts {
		ln := laneOf(k)
		l.publish(part, res[k].seg, res[k].off)
		res[k].seg.end = ln.off
		if rewrite {
			res[k].seg.lastRewriteOp = op
		}
	}
	if withHS {
		l.mu.mem.hs = h
	}
	l.mu.Unlock()
	l.stats.appends.Add(1)
	l.stats.entries.Add(uint64(len(entries)))
	for k := range parts {
		l.prepareSpare(laneOf(k))
	}
	return nil
}

// stripeRec is one verified stripe frame found by recovery.
type stripeRec struct {
	sp    stripe
	lane  int
	seg   *segment
	off   int64
	size  int64 // the segment file's size, for re-reading the frame
	inner byte
}

// order is the replay order: by op; an op's opening state frames before
// its parts, parts by number.
func (r stripeRec) order(o stripeRec) int {
	if c := cmp.Compare(r.sp.op, o.sp.op); c != 0 {
		return c
	}
	ka, kb := -1, -1
	if r.sp.parts != 0 {
		ka = int(r.sp.part)
	}
	if o.sp.parts != 0 {
		kb = int(o.sp.part)
	}
	if c := cmp.Compare(ka, kb); c != 0 {
		return c
	}
	return cmp.Compare(r.lane, o.lane)
}

// recoverStriped is recover for a log with several lanes: scan every lane,
// merge the frames by op, drop an incomplete last op, replay.
func (l *Log) recoverStriped() error {
	m := newMemState()
	m.budget = l.budget
	l.mu.mem = m
	var recs []stripeRec
	lasts := make([]scanResult, len(l.w.lanes))
	maxSeq := uint64(0)
	for li, ln := range l.w.lanes {
		names, err := l.listLane(ln)
		if err != nil {
			return err
		}
		for i, name := range names {
			isLast := i == len(names)-1
			seg, err := l.openSegment(ln, name, isLast)
			if err != nil {
				return err
			}
			res, err := scanSegment(seg.f, name, isLast, func(off int64, typ byte, payload []byte) error {
				if typ != frameStripe {
					return fmt.Errorf("frame type %d in a log with several directories (written with one --log-dir?)", typ)
				}
				sp, inner, _, err := decodeStripe(payload)
				if err != nil {
					return err
				}
				if seg.firstOp == 0 {
					seg.firstOp = sp.op // the opening state frame's
				}
				recs = append(recs, stripeRec{sp: sp, lane: li, seg: seg, off: off, inner: inner})
				return nil
			})
			if err != nil {
				return fmt.Errorf("log dir %s: %w", ln.dir, err)
			}
			if res.hdr.version != formatVersionStriped {
				return fmt.Errorf("%w: segment %s has format version %d, written by a log with one directory",
					ErrCorrupt, seg.path(l.fs), res.hdr.version)
			}
			for k := len(recs) - 1; k >= 0 && recs[k].seg == seg; k-- {
				recs[k].size = res.size
			}
			seg.hdr, seg.end, seg.frames, seg.capacity = res.hdr, res.end, res.frames, res.size
			maxSeq = max(maxSeq, res.hdr.seq)
			if isLast {
				lasts[li] = res
			}
		}
	}
	slices.SortFunc(recs, stripeRec.order)

	// Find the last op and check it is complete; drop it if it is not.
	lastOp, torn := uint64(0), -1
	for i, r := range recs {
		if r.sp.parts != 0 && r.sp.op >= lastOp {
			if r.sp.op > lastOp {
				lastOp, torn = r.sp.op, i
			}
		}
	}
	if torn >= 0 {
		got := 0
		var parts int
		for _, r := range recs[torn:] {
			if r.sp.op == lastOp && r.sp.parts != 0 {
				got++
				parts = int(r.sp.parts)
			}
		}
		if got < parts {
			if err := l.dropTornOp(recs, lastOp, lasts); err != nil {
				return err
			}
			recs = slices.DeleteFunc(recs, func(r stripeRec) bool { return r.sp.op == lastOp && r.sp.parts != 0 })
			lastOp--
		}
	}

	for _, r := range recs {
		_, payload, err := r.seg.readFrame(r.off, r.size)
		if err != nil {
			return err
		}
		_, inner, body, err := decodeStripe(payload)
		if err != nil {
			return fmt.Errorf("%w: %s at offset %d: %v", ErrCorrupt, r.seg.path(l.fs), r.off, err)
		}
		rewrote, err := replayFrame(m, r.seg, r.off, inner, body)
		if err != nil {
			return fmt.Errorf("%w: %s at offset %d: %v", ErrCorrupt, r.seg.path(l.fs), r.off, err)
		}
		if rewrote {
			r.seg.lastRewriteOp = max(r.seg.lastRewriteOp, r.sp.op)
		}
	}
	// replayFrame counted batch frames; the scan counted them all.
	for _, ln := range l.w.lanes {
		for _, seg := range ln.segs {
			seg.frames = 0
		}
	}
	for _, r := range recs {
		r.seg.frames++
	}
	if m.pos.len() > 0 && m.first != m.snapIndex+1 {
		return fmt.Errorf("%w: entries %d..%d are missing (snapshot at %d, log resumes at %d)",
			ErrCorrupt, m.snapIndex+1, m.first-1, m.snapIndex, m.first)
	}
	m.first = m.snapIndex + 1
	l.w.op = lastOp
	l.nextSeq.Store(maxSeq + 1)

	for li, ln := range l.w.lanes {
		if len(ln.segs) == 0 {
			if err := l.startSegment(ln, m.last()+1, l.currentState(), &stripe{op: l.w.op + 1}); err != nil {
				return err
			}
			continue
		}
		if err := l.resumeLane(ln, ln.segs[len(ln.segs)-1], lasts[li], m.last()); err != nil {
			return err
		}
	}
	return nil
}

// dropTornOp handles an op some of whose parts never became durable: the
// Append that wrote it never returned, so its surviving parts are not part
// of the log. They lie at the tail of their lanes' last segments; each
// lane's scan result is moved back to the first such frame so that the
// torn-tail step zeroes it and appends resume there.
func (l *Log) dropTornOp(recs []stripeRec, op uint64, lasts []scanResult) error {
	for _, r := range recs {
		if r.sp.op != op || r.sp.parts == 0 {
			continue
		}
		ln := l.w.lanes[r.lane]
		if r.seg != ln.segs[len(ln.segs)-1] {
			return fmt.Errorf("%w: %s at offset %d: part %d of the incomplete last write %d is not in the last segment",
				ErrCorrupt, r.seg.path(l.fs), r.off, r.sp.part, op)
		}
		last := &lasts[r.lane]
		if r.off < last.end {
			last.dirtyEnd = max(last.dirtyEnd, last.end)
			last.end = r.off
			last.tornReason = fmt.Sprintf("part %d of %d of write %d, whose other parts are missing", r.sp.part+1, r.sp.parts, op)
			last.frames--
		}
	}
	return nil
}
