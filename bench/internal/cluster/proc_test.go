package cluster

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
)

func TestParseStatCPU(t *testing.T) {
	tests := []struct {
		name    string
		stat    string
		want    float64
		wantErr bool
	}{
		{
			name: "plain comm",
			stat: "1234 (etcd) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 100 0 0",
			want: 3.0, // (250+50)/100
		},
		{
			name: "comm with spaces and parentheses",
			stat: "77 (my (odd) srv) R 1 77 77 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 5 0 0",
			want: 0.1,
		},
		{name: "no closing paren", stat: "77 (etcd S 1 2 3", wantErr: true},
		{name: "too few fields", stat: "77 (etcd) S 1 2 3", wantErr: true},
		{name: "bad utime", stat: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 abc 5 0 0 20 0 1 0 5 0 0", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStatCPU([]byte(tt.stat))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if err == nil && math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("cpu = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFindField(t *testing.T) {
	status := "Name:\tetcd\nVmPeak:\t  900 kB\nVmHWM:\t   51234 kB\nVmRSS:\t 40000 kB\n"
	io := "rchar: 10\nwchar: 20\nwrite_bytes: 4096\ncancelled_write_bytes: 0\n"
	tests := []struct {
		name, text, key string
		want            int64
		wantErr         bool
	}{
		{name: "status kB", text: status, key: "VmHWM", want: 51234},
		{name: "io bytes", text: io, key: "write_bytes", want: 4096},
		{name: "prefix of another key is not a match", text: io, key: "write", wantErr: true},
		{name: "missing", text: status, key: "VmSwap", wantErr: true},
		{name: "no value", text: "VmHWM:\n", key: "VmHWM", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := findField([]byte(tt.text), tt.key)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("got %d, want %d", got, tt.want)
			}
		})
	}
}

func TestSumMetrics(t *testing.T) {
	text := `# HELP etcd_disk_wal_fsync_duration_seconds The latency distributions of fsync called by WAL.
# TYPE etcd_disk_wal_fsync_duration_seconds histogram
etcd_disk_wal_fsync_duration_seconds_bucket{le="0.001"} 10
etcd_disk_wal_fsync_duration_seconds_bucket{le="0.128"} 40
etcd_disk_wal_fsync_duration_seconds_sum 0.5
etcd_disk_wal_fsync_duration_seconds_count 42
etcd_disk_backend_commit_duration_seconds_count 8
strata_raftlog_syncs_total{dir="a"} 3
strata_raftlog_syncs_total{dir="b b"} 4 1700000000
`
	tests := []struct {
		name      string
		names     []string
		want      float64
		wantFound bool
	}{
		{name: "one counter", names: []string{"etcd_disk_wal_fsync_duration_seconds_count"}, want: 42, wantFound: true},
		{name: "two counters summed", names: etcdFsyncNamesForTest, want: 50, wantFound: true},
		{name: "labelled samples summed, timestamp ignored", names: []string{"strata_raftlog_syncs_total"}, want: 7, wantFound: true},
		{name: "bucket is not count", names: []string{"etcd_disk_wal_fsync_duration_seconds"}, want: 0, wantFound: false},
		{name: "absent", names: []string{"nope"}, want: 0, wantFound: false},
		{name: "one bucket by its label", names: []string{`etcd_disk_wal_fsync_duration_seconds_bucket{le="0.128"}`}, want: 40, wantFound: true},
		{name: "a label no sample has", names: []string{`etcd_disk_wal_fsync_duration_seconds_bucket{le="0.5"}`}, want: 0, wantFound: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found := sumMetrics(text, tt.names)
			if got != tt.want || found != tt.wantFound {
				t.Errorf("sumMetrics = %v, %v; want %v, %v", got, found, tt.want, tt.wantFound)
			}
		})
	}
}

var etcdFsyncNamesForTest = []string{"etcd_disk_wal_fsync_duration_seconds_count", "etcd_disk_backend_commit_duration_seconds_count"}

func TestSampleSub(t *testing.T) {
	s0 := Sample{CPUSeconds: 1, PeakRSSBytes: 10, WriteBytes: 100, Fsyncs: 5, FsyncsKnown: true}
	s1 := Sample{CPUSeconds: 3.5, PeakRSSBytes: 30, WriteBytes: 1100, Fsyncs: 25, FsyncsKnown: true}
	u := s1.Sub(s0, "metrics: x")
	if u.CPUSeconds != 2.5 || u.PeakRSSBytes != 30 || u.WriteBytes != 1000 || u.Fsyncs == nil || *u.Fsyncs != 20 || u.FsyncSource != "metrics: x" {
		t.Errorf("Sub = %+v", u)
	}
	s1.FsyncsKnown = false
	if u := s1.Sub(s0, "none"); u.Fsyncs != nil {
		t.Errorf("unknown fsyncs reported as %d", *u.Fsyncs)
	}
}

func TestDirSize(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a"), make([]byte, 5000), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub", "b"), make([]byte, 3000), 0o644); err != nil {
		t.Fatal(err)
	}
	// A sparse file: long, nothing allocated.
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	al, ap, err := dirSize(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ap != 8000+1<<20 {
		t.Errorf("apparent = %d, want %d", ap, 8000+1<<20)
	}
	if al < 8000 || al >= ap {
		t.Errorf("allocated = %d, want >= 8000 and below the sparse apparent size %d", al, ap)
	}
	if al, ap, err := dirSize(filepath.Join(dir, "missing")); err != nil || al != 0 || ap != 0 {
		t.Errorf("missing dir: %d, %d, %v; want 0, 0, nil", al, ap, err)
	}
}

func TestStartRefusesMemberCounts(t *testing.T) {
	for _, n := range []int{-1, MaxMembers + 1} {
		_, err := Start(t.Context(), Spec{Name: "etcd", Kind: KindEtcd, Binary: "/nonexistent", Members: n}, t.TempDir(), nil)
		if !errors.Is(err, ErrUnsupportedMembers) {
			t.Errorf("Start with %d members: %v, want ErrUnsupportedMembers", n, err)
		}
	}
}

func TestStartMissingBinary(t *testing.T) {
	_, err := Start(t.Context(), Spec{Name: "etcd", Kind: KindEtcd, Binary: filepath.Join(t.TempDir(), "no-such-etcd")}, t.TempDir(), nil)
	if err == nil {
		t.Fatal("Start of a missing binary succeeded")
	}
}

func TestFreePortsDistinct(t *testing.T) {
	ports, err := freePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || seen[p] {
			t.Fatalf("ports %v: want 4 distinct positive ports", ports)
		}
		seen[p] = true
	}
}

// FuzzSumMetrics: the /metrics text comes from the network; no input may
// panic, and a sum is only reported when a named sample was found.
func FuzzSumMetrics(f *testing.F) {
	f.Add("a_count 1\nb{x=\"}\"} 2\n# c 3\n")
	f.Add("a_count{le=\"+Inf\"} NaN 12\n")
	f.Add("a_count")
	f.Fuzz(func(t *testing.T, text string) {
		sum, found := sumMetrics(text, []string{"a_count", "b"})
		if !found && sum != 0 {
			t.Errorf("not found but sum %v", sum)
		}
	})
}

// FuzzParseStatCPU: /proc text is read from the kernel but parsed by hand;
// no input may panic or yield a negative time.
func FuzzParseStatCPU(f *testing.F) {
	f.Add([]byte("1 (a) S 1 1 1 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5 0 0"))
	f.Add([]byte(")"))
	f.Add([]byte("(((("))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := parseStatCPU(b)
		if err == nil && v < 0 {
			t.Errorf("negative cpu %v", v)
		}
	})
}

func TestCountSyncLines(t *testing.T) {
	trace := `3306  fdatasync(9)                      = 0
3306  fsync(13 <unfinished ...>
3312  fdatasync(9)                      = 0
3306  <... fsync resumed>)              = 0
3312  msync(0x7f, 4096, MS_SYNC)        = 0
3312  +++ exited with 0 +++
3313  fsyncx(1) = 0
fsync(1) = 0
`
	if got := countSyncLines([]byte(trace)); got != 5 {
		t.Errorf("countSyncLines = %d, want 5", got)
	}
}

func TestSyncCounterIncremental(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace")
	c := &syncCounter{path: path}
	if n, err := c.count(); err != nil || n != 0 {
		t.Fatalf("missing file: %d, %v", n, err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	steps := []struct {
		write string
		want  int64
	}{
		{write: "1 fsync(3) = 0\n1 fdata", want: 1}, // a torn line waits
		{write: "sync(4) = 0\n", want: 2},
		{write: "1 write(4) = 1\n", want: 2},
		{write: "2 fsync(5) = 0\n2 fsync(6) = 0\n", want: 4},
	}
	for i, st := range steps {
		if _, err := f.WriteString(st.write); err != nil {
			t.Fatal(err)
		}
		n, err := c.count()
		if err != nil || n != st.want {
			t.Fatalf("step %d: count %d, %v; want %d", i, n, err, st.want)
		}
	}
}

// FuzzCountSyncLines: the strace output is read back from disk; no content
// may panic, and no more calls are counted than there are lines.
func FuzzCountSyncLines(f *testing.F) {
	f.Add([]byte("1 fsync(3) = 0\n2 <... fsync resumed>) = 0\n"))
	f.Add([]byte("9"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if n := countSyncLines(b); n < 0 || n > int64(bytes.Count(b, []byte("\n"))+1) {
			t.Errorf("count %d for %d lines", n, bytes.Count(b, []byte("\n"))+1)
		}
	})
}
