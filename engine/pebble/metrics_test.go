package pebble

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestMetrics: a registry scrapes the engine's metrics, and they move with
// what the engine did: a flush writes an L0 table and its bytes, and a read
// of a flushed key goes through the block cache.
func TestMetrics(t *testing.T) {
	e := openMem(t, vfs.NewMem(), Options{})
	defer e.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(e)
	value := func(name string) float64 {
		t.Helper()
		families, err := reg.Gather()
		if err != nil {
			t.Fatalf("gather: %v", err)
		}
		for _, f := range families {
			if f.GetName() == name {
				m := f.GetMetric()[0]
				if c := m.GetCounter(); c != nil {
					return c.GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
		t.Fatalf("metric %s not exported", name)
		return 0
	}
	if n := value("strata_pebble_flushes_total"); n != 0 {
		t.Fatalf("flushes before any = %v", n)
	}
	b := e.NewBatch()
	_ = b.Set([]byte("ka"), []byte("1"))
	if err := b.Commit(1); err != nil {
		t.Fatal(err)
	}
	if err := e.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := value("strata_pebble_flushes_total"); n < 1 {
		t.Errorf("flushes after Flush = %v, want >= 1", n)
	}
	if n := value("strata_pebble_flushed_bytes_total"); n <= 0 {
		t.Errorf("flushed bytes after Flush = %v, want > 0", n)
	}
	if n := value("strata_pebble_l0_files"); n < 1 {
		t.Errorf("L0 files after Flush = %v, want >= 1", n)
	}
	before := value("strata_pebble_block_cache_hits_total") + value("strata_pebble_block_cache_misses_total")
	if _, err := e.Get([]byte("ka")); err != nil {
		t.Fatal(err)
	}
	if after := value("strata_pebble_block_cache_hits_total") + value("strata_pebble_block_cache_misses_total"); after <= before {
		t.Errorf("block cache lookups %v -> %v after a read of a flushed key", before, after)
	}
	if n := value("strata_pebble_write_stalls_total"); n != 0 {
		t.Errorf("write stalls = %v on an idle engine", n)
	}
}

// TestWriteStallWarning: a write stall as long as warnStallDuration is
// logged with Pebble's reason and counted; a short one is only counted.
func TestWriteStallWarning(t *testing.T) {
	for _, tt := range []struct {
		name  string
		took  time.Duration
		warns int
	}{
		{"short", warnStallDuration / 10, 0},
		{"long", warnStallDuration * 3 / 2, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(zap.WarnLevel)
			e := openMem(t, vfs.NewMem(), Options{Logger: zap.New(core)})
			defer e.Close()
			const reason = "memtable count limit reached"
			e.stallBegan(pebble.WriteStallBeginInfo{Reason: reason})
			e.stallMu.Lock()
			e.stalls.started = e.stalls.started.Add(-tt.took) // as if it began tt.took ago
			e.stallMu.Unlock()
			e.stallEnded()
			e.stallEnded() // Pebble's events come in pairs; an unpaired end is ignored
			if e.stalls.count != 1 || e.stalls.total < tt.took {
				t.Errorf("stalls counted %d for %v, want 1 for >= %v", e.stalls.count, e.stalls.total, tt.took)
			}
			got := logs.FilterMessage("pebble: write stall").All()
			if len(got) != tt.warns {
				t.Fatalf("%d warnings, want %d", len(got), tt.warns)
			}
			if tt.warns > 0 && got[0].ContextMap()["reason"] != reason {
				t.Errorf("warning %v does not name the reason %q", got[0].ContextMap(), reason)
			}
		})
	}
}
