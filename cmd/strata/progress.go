package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Progress of `strata backup create` and `strata restore --from` (issue 13
// part 4, docs/backup.md "Progress and output"): a progress bar redrawn in
// place when stderr is a terminal, plain lines at most once a second on
// stderr otherwise, and with --json, JSON lines on stdout (progress events,
// then one result or error object) for scripts. The result line a command
// prints on stdout without --json is unchanged, so that scripts reading it
// see only it.

// progressMode is how a command shows its progress.
type progressMode int

const (
	// progressBar redraws one line in place (a terminal).
	progressBar progressMode = iota
	// progressLines prints a plain line at most once a second.
	progressLines
	// progressJSON prints JSON lines: progress events at most once a
	// second, then the result (--json).
	progressJSON
)

// Redraw intervals: a bar is redrawn at most ten times a second, a line
// or a JSON event printed at most once a second.
const (
	barInterval  = 100 * time.Millisecond
	lineInterval = time.Second
)

// progressRenderer shows a backup.Progress. It is used from one goroutine
// (the operation's, then the command's for the result).
type progressRenderer struct {
	out  io.Writer
	mode progressMode
	// op names the operation in lines and JSON ("backup create").
	op  string
	now func() time.Time

	started           bool
	start, last       time.Time
	files, totalFiles int
	bytes, totalBytes int64
	// pending: something changed since the last line or event was shown.
	pending bool

	// The log replay of a restore, once Replaying was called: what is
	// shown from then on.
	replaying               bool
	replayDone, replayTotal int64
	replayUnit              string
}

// newProgress returns the renderer of op: JSON lines on stdout with
// asJSON, else a bar on stderr if it is a terminal, else plain lines on
// stderr.
func newProgress(op string, asJSON bool, stdout, stderr io.Writer) *progressRenderer {
	switch {
	case asJSON:
		return &progressRenderer{out: stdout, mode: progressJSON, op: op, now: time.Now}
	case isTerminal(stderr):
		return &progressRenderer{out: stderr, mode: progressBar, op: op, now: time.Now}
	default:
		return &progressRenderer{out: stderr, mode: progressLines, op: op, now: time.Now}
	}
}

// isTerminal reports whether w is a character device (a terminal):
// golang.org/x/term is not a dependency of strata, and the mode bit is
// what it would look at first.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// Total implements backup.Progress.
func (r *progressRenderer) Total(files int, bytes int64) {
	r.totalFiles, r.totalBytes = files, bytes
	if !r.started {
		r.started, r.start = true, r.now()
	}
	r.show(true)
}

// Done implements backup.Progress.
func (r *progressRenderer) Done(files int, bytes int64) {
	r.files += files
	r.bytes += bytes
	r.pending = true
	r.show(false)
}

// Replaying implements backup.ReplayProgress: the files are all there,
// and the restore now replays the log. What was shown of the files is
// finished, and the replay is shown from here with its own rate and ETA.
func (r *progressRenderer) Replaying(steps int64, unit string) {
	r.finish()
	r.replaying, r.replayTotal, r.replayDone, r.replayUnit = true, steps, 0, unit
	r.started, r.start = true, r.now()
	r.show(true)
}

// Replayed implements backup.ReplayProgress.
func (r *progressRenderer) Replayed(steps int64) {
	r.replayDone += steps
	r.pending = true
	r.show(false)
}

// show draws the progress if the interval of the mode has passed since the
// last time, or if force.
func (r *progressRenderer) show(force bool) {
	now := r.now()
	interval := lineInterval
	if r.mode == progressBar {
		interval = barInterval
	}
	if !force && now.Sub(r.last) < interval {
		return
	}
	r.last, r.pending = now, false
	switch r.mode {
	case progressBar:
		fmt.Fprintf(r.out, "\r%s\x1b[K", r.barLine(now))
	case progressLines:
		fmt.Fprintln(r.out, r.plainLine(now))
	case progressJSON:
		r.writeJSON(r.event(now))
	}
}

// finish shows the final progress (if anything was shown or is due) and
// ends the bar's line, so that what follows starts on a line of its own.
func (r *progressRenderer) finish() {
	if !r.started {
		return
	}
	if r.pending {
		r.show(true)
	}
	if r.mode == progressBar {
		fmt.Fprintln(r.out)
	}
	r.started = false
}

// result ends the progress and, with --json, prints the result object:
// fields plus "event":"result" and the operation.
func (r *progressRenderer) result(fields map[string]any) {
	r.finish()
	if r.mode != progressJSON {
		return
	}
	fields["event"], fields["operation"] = "result", r.op
	r.writeJSON(fields)
}

// fail ends the progress and, with --json, prints an error object.
func (r *progressRenderer) fail(err error) {
	r.finish()
	if r.mode == progressJSON {
		r.writeJSON(map[string]any{"event": "error", "operation": r.op, "error": err.Error()})
	}
}

func (r *progressRenderer) writeJSON(v any) {
	raw, err := json.Marshal(v)
	if err != nil {
		raw = []byte(fmt.Sprintf(`{"event":"error","error":%q}`, err.Error()))
	}
	r.out.Write(append(raw, '\n'))
}

// stats returns the rate (bytes a second since Total) and the estimated
// time left; ok is false while nothing can be estimated.
func (r *progressRenderer) stats(now time.Time) (rate float64, eta time.Duration, ok bool) {
	done, total := r.bytes, r.totalBytes
	if r.replaying {
		done, total = r.replayDone, r.replayTotal
	}
	elapsed := now.Sub(r.start).Seconds()
	if elapsed <= 0 || done == 0 {
		return 0, 0, false
	}
	rate = float64(done) / elapsed
	left := total - done
	if left < 0 {
		left = 0
	}
	return rate, time.Duration(float64(left) / rate * float64(time.Second)).Round(time.Second), true
}

// percent is the share of the bytes done, in whole percent.
func (r *progressRenderer) percent() int {
	if r.replaying {
		if r.replayTotal <= 0 {
			return 100
		}
		return int(100 * r.replayDone / r.replayTotal)
	}
	if r.totalBytes <= 0 {
		if r.totalFiles > 0 {
			return 100 * r.files / r.totalFiles
		}
		return 100
	}
	return int(100 * r.bytes / r.totalBytes)
}

// barWidth is the width of the bar's [###...] part.
const barWidth = 24

func (r *progressRenderer) barLine(now time.Time) string {
	pct := min(r.percent(), 100)
	fill := barWidth * pct / 100
	bar := strings.Repeat("#", fill) + strings.Repeat(".", barWidth-fill)
	if r.replaying {
		s := fmt.Sprintf("%s: replay [%s] %3d%% %d/%d %s", r.op, bar, pct, r.replayDone, r.replayTotal, r.replayUnit)
		if rate, eta, ok := r.stats(now); ok {
			s += fmt.Sprintf(" %.0f/s ETA %s", rate, eta)
		}
		return s
	}
	s := fmt.Sprintf("%s [%s] %3d%% %s/%s %d/%d files", r.op, bar, pct, humanBytes(r.bytes), humanBytes(r.totalBytes), r.files, r.totalFiles)
	if rate, eta, ok := r.stats(now); ok {
		s += fmt.Sprintf(" %s/s ETA %s", humanBytes(int64(rate)), eta)
	}
	return s
}

func (r *progressRenderer) plainLine(now time.Time) string {
	if r.replaying {
		s := fmt.Sprintf("%s: replay %d%%, %d of %d %s", r.op, r.percent(), r.replayDone, r.replayTotal, r.replayUnit)
		if rate, eta, ok := r.stats(now); ok {
			s += fmt.Sprintf(", %.0f %s/s, ETA %s", rate, r.replayUnit, eta)
		}
		return s
	}
	s := fmt.Sprintf("%s: %d%% %s of %s, %d of %d files", r.op, r.percent(), humanBytes(r.bytes), humanBytes(r.totalBytes), r.files, r.totalFiles)
	if rate, eta, ok := r.stats(now); ok {
		s += fmt.Sprintf(", %s/s, ETA %s", humanBytes(int64(rate)), eta)
	}
	return s
}

// progressEvent is a --json progress line.
type progressEvent struct {
	Event          string  `json:"event"`
	Operation      string  `json:"operation"`
	Files          int     `json:"files"`
	TotalFiles     int     `json:"total_files"`
	Bytes          int64   `json:"bytes"`
	TotalBytes     int64   `json:"total_bytes"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	BytesPerSecond float64 `json:"bytes_per_second"`
	// ETASeconds is absent while nothing was transferred (or replayed).
	ETASeconds *float64 `json:"eta_seconds,omitempty"`
	// Stage is "replay" during a restore's log replay, with Done of
	// Total Units ("revisions" or "entries") and the rate in units a
	// second; absent while files are transferred.
	Stage          string  `json:"stage,omitempty"`
	Done           int64   `json:"done,omitempty"`
	Total          int64   `json:"total,omitempty"`
	Unit           string  `json:"unit,omitempty"`
	UnitsPerSecond float64 `json:"units_per_second,omitempty"`
}

func (r *progressRenderer) event(now time.Time) progressEvent {
	e := progressEvent{Event: "progress", Operation: r.op, Files: r.files, TotalFiles: r.totalFiles, Bytes: r.bytes,
		TotalBytes: r.totalBytes, ElapsedSeconds: now.Sub(r.start).Seconds()}
	rate, eta, ok := r.stats(now)
	if ok {
		s := eta.Seconds()
		e.ETASeconds = &s
	}
	if r.replaying {
		e.Stage, e.Done, e.Total, e.Unit, e.UnitsPerSecond = "replay", r.replayDone, r.replayTotal, r.replayUnit, rate
		return e
	}
	e.BytesPerSecond = rate
	return e
}

// humanBytes writes n in B, KiB, MiB, GiB or TiB with one decimal.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f := float64(n)
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		f /= unit
		if f < unit || u == "TiB" {
			return fmt.Sprintf("%.1f %s", f, u)
		}
	}
	return fmt.Sprintf("%d B", n)
}
