package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/strata-kv/strata/internal/testutil"
)

// bins are built once by TestMain and shared by every test.
var bins testutil.Binaries

// binDir is where TestMain built bins, removed when the tests end; tools
// only a few tests need are built there on demand (testutil.BuildTool).
var binDir string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	root, err := testutil.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 2
	}
	dir, err := os.MkdirTemp("", "strata-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: temp dir for binaries:", err)
		return 2
	}
	defer os.RemoveAll(dir)
	binDir = dir
	bins, err = testutil.BuildBinaries(root, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building etcd and etcdctl from tools/ failed:", err)
		return 2
	}
	if bins.StrataErr != nil {
		fmt.Fprintf(os.Stderr, "e2e: WARNING: strata did not build; every strata test will fail:\n%v\n", bins.StrataErr)
	}
	defer testutil.KillAll()
	flag.Parse() // prebuildMinIO reads -run
	prebuildMinIO()
	// The build is waited for before binDir is removed: no go build is
	// left running after the tests.
	defer minioOnce.Do(func() {})
	return m.Run()
}

// flavor names a server binary a test can run against.
type flavor string

const (
	strata flavor = "strata"
	etcd   flavor = "etcd"
)

// flavors are both servers, strata first.
var flavors = []flavor{strata, etcd}

// binary returns the path of f's server, failing the test if strata did not
// build.
func binary(t testing.TB, f flavor) string {
	t.Helper()
	switch f {
	case strata:
		if bins.StrataErr != nil {
			t.Fatalf("strata binary not built: %v", bins.StrataErr)
		}
		return bins.Strata
	case etcd:
		return bins.Etcd
	}
	t.Fatalf("unknown flavor %q", f)
	return ""
}

// start starts a fresh single-member server of flavor f with extra flags.
func start(t testing.TB, f flavor, flags ...string) *testutil.Process {
	t.Helper()
	return testutil.StartProcess(t, testutil.Options{Binary: binary(t, f), Flags: flags})
}
