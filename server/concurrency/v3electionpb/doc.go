// Package v3electionpb holds the Go types and gRPC stubs of etcd's
// v3election service (package v3electionpb, service Election), generated
// from v3election.proto by ../gen.sh. The wire format is etcd's: a client
// built on etcd's
// go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb talks to
// strata unchanged. Do not edit the .pb.go files; edit the .proto and
// regenerate.
package v3electionpb
