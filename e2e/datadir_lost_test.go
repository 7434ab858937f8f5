package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// TestDataDirLostWhileRunning: a member whose data directory is deleted
// under it (a lost disk, an operator's rm -rf) stops when asked to, within
// the harness's 10 s, without filling its log. It ignored SIGTERM for good,
// its engine retrying a flush into the missing directory and logging every
// attempt with a stack trace: 38 GB of log in 40 minutes (found running a
// memory probe).
func TestDataDirLostWhileRunning(t *testing.T) {
	p := start(t, strata)
	cli := p.Client(t)
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := cli.Put(ctx, fmt.Sprintf("k%d", i), "v")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(p.DataDir()); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = cli.Put(ctx, fmt.Sprintf("after%d", i), "v") // may fail: the member may have stopped
		cancel()
	}
	time.Sleep(time.Second)
	p.Stop() // fails the test unless the process exits within 10 s of SIGTERM
	if n := len(p.Output()); n > 1<<20 {
		t.Errorf("the member logged %d bytes after its data directory was deleted", n)
	}
}
