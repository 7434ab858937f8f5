package load

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// progressInterval is how often the progress line is redrawn.
const progressInterval = 250 * time.Millisecond

// Progress draws "label done/total pct rate" on one terminal line, redrawn
// in place with '\r', while a long run goes on.
//
// Concurrency: Add from any goroutine; Stop once, from the goroutine that
// called StartProgress. Start runs one drawing goroutine; Stop ends it.
type Progress struct {
	w     io.Writer // nil: draw nothing
	label string
	total int64
	start time.Time
	done  atomic.Int64
	stop  chan struct{}
	wg    sync.WaitGroup
}

// StartProgress starts drawing to w (nil: silent) and returns the counter.
func StartProgress(w io.Writer, label string, total int64) *Progress {
	p := &Progress{w: w, label: label, total: total, start: time.Now(), stop: make(chan struct{})}
	if w == nil {
		return p
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
	return p
}

// Add counts n more operations done.
func (p *Progress) Add(n int64) { p.done.Add(n) }

// draw writes the current line.
func (p *Progress) draw() {
	done := p.done.Load()
	pct := 0.0
	if p.total > 0 {
		pct = 100 * float64(done) / float64(p.total)
	}
	rate := float64(done) / max(time.Since(p.start).Seconds(), 1e-9)
	fmt.Fprintf(p.w, "\r%-40s %9d/%-9d %5.1f%% %9.0f op/s ", p.label, done, p.total, pct, rate)
}

// Stop draws the final line, ends it with a newline and stops drawing.
func (p *Progress) Stop() {
	if p.w == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	p.draw()
	fmt.Fprintln(p.w)
}
