// Package v3lockpb holds the Go types and gRPC stubs of etcd's v3lock
// service (package v3lockpb, service Lock), generated from v3lock.proto by
// ../gen.sh. The wire format is etcd's: a client built on etcd's
// go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb talks to strata
// unchanged. Do not edit the .pb.go files; edit the .proto and regenerate.
package v3lockpb
