package apply

import (
	"fmt"
	"math"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	pebbleengine "github.com/strata-kv/strata/engine/pebble"
	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/mvcc"
)

// syntheticBatches stands for commands puts of 100-byte values over keys
// keys (YCSB AW's shape: uniform updates), cut into batches of perBatch
// commands, one record per command (an uncompacted batch: the worst case
// for replay).
func syntheticBatches(commands, keys, perBatch int) []*logcompact.Batch {
	value := make([]byte, 100)
	version := make([]int64, keys)
	created := make([]int64, keys)
	var out []*logcompact.Batch
	var cur *logcompact.Batch
	for i := 1; i <= commands; i++ {
		if cur == nil {
			cur = &logcompact.Batch{FirstIndex: uint64(i)}
		}
		k := (i * 7919) % keys // a fixed permutation-like walk
		rev := int64(i + 1)
		version[k]++
		if created[k] == 0 {
			created[k] = rev
		}
		cur.Records = append(cur.Records, logcompact.Record{
			Kind: logcompact.RecordPut, Index: uint64(i), Main: rev,
			Key: []byte(fmt.Sprintf("user%012d", k)), Value: value,
			CreateRevision: created[k], Version: version[k],
		})
		if i%perBatch == 0 || i == commands {
			cur.LastIndex, cur.LastTerm, cur.Revision = uint64(i), 1, rev
			out = append(out, cur)
			cur = nil
		}
	}
	return out
}

// BenchmarkReplayCompactedBatches measures recovery's apply step: 10^5
// commands over 10^4 keys replayed into an empty store, with each strategy,
// keeping all history (horizon 0) or only the latest versions.
func BenchmarkReplayCompactedBatches(b *testing.B) {
	batches := syntheticBatches(100_000, 10_000, 1000)
	for _, bc := range []struct {
		name     string
		strategy string
		horizon  int64
	}{
		{"naive/history", logcompact.RecoveryNaive, 0},
		{"descending/history", logcompact.RecoveryDescending, 0},
		{"descending/latest", logcompact.RecoveryDescending, math.MaxInt64},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				eng, err := pebbleengine.Open("engine", pebbleengine.Options{FS: vfs.NewMem()})
				if err != nil {
					b.Fatal(err)
				}
				store, err := mvcc.Open(eng, mvcc.Options{})
				if err != nil {
					b.Fatal(err)
				}
				a, err := New(Config{Store: store})
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				t, err := logcompact.Replay(a, batches, bc.strategy, bc.horizon, 0)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				b.ReportMetric(float64(t.Applied), "records")
				b.ReportMetric(t.Select.Seconds()*1e3, "select-ms")
				b.ReportMetric(t.Apply.Seconds()*1e3, "apply-ms")
				_ = store.Close()
				_ = eng.Close()
				b.StartTimer()
			}
		})
	}
}
