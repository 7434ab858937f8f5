package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// step is one call to a renderer at a time after the start.
type step struct {
	at    time.Duration
	files int
	bytes int64
}

// render runs steps through a renderer of mode on a fake clock: Total(4
// files, 100 MiB) at 0, then each step's Done, then the result.
func render(mode progressMode, steps []step) string {
	var out bytes.Buffer
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	clock := t0
	r := &progressRenderer{out: &out, mode: mode, op: "restore", now: func() time.Time { return clock }}
	r.Total(4, 100<<20)
	for _, s := range steps {
		clock = t0.Add(s.at)
		r.Done(s.files, s.bytes)
	}
	r.result(map[string]any{"version": 3})
	return out.String()
}

// TestProgressRenderer: the bar is redrawn in place at most ten times a
// second and ends its line; plain lines and JSON events come at most once
// a second and show the last state at the end; rate and ETA follow the
// bytes; JSON ends with the result object.
func TestProgressRenderer(t *testing.T) {
	steps := []step{
		{at: 10 * time.Millisecond, bytes: 10 << 20},   // too soon for any mode
		{at: 200 * time.Millisecond, bytes: 10 << 20},  // bar
		{at: 250 * time.Millisecond, files: 1},         // too soon
		{at: 1000 * time.Millisecond, bytes: 30 << 20}, // bar, line, JSON
		{at: 1500 * time.Millisecond, files: 1},        // bar
		{at: 2000 * time.Millisecond, bytes: 50 << 20, files: 2},
	}
	for _, tc := range []struct {
		mode progressMode
		want string
	}{
		{progressBar, "\rrestore [........................]   0% 0 B/100.0 MiB 0/4 files\x1b[K" +
			"\rrestore [####....................]  20% 20.0 MiB/100.0 MiB 0/4 files 100.0 MiB/s ETA 1s\x1b[K" +
			"\rrestore [############............]  50% 50.0 MiB/100.0 MiB 1/4 files 50.0 MiB/s ETA 1s\x1b[K" +
			"\rrestore [############............]  50% 50.0 MiB/100.0 MiB 2/4 files 33.3 MiB/s ETA 2s\x1b[K" +
			"\rrestore [########################] 100% 100.0 MiB/100.0 MiB 4/4 files 50.0 MiB/s ETA 0s\x1b[K" +
			"\n"},
		{progressLines, "restore: 0% 0 B of 100.0 MiB, 0 of 4 files\n" +
			"restore: 50% 50.0 MiB of 100.0 MiB, 1 of 4 files, 50.0 MiB/s, ETA 1s\n" +
			"restore: 100% 100.0 MiB of 100.0 MiB, 4 of 4 files, 50.0 MiB/s, ETA 0s\n"},
	} {
		if got := render(tc.mode, steps); got != tc.want {
			t.Errorf("mode %d:\n got %q\nwant %q", tc.mode, got, tc.want)
		}
	}

	lines := strings.Split(strings.TrimSuffix(render(progressJSON, steps), "\n"), "\n")
	var events []map[string]any
	for _, l := range lines {
		var e map[string]any
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		events = append(events, e)
	}
	if len(events) != 4 {
		t.Fatalf("%d JSON lines, want 4 (start, 1 s, 2 s, result): %q", len(events), lines)
	}
	for i, want := range []map[string]any{
		{"event": "progress", "bytes": 0.0, "total_bytes": float64(100 << 20), "files": 0.0, "total_files": 4.0, "elapsed_seconds": 0.0},
		{"event": "progress", "bytes": float64(50 << 20), "files": 1.0, "elapsed_seconds": 1.0, "bytes_per_second": float64(50 << 20), "eta_seconds": 1.0},
		{"event": "progress", "bytes": float64(100 << 20), "files": 4.0, "elapsed_seconds": 2.0, "eta_seconds": 0.0},
		{"event": "result", "operation": "restore", "version": 3.0},
	} {
		for k, v := range want {
			if events[i][k] != v {
				t.Errorf("event %d: %s = %v, want %v (%v)", i, k, events[i][k], v, events[i])
			}
		}
	}
	if _, ok := events[0]["eta_seconds"]; ok {
		t.Errorf("the first event has an ETA before any byte: %v", events[0])
	}

	var out bytes.Buffer
	r := &progressRenderer{out: &out, mode: progressJSON, op: "backup create", now: time.Now}
	r.fail(errors.New("target unreachable"))
	if got := out.String(); got != `{"error":"target unreachable","event":"error","operation":"backup create"}`+"\n" {
		t.Errorf("fail before any progress: %q", got)
	}
}

// TestProgressRendererReplay: after the files, a restore's log replay is
// shown as its own stage (done of total revisions or entries, its own
// rate and ETA), in every mode, and the result comes after it.
func TestProgressRendererReplay(t *testing.T) {
	render := func(mode progressMode) string {
		var out bytes.Buffer
		t0 := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
		clock := t0
		r := &progressRenderer{out: &out, mode: mode, op: "restore", now: func() time.Time { return clock }}
		r.Total(1, 1<<20)
		clock = t0.Add(time.Second)
		r.Done(1, 1<<20)
		clock = t0.Add(2 * time.Second)
		r.Replaying(1000, "revisions")
		clock = t0.Add(3 * time.Second)
		r.Replayed(250)
		clock = t0.Add(4 * time.Second)
		r.Replayed(750)
		r.result(map[string]any{"version": 3})
		return out.String()
	}
	for _, tc := range []struct {
		mode progressMode
		want string
	}{
		{progressBar, "\rrestore [........................]   0% 0 B/1.0 MiB 0/1 files\x1b[K" +
			"\rrestore [########################] 100% 1.0 MiB/1.0 MiB 1/1 files 1.0 MiB/s ETA 0s\x1b[K\n" +
			"\rrestore: replay [........................]   0% 0/1000 revisions\x1b[K" +
			"\rrestore: replay [######..................]  25% 250/1000 revisions 250/s ETA 3s\x1b[K" +
			"\rrestore: replay [########################] 100% 1000/1000 revisions 500/s ETA 0s\x1b[K" +
			"\n"},
		{progressLines, "restore: 0% 0 B of 1.0 MiB, 0 of 1 files\n" +
			"restore: 100% 1.0 MiB of 1.0 MiB, 1 of 1 files, 1.0 MiB/s, ETA 0s\n" +
			"restore: replay 0%, 0 of 1000 revisions\n" +
			"restore: replay 25%, 250 of 1000 revisions, 250 revisions/s, ETA 3s\n" +
			"restore: replay 100%, 1000 of 1000 revisions, 500 revisions/s, ETA 0s\n"},
	} {
		if got := render(tc.mode); got != tc.want {
			t.Errorf("mode %d:\n got %q\nwant %q", tc.mode, got, tc.want)
		}
	}
	lines := strings.Split(strings.TrimSuffix(render(progressJSON), "\n"), "\n")
	var last map[string]any
	for _, l := range lines[:len(lines)-1] {
		last = nil
		if err := json.Unmarshal([]byte(l), &last); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
	}
	for k, v := range map[string]any{"event": "progress", "stage": "replay", "done": 1000.0, "total": 1000.0, "unit": "revisions", "units_per_second": 500.0, "eta_seconds": 0.0} {
		if last[k] != v {
			t.Errorf("the last replay event: %s = %v, want %v (%v)", k, last[k], v, last)
		}
	}
	if !strings.Contains(lines[len(lines)-1], `"event":"result"`) {
		t.Errorf("the last JSON line is not the result: %q", lines[len(lines)-1])
	}
}

// TestHumanBytes: sizes as a progress line writes them.
func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 30: "5.0 GiB", 3 << 40: "3.0 TiB", 5000 << 40: "5000.0 TiB"} {
		if got := humanBytes(n); got != want {
			t.Errorf("humanBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
