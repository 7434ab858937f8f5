// Command etcd is the real etcd server at the version pinned in tools/go.mod,
// built here because `go install` of etcd fails on its replace directives.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
