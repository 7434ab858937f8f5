// Package robustness runs etcd's robustness suite (go.etcd.io/etcd/tests/v3,
// tests/robustness, at the etcd version pinned in tools/go.mod) against an
// `etcd` binary: strata built under that name, or the real etcd built from
// tools/cmd/etcd. The scenarios live in robustness_test.go; README.md says how
// to run them (`make robustness` at the repository root).
package robustness
