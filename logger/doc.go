// Package logger is strata's logger service (seed 003, docs/logger.md): one
// process that keeps the raft logs of many strata clusters as a learner in
// each, never voting, never applying, and serves what it holds over a gRPC
// API of its own.
//
// # Use
//
//	rec, err := logger.Join(ctx, logger.JoinConfig{DataDir: d, Endpoints: eps,
//		AdvertisePeerURLs: urls})                  // after etcdctl member add --learner
//	l, err := logger.Open(logger.Config{DataDir: d, ListenPeerURLs: ..., ListenClientURLs: ...})
//	err = l.Start(ctx)                              // serves every cluster in d
//	...
//	c, _ := logger.Dial("http://127.0.0.1:2479")    // DialTLS for https
//	st, _ := c.Status(ctx, 0)                       // every cluster
//	err = c.Recover(ctx, cid, first, last, func(ents []*raftpb.Entry) error { ... })
//
// # Files
//
//	cluster.go   the data directory: cluster records, gap records
//	learner.go   one cluster's raft learner: persist, then acknowledge; the gap
//	compaction.go  log compaction of a cluster's log (--log-compaction): a
//	             store applying the committed entries, batches built from it
//	logger.go    Open, Start, Close: the learners, the peer Mux, the API server
//	join.go      Join: find the learner the operator added, record the cluster
//	api.go       the API's messages and codec (protowire); service.go the
//	             service and its refusals; client.go the Go client
//
// # Durability
//
// A learner sends raft's acknowledgements of a Ready's entries only after
// raftlog.Log.Append returned for them, which fdatasyncs: what the logger
// acknowledged survives kill -9 and power loss (raftlog recovers a torn
// tail). Recover serves only entries that are committed and durable.
//
// Concurrency: see Logger and learner.
package logger
