package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/internal/testutil"
)

// compactedBatches returns how many compacted batch files `strata inspect
// log --json` lists in dataDir, and the commands and records they hold.
// The server is writing and deleting those files meanwhile, so a failed
// inspection (a torn read) is reported, not fatal.
func compactedBatches(t *testing.T, dataDir string) (files, commands, records int, err error) {
	t.Helper()
	res := testutil.RunToExit(t, 30*time.Second, "", nil, binary(t, strata), "inspect", "log", "--data-dir", dataDir, "--json")
	if res.Code != 0 {
		return 0, 0, 0, fmt.Errorf("strata inspect log: exit %d\n%s", res.Code, res.Stderr)
	}
	var infos []struct {
		Compacted bool
		Commands  int
		Records   int
	}
	if err := json.Unmarshal([]byte(res.Stdout), &infos); err != nil {
		t.Fatalf("strata inspect log --json: %v\n%s", err, res.Stdout)
	}
	for _, in := range infos {
		if in.Compacted {
			files++
			commands += in.Commands
			records += in.Records
		}
	}
	return files, commands, records, nil
}

// TestLogCompactionKillRestart runs the binary with log compaction on
// small segments, overwrites a small key space until compacted batch files
// exist, kills it with SIGKILL (the engine, whose WAL is off, loses what it
// had not flushed) and restarts it with each recovery strategy: every key
// must come back with its value, create and mod revision and version, and
// the revision must be the same. The unit of log compaction is a sealed
// segment, or a run of entries (--log-compaction-batch).
func TestLogCompactionKillRestart(t *testing.T) {
	for _, tc := range []struct {
		strategy string
		history  []string
	}{
		{"naive", nil},
		{"descending", nil},
		{"descending", []string{"--history=latest"}},
		// Batches of 97 entries instead of whole segments.
		{"naive", []string{"--log-compaction-batch=97"}},
	} {
		strategy := tc.strategy
		t.Run(fmt.Sprint(strategy, tc.history), func(t *testing.T) {
			dir := t.TempDir()
			p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), DataDir: dir, Flags: append([]string{
				// The first segment holds the bootstrap conf change, which log
				// compaction leaves to the first engine flush and log truncation:
				// make that come early.
				"--log-compaction", "--log-segment-size=32768", "--snapshot-count=400", "--snapshot-catchup-entries=10",
				"--recovery-strategy=" + strategy,
			}, tc.history...)})
			cli := p.Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			for i := 0; i < 1500; i++ {
				key := fmt.Sprintf("lc/%02d", i%40)
				var err error
				if i%11 == 10 {
					_, err = cli.Delete(ctx, key)
				} else {
					_, err = cli.Put(ctx, key, fmt.Sprintf("v%d", i))
				}
				if err != nil {
					t.Fatalf("write %d: %v", i, err)
				}
			}
			// Wait for batch files to kill the server over. If none shows
			// up, compaction still must have run: an engine flush lets the
			// log drop the batch files the engine holds, and in CI the
			// writes once ran slowly enough for every file to go before
			// the first look (strata_raftlog_compactions_total counts them
			// all). The restart then replays no batch, which the check
			// below allows.
			deadline := time.Now().Add(20 * time.Second)
			for {
				files, commands, records, err := compactedBatches(t, dir)
				if err != nil && time.Now().After(deadline) {
					t.Fatal(err)
				}
				if files > 0 {
					t.Logf("%d compacted batch files stand for %d commands with %d records", files, commands, records)
					break
				}
				if time.Now().After(deadline) {
					if n := metric(t, p.Endpoint(), "strata_raftlog_compactions_total", ""); n == 0 {
						t.Fatal("no compacted batch file written after the writes")
					}
					t.Log("compacted batch files were written, and dropped after engine flushes")
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			before, err := cli.Get(ctx, "lc/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			p.Kill()
			p.Start()
			cli = p.Client(t)
			if out := p.CurrentOutput(); !strings.Contains(out, "replayed compacted log batches") {
				t.Logf("the restart replayed no compacted batch (the engine had flushed past them)")
			}
			after, err := cli.Get(ctx, "lc/", clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			if after.Header.Revision != before.Header.Revision {
				t.Fatalf("revision %d after restart, %d before", after.Header.Revision, before.Header.Revision)
			}
			if len(after.Kvs) != len(before.Kvs) {
				t.Fatalf("%d keys after restart, %d before", len(after.Kvs), len(before.Kvs))
			}
			for i, kv := range before.Kvs {
				got := after.Kvs[i]
				if string(got.Key) != string(kv.Key) || string(got.Value) != string(kv.Value) ||
					got.CreateRevision != kv.CreateRevision || got.ModRevision != kv.ModRevision || got.Version != kv.Version {
					t.Fatalf("after restart %s = %q c%d m%d v%d, before %s = %q c%d m%d v%d", got.Key, got.Value,
						got.CreateRevision, got.ModRevision, got.Version, kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version)
				}
			}
		})
	}
}
