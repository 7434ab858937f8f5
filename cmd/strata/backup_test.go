package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// TestBackupCommandLine: the backup subcommands' refusals and their output
// on an empty target.
func TestBackupCommandLine(t *testing.T) {
	target := "file://" + filepath.Join(t.TempDir(), "target")
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     string
		stderrPart string
	}{
		{name: "no command", args: nil, code: 2, stderrPart: "usage:"},
		{name: "unknown command", args: []string{"copy"}, code: 2, stderrPart: `unknown command "copy"`},
		{name: "no target", args: []string{"list"}, code: 2, stderrPart: "--target is required"},
		{name: "create without data dir", args: []string{"create", "--target=" + target}, code: 2, stderrPart: "--data-dir is required"},
		{name: "stray argument", args: []string{"verify", "--target=" + target, "3"}, code: 2, stderrPart: "unexpected arguments"},
		{name: "bad target", args: []string{"list", "--target=ftp://x"}, code: 1, stderrPart: "want a file:// or s3:// URL"},
		{name: "list of an empty target", args: []string{"list", "--target=" + target}, code: 0, stdout: "VERSION  CREATED"},
		{name: "list --json of an empty target", args: []string{"list", "--target=" + target, "--json"}, code: 0, stdout: "[]"},
		{name: "verify of an empty target", args: []string{"verify", "--target=" + target}, code: 1, stderrPart: "holds no backup version"},
		{name: "prune without retention", args: []string{"prune", "--target=" + target}, code: 1, stderrPart: "no retention given"},
		{name: "create of a missing data dir", args: []string{"create", "--target=" + target, "--data-dir=" + t.TempDir() + "/none"}, code: 1, stderrPart: "not a strata data directory"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := runBackup(tc.args, &stdout, &stderr)
			if code != tc.code || !strings.HasPrefix(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderrPart) {
				t.Errorf("strata backup %v: exit %d, stdout %q, stderr %q; want exit %d, stdout starting %q, stderr with %q",
					tc.args, code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderrPart)
			}
		})
	}
}

// TestRestoreFromFlags: --from and a backup file exclude each other, and
// --version needs --from.
func TestRestoreFromFlags(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new")
	for _, args := range [][]string{
		{"--from=file:///x", "--data-dir=" + dir, "backup.db"},
		{"--version=2", "--data-dir=" + dir, "backup.db"},
		{"--data-dir=" + dir},
	} {
		if code := runRestore(args); code != 2 {
			t.Errorf("strata restore %v: exit %d, want 2", args, code)
		}
	}
}
