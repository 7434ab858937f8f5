package testutil

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// EngineEnv names the environment variable that chooses the storage
// engine of every strata member the harness starts (and of every `strata
// restore` it runs), so that the end-to-end suite runs on each engine:
// STRATA_E2E_ENGINE=bbolt go test ./e2e. Unset or empty means pebble,
// strata's default. `make e2e-engines` runs the suite on the others.
const EngineEnv = "STRATA_E2E_ENGINE"

// Engine returns the engine the harness starts strata members on.
func Engine() string {
	if e := os.Getenv(EngineEnv); e != "" {
		return e
	}
	return "pebble"
}

// RequireEngine skips t unless the harness runs on one of engines, saying
// why: for tests of what only those engines do (Pebble's write-ahead
// log, backups of Pebble's files).
func RequireEngine(t testing.TB, why string, engines ...string) {
	t.Helper()
	if !slices.Contains(engines, Engine()) {
		t.Skipf("%s=%s: %s (only on %s)", EngineEnv, Engine(), why, strings.Join(engines, ", "))
	}
}

// isStrata reports whether binary is strata's (the harness also runs
// etcd's binaries, which take no --engine).
func isStrata(binary string) bool { return filepath.Base(binary) == "strata" }

// withEngine returns args with --engine=Engine() in front when binary is
// strata's, the engine is not strata's default and args name none: a
// test's own --engine wins (flags are read left to right, the last one
// counting, and the test's come after). sub is the subcommand whose flags
// args are ("" for a member).
func withEngine(binary, sub string, args []string) []string {
	if !isStrata(binary) || os.Getenv(EngineEnv) == "" {
		return args
	}
	for _, a := range args {
		if a == "--engine" || strings.HasPrefix(a, "--engine=") {
			return args
		}
	}
	flag := "--engine=" + Engine()
	if sub == "" {
		return append([]string{flag}, args...)
	}
	// strata restore takes its flags after the subcommand.
	return append([]string{sub, flag}, args[1:]...)
}
