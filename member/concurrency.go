package member

import (
	"github.com/strata-kv/strata/server"
	"github.com/strata-kv/strata/server/concurrency"
)

// registerConcurrency serves etcd's v3lock and v3election services on the
// client gRPC server, over the member's own KV and Lease services and
// watch hub (called in-process, so a lock request's context and
// credentials reach the KV service as they came). REQUIRES: m.grpc,
// m.leases and m.watchHub are set.
func (m *Member) registerConcurrency(limits server.Limits) {
	concurrency.Register(m.grpc, concurrency.Backend{
		KV:      server.NewKV(m, limits),
		Leases:  m.leases,
		Watches: m.watchHub,
		Logger:  m.logger.Named("concurrency"),
	})
}
