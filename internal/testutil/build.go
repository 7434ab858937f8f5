package testutil

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
)

// Binaries are the executables an end-to-end test drives.
type Binaries struct {
	// Strata is the path of the strata binary; empty if StrataErr is set.
	Strata string
	// StrataErr is why strata did not build. It is kept apart from the
	// other builds so that tests against real etcd still run while strata's
	// own main is broken or missing; tests that need strata fail with it.
	StrataErr error
	// Etcd, Etcdctl and Etcdutl are the real etcd server, etcdctl and
	// etcdutl from tools/.
	Etcd, Etcdctl, Etcdutl string
}

// BuildBinaries builds strata from repoRoot (./cmd/strata) and etcd,
// etcdctl and etcdutl from repoRoot/tools into dir. The two builds run in parallel and
// share the Go build cache. A failure to build etcd or etcdctl is returned as
// an error (nothing can be compared without them); a failure to build strata
// is recorded in Binaries.StrataErr.
func BuildBinaries(repoRoot, dir string) (Binaries, error) {
	var (
		b        Binaries
		wg       sync.WaitGroup
		toolsErr error
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		out := filepath.Join(dir, "strata")
		if err := goBuild(repoRoot, "-o", out, "./cmd/strata"); err != nil {
			b.StrataErr = err
			return
		}
		b.Strata = out
	}()
	go func() {
		defer wg.Done()
		toolsErr = goBuild(filepath.Join(repoRoot, "tools"), "-o", dir+string(filepath.Separator), "./cmd/etcd", "./cmd/etcdctl", "./cmd/etcdutl")
	}()
	wg.Wait()
	if toolsErr != nil {
		return b, toolsErr
	}
	b.Etcd = filepath.Join(dir, "etcd")
	b.Etcdctl = filepath.Join(dir, "etcdctl")
	b.Etcdutl = filepath.Join(dir, "etcdutl")
	return b, nil
}

// goBuild runs `go build args...` in dir and returns its output on failure.
func goBuild(dir string, args ...string) error {
	return runGoBuild(false, dir, args...)
}

// runGoBuild is goBuild; nice runs it under nice(1) at the lowest
// priority, where nice is installed, so that a build started in the
// background takes only the CPU the tests running beside it leave idle.
func runGoBuild(nice bool, dir string, args ...string) error {
	goBin := filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	if _, err := os.Stat(goBin); err != nil {
		goBin = "go"
	}
	argv := append([]string{goBin, "build"}, args...)
	if nice {
		if niceBin, err := exec.LookPath("nice"); err == nil {
			argv = append([]string{niceBin, "-n", "19"}, argv...)
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %v in %s: %w\n%s", args, dir, err, out.String())
	}
	return nil
}

// RepoRoot walks up from the working directory to the directory holding
// strata's go.mod (the one whose module line names strata, not tools').
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find repo root: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(data, []byte("module github.com/strata-kv/strata\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find repo root: no go.mod of github.com/strata-kv/strata above the working directory")
		}
		dir = parent
	}
}

// BuildTool builds the package pkg (e.g. "./cmd/s3server") of the tools
// module under repoRoot into dir and returns the binary's path. Tests that
// need a tool few tests use build it on demand with this, rather than every
// end-to-end run building it in BuildBinaries.
func BuildTool(repoRoot, dir, pkg string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	if err := goBuild(filepath.Join(repoRoot, "tools"), "-o", out, pkg); err != nil {
		return "", err
	}
	return out, nil
}

// MinIOEnvVar names a MinIO server binary built beforehand; BuildMinIO
// then builds nothing (a cold build takes minutes: tools/minio/README.md).
const MinIOEnvVar = "STRATA_E2E_MINIO"

// BuildMinIO returns the path of a MinIO server binary: the one
// MinIOEnvVar names, else one built into dir from the nested module
// tools/minio (its own go.mod, so that MinIO's dependencies never reach
// tools/go.mod). MinIO is AGPL-3.0: tests run it as a separate process;
// it is never linked into strata.
func BuildMinIO(repoRoot, dir string) (string, error) {
	return buildMinIO(false, repoRoot, dir)
}

// BuildMinIOInBackground is BuildMinIO at the lowest CPU priority, for a
// build started while other tests run (e2e's TestMain): a cold build takes
// minutes on two cores, which the tests' waits on their servers can
// absorb.
func BuildMinIOInBackground(repoRoot, dir string) (string, error) {
	return buildMinIO(true, repoRoot, dir)
}

func buildMinIO(nice bool, repoRoot, dir string) (string, error) {
	if p := os.Getenv(MinIOEnvVar); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s: %w", MinIOEnvVar, err)
		}
		return p, nil
	}
	out := filepath.Join(dir, "minio")
	if err := runGoBuild(nice, filepath.Join(repoRoot, "tools", "minio"), "-o", out, "github.com/minio/minio"); err != nil {
		return "", err
	}
	return out, nil
}
