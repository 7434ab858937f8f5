package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/strata-kv/strata/bench/internal/cluster"
	"github.com/strata-kv/strata/bench/internal/load"
)

// CPU profiles during measurements
//
// With -pprof-seconds N, every server is started with --enable-pprof (etcd's
// flag; strata has the same) and each measurement fetches a CPU profile of
// member 0 from /debug/pprof/profile?seconds=N, started with the load. The
// profile covers the first N seconds of the run: choose totals that keep
// the load running that long, or the profile's tail is idle time. Profiles
// are written to <out>/pprof/cpu-<server>-<workload>-<conns>-<clients>-<records>.pb.gz,
// to read with `go tool pprof -top FILE`.
//
// Sampling costs the server a little CPU while it runs, so take timings from
// runs without profiles.

// pprofArgs are added to every server's command line when profiling.
var pprofArgs = []string{"--enable-pprof"}

// profileSlack is how much longer than the profile itself the fetch may
// take before it is abandoned.
const profileSlack = 30 * time.Second

// startProfile starts fetching a CPU profile of c's member 0 for the
// suite's -pprof-seconds, named after the measurement, and returns a
// function that waits for it and reports a failure as a warning (a missing
// profile does not invalidate the measurement). It does nothing when
// profiling is off.
func (s *suite) startProfile(ctx context.Context, c *cluster.Cluster, w load.Workload, cfg load.Config) (wait func()) {
	if s.o.pprofSeconds <= 0 {
		return func() {}
	}
	dir := filepath.Join(s.outDir, "pprof")
	name := fmt.Sprintf("cpu-%s-%s-%d-%d-%d.pb.gz", c.Spec().Name, w.Name(), cfg.Conns, cfg.Clients, cfg.Records)
	path := filepath.Join(dir, name)
	url := fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", c.Endpoints()[0], s.o.pprofSeconds)
	done := make(chan error, 1)
	go func() {
		done <- fetchProfile(ctx, url, path, time.Duration(s.o.pprofSeconds)*time.Second+profileSlack)
	}()
	return func() {
		if err := <-done; err != nil {
			s.log.Warn("CPU profile not saved", zap.String("file", path), zap.Error(err))
			return
		}
		s.log.Info("CPU profile saved", zap.String("file", path))
	}
}

// fetchProfile GETs url and writes the body to path (directory created),
// giving up after timeout.
func fetchProfile(ctx context.Context, url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("profile request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("fetch %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("fetch %s: %s: %s", url, resp.Status, b)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create profile dir: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create profile: %w", err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("write profile %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write profile %s: %w", path, err)
	}
	return nil
}
