package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLogBoundedInBytes: a member writing large values keeps its raft log
// within --snapshot-bytes plus --snapshot-catchup-bytes past the engine's
// durable index, a few segments, long before --snapshot-count entries
// (docs/write-path.md, rule 4); and a restart finds every write. Before
// the byte bounds the log held every entry below 15,000 of them: here all
// 20 MiB.
func TestLogBoundedInBytes(t *testing.T) {
	t.Parallel()
	const mib = 1 << 20
	logDir := filepath.Join(t.TempDir(), "raftlog")
	p := start(t, strata, "--log-dir="+logDir,
		fmt.Sprintf("--snapshot-bytes=%d", mib), fmt.Sprintf("--snapshot-catchup-bytes=%d", mib),
		fmt.Sprintf("--log-segment-size=%d", mib))
	cli := p.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const puts, size = 200, 100 << 10 // 20 MiB in 200 entries
	value := strings.Repeat("v", size)
	for i := range puts {
		if _, err := cli.Put(ctx, fmt.Sprintf("big/%03d", i), value); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
	// Truncation follows a flush off the write path: wait for it, bounded.
	// 2 MiB of entries kept, up to a segment more on either side of them,
	// the active segment and its spare: 6 MiB.
	const bound = 6 * mib
	var held int64
	for deadline := time.Now().Add(20 * time.Second); ; {
		held = dirBytes(t, logDir)
		if held <= bound || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if held > bound {
		t.Errorf("the raft log holds %d MiB after %d MiB of writes; want at most %d MiB", held/mib, puts*size/mib, bound/mib)
	}
	p.Stop()
	p.Restart()
	cli = p.Client(t)
	resp, err := cli.Get(ctx, "big/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != puts {
		t.Errorf("after a restart %d of %d keys are there", len(resp.Kvs), puts)
	}
}

// dirBytes sums the sizes of the files in dir (the raft log preallocates
// its segments, so a file's size is what it occupies).
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("read %s: %v", dir, err)
	}
	var total int64
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile by a truncation
		}
		if !info.IsDir() {
			total += info.Size()
		}
	}
	return total
}
