package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/strata-kv/strata/server"
)

// printVersion writes what `etcd --version` writes, in its format and
// order, for the etcd API version strata implements (tools that read the
// first line take strata for that etcd), then strata's own line.
func printVersion(w io.Writer) {
	version, revision := "(devel)", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty {
			revision += "-dirty"
		}
	}
	fmt.Fprintf(w, "etcd Version: %s\n", server.EtcdVersion)
	fmt.Fprintf(w, "Git SHA: %s\n", revision)
	fmt.Fprintf(w, "Go Version: %s\n", runtime.Version())
	fmt.Fprintf(w, "Go OS/Arch: %s/%s\n", runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(w, "strata Version: %s (git %s)\n", version, revision)
}
