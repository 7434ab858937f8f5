package report

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/strata-kv/strata/bench/internal/cluster"
)

func TestSummarize(t *testing.T) {
	h := hdrhistogram.New(1, 60_000_000, 3)
	for v := int64(1); v <= 1000; v++ {
		_ = h.RecordValue(v * 1000) // 1ms .. 1000ms
	}
	var r Result
	r.Summarize(h)
	within := func(got, want float64) bool { return got >= want*0.999 && got <= want*1.001 }
	if !within(r.Latency.P50, 500) || !within(r.Latency.P90, 900) || !within(r.Latency.P99, 990) || !within(r.Latency.Max, 1000) {
		t.Errorf("latency %+v, want p50 500 p90 900 p99 990 max 1000 (ms)", r.Latency)
	}
	if len(r.CDF) < 5 || r.CDF[len(r.CDF)-1].Percentile != 100 {
		t.Fatalf("cdf %v: want points up to the 100th percentile", r.CDF)
	}
	for i := 1; i < len(r.CDF); i++ {
		if r.CDF[i].Percentile < r.CDF[i-1].Percentile || r.CDF[i].Millis < r.CDF[i-1].Millis {
			t.Fatalf("cdf not monotone at %d: %v then %v", i, r.CDF[i-1], r.CDF[i])
		}
	}
	var empty Result
	empty.Summarize(hdrhistogram.New(1, 1000, 3))
	if empty.CDF != nil {
		t.Errorf("empty histogram gave cdf %v", empty.CDF)
	}
}

func sampleReport() *Report {
	fs := int64(10)
	return &Report{
		Started: time.Date(2026, 11, 22, 4, 0, 0, 0, time.UTC),
		Command: "go run . put",
		Machine: Machine{NProc: 2, CPUModel: "test cpu", Disk: "/dev/x"},
		Servers: []ServerInfo{{Name: "etcd", Version: "3.7.3"}, {Name: "strata", Version: "dev"}},
		Results: []Result{
			// strata first: the table must still put the baseline first.
			{Server: "strata", Workload: "put", Phase: "run", Conns: 1, Clients: 1, Total: 100, Ops: 100, Throughput: 300,
				Latency: Latency{P50: 1, P90: 2, P99: 3, Max: 4}, Usage: cluster.Usage{CPUSeconds: 1, Fsyncs: &fs}, DataDirBytes: 2 << 20,
				CDF: []CDFPoint{{0, 0.5}, {50, 1}, {100, 4}}},
			{Server: "etcd", Workload: "put", Phase: "run", Conns: 1, Clients: 1, Total: 100, Ops: 100, Throughput: 100,
				Latency: Latency{P50: 2, P90: 4, P99: 6, Max: 8}, Usage: cluster.Usage{CPUSeconds: 2}, DataDirBytes: 1 << 20,
				CDF: []CDFPoint{{0, 1}, {50, 2}, {100, 8}}},
			{Server: "etcd", Workload: "put", Phase: "run", Conns: 10, Clients: 10, Total: 100, Ops: 100, Throughput: 500,
				Latency: Latency{P50: 3, P90: 5, P99: 7, Max: 9}, CDF: []CDFPoint{{0, 1}, {100, 9}}},
			{Server: "strata", Workload: "put", Phase: "run", Conns: 10, Clients: 10, Total: 100, Ops: 100, Throughput: 900,
				Latency: Latency{P50: 2, P90: 3, P99: 4, Max: 5}, CDF: []CDFPoint{{0, 1}, {100, 5}}},
			{Server: "etcd", Workload: "restart", Phase: "restart", Records: 1000, RestartSeconds: 2, DataDirBytes: 4 << 20},
			{Server: "strata", Workload: "restart", Phase: "restart", Records: 1000, RestartSeconds: 0.5, DataDirBytes: 2 << 20},
		},
	}
}

func TestMarkdownRatios(t *testing.T) {
	md := Markdown(sampleReport())
	lines := strings.Split(md, "\n")
	find := func(prefix string) (int, string) {
		for i, l := range lines {
			if strings.HasPrefix(l, prefix) {
				return i, l
			}
		}
		t.Fatalf("no line starting %q in:\n%s", prefix, md)
		return 0, ""
	}
	ie, _ := find("| put | 1/1 |  | etcd |")
	is, _ := find("| put | 1/1 |  | strata |")
	ir, ratio := find("| put | 1/1 |  | **strata/etcd** |")
	if !(ie < is && is < ir) {
		t.Errorf("rows at %d (etcd), %d (strata), %d (ratio): want baseline, other, ratio", ie, is, ir)
	}
	// ops/s 300/100, p50 1/2, CPU 1/2, fsyncs n/a (etcd has none), disk 2/1.
	for _, want := range []string{"| 3.00× | 0.50× |", "| 0.50× |", "n/a", "| 2.00× |"} {
		if !strings.Contains(ratio, want) {
			t.Errorf("ratio row %q lacks %q", ratio, want)
		}
	}
	_, restart := find("| 1000 | strata |")
	if !strings.Contains(restart, "| 0.25× | 0.50× |") {
		t.Errorf("restart row %q: want restart ratio 0.25× and disk ratio 0.50×", restart)
	}
	for _, want := range []string{"2 CPUs, test cpu", "`go run . put`", "server `etcd`: 3.7.3"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
}

func TestRenderAndJSONRoundTrip(t *testing.T) {
	dir := t.TempDir()
	rep := sampleReport()
	path := filepath.Join(dir, "results.json")
	if err := WriteJSON(rep, path); err != nil {
		t.Fatal(err)
	}
	back, err := ReadJSON(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rep, back) {
		t.Errorf("round trip differs:\n%+v\n%+v", rep, back)
	}
	files, err := Render(back, dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"results.md", "cdf-put-1-1-0.png", "cdf-put-10-10-0.png", "tput-lat-put-0.png"}
	var got []string
	for _, f := range files {
		got = append(got, filepath.Base(f))
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v, size %v", f, err, st)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("files %v, want %v", got, want)
	}
}

func TestTicks125(t *testing.T) {
	tests := []struct {
		lo, hi float64
		want   []float64
	}{
		{lo: 0.3, hi: 3, want: []float64{0.5, 1, 2}},
		{lo: 1, hi: 100, want: []float64{1, 2, 5, 10, 20, 50, 100}},
		{lo: 0, hi: 10, want: nil},
	}
	for _, tt := range tests {
		var got []float64
		for _, tk := range (ticks125{}).Ticks(tt.lo, tt.hi) {
			got = append(got, tk.Value)
		}
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("Ticks(%v, %v) = %v, want %v", tt.lo, tt.hi, got, tt.want)
		}
	}
	if x := tailX(99); x < 99.999 || x > 100.001 {
		t.Errorf("tailX(99) = %v, want 100", x)
	}
}
