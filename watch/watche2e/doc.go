// Package watche2e tests strata's Watch service the way users meet it:
// clientv3 (and a raw gRPC stream, for a client that stops reading)
// against the strata binary started by internal/testutil. It holds tests
// only; TestMain builds the binary once.
package watche2e
