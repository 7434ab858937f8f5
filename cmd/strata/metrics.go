package main

import (
	"flag"
	"fmt"

	"github.com/strata-kv/strata/member"
)

// metricsFlags are etcd's flags for the metrics and profiling endpoints.
type metricsFlags struct {
	listenURLs string
	level      string
	pprof      bool
}

func (f *metricsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.listenURLs, "listen-metrics-urls", "", "List of additional URLs to listen on that respond to the /metrics, /health, /livez and /readyz endpoints. For https, the client URL TLS info is used.")
	fs.StringVar(&f.level, "metrics", "basic", "Set level of detail for exported metrics, specify 'extensive' to include server side grpc histogram metrics. strata exports the same set at both levels.")
	fs.BoolVar(&f.pprof, "enable-pprof", false, "Enable runtime profiling data via HTTP server. Address is at client URL + \"/debug/pprof/\"")
}

func (f *metricsFlags) apply(cfg *member.Config) error {
	if f.level != "basic" && f.level != "extensive" {
		return fmt.Errorf("--metrics: unknown level %q (want basic or extensive)", f.level)
	}
	cfg.Client.ListenMetricsURLs = splitURLs(f.listenURLs)
	cfg.Client.Pprof = f.pprof
	return nil
}
