package testutil

import (
	"fmt"
	"os"
	"testing"
)

// RunWithBinaries is a TestMain body for packages that need every binary:
// it builds strata, etcd and etcdctl once into a temporary directory, stores
// them in *bins, runs the tests, kills any process left and removes the
// directory. A failed build ends the run with exit code 2, naming what
// failed.
func RunWithBinaries(m *testing.M, bins *Binaries) int {
	root, err := RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	dir, err := os.MkdirTemp("", "strata-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer os.RemoveAll(dir)
	if *bins, err = BuildBinaries(root, dir); err != nil {
		fmt.Fprintln(os.Stderr, "build etcd from tools/:", err)
		return 2
	}
	if bins.StrataErr != nil {
		fmt.Fprintln(os.Stderr, "build strata:", bins.StrataErr)
		return 2
	}
	defer KillAll()
	return m.Run()
}
