package raftlog

import (
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// BenchmarkAppend measures Append on the real disk (b.TempDir()): one write
// and one fdatasync per call, with 1 or 64 entries of 256 bytes, default
// 64 MiB segments. It reports entries/s and fsyncs/s beside MB/s (compare
// fsyncs/s with BenchmarkFdatasync, the disk's own rate), the slowest
// Append (segment rolls would show there) and the segments written.
//
// With dirs=2 every Append is split in two parts synced in parallel; both
// temporary directories are on one device here, so this measures the
// cost of the split, not the gain of a second device.
func BenchmarkAppend(b *testing.B) {
	for _, c := range []struct{ perAppend, dirs int }{{1, 1}, {64, 1}, {64, 2}, {512, 1}, {512, 2}} {
		perAppend := c.perAppend
		b.Run(fmt.Sprintf("entries=%d/size=256/dirs=%d", perAppend, c.dirs), func(b *testing.B) {
			var dirs []string
			for range c.dirs {
				dirs = append(dirs, b.TempDir())
			}
			l, err := Open(Options{FS: vfs.Default, Dirs: dirs})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			data := make([]byte, 256)
			batch := make([]*raftpb.Entry, perAppend)
			h := hs(1, 1, 0)
			b.SetBytes(int64(perAppend * len(data)))
			b.ResetTimer()
			next := uint64(1)
			var worst time.Duration // the slowest Append: segment rolls show here
			for i := 0; i < b.N; i++ {
				for j := range batch {
					batch[j] = &raftpb.Entry{Index: proto.Uint64(next), Term: proto.Uint64(1), Data: data}
					next++
				}
				h.Commit = proto.Uint64(next - 1)
				start := time.Now()
				if err := l.Append(batch, h); err != nil {
					b.Fatal(err)
				}
				worst = max(worst, time.Since(start))
			}
			b.StopTimer()
			secs := b.Elapsed().Seconds()
			st := l.Stats()
			b.ReportMetric(float64(b.N*perAppend)/secs, "entries/s")
			b.ReportMetric(float64(st.Fsyncs)/secs, "fsyncs/s")
			b.ReportMetric(float64(worst.Microseconds()), "max-µs/append")
			b.ReportMetric(float64(st.Segments), "segments")
			if st.Fsyncs > 0 {
				b.ReportMetric(float64(st.FsyncDuration.Microseconds())/float64(st.Fsyncs), "µs/fsync")
			}
		})
	}
}

// BenchmarkFdatasync measures the disk's raw rate of 4 KiB writes (and,
// for comparison with small appends, 512 B writes) each followed by
// fdatasync, on a preallocated, zero-filled file, as the log writes. It is
// the ceiling for Append's fsyncs/s.
func BenchmarkFdatasync(b *testing.B) {
	for _, n := range []int{4096, 512} {
		b.Run(fmt.Sprintf("write=%d", n), func(b *testing.B) { benchmarkFdatasync(b, n) })
	}
}

func benchmarkFdatasync(b *testing.B, writeSize int) {
	const size = 16 << 20
	fs := vfs.Default
	path := fs.PathJoin(b.TempDir(), "sync")
	if err := writeNewFile(fs, path, nil, size); err != nil {
		b.Fatal(err)
	}
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, writeSize)
	for i := range buf {
		buf[i] = byte(i)
	}
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		off := int64(i*len(buf)) % size
		if _, err := f.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
		if err := f.SyncData(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "fsyncs/s")
}
