// Package tools pins the real etcd server and etcdctl that strata's end-to-end
// tests and benchmarks compare against. It is its own module so that etcd's
// server module never enters strata's dependencies.
//
//	go build -C tools -o bin/ ./cmd/etcd ./cmd/etcdctl
package tools
