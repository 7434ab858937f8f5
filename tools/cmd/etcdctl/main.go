// Command etcdctl is the real etcdctl at the version pinned in tools/go.mod.
package main

import "go.etcd.io/etcd/etcdctl/v3/ctlv3"

func main() { ctlv3.MustStart() }
