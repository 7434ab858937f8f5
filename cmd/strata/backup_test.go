package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/member"
)

// TestBackupCommandLine: the backup subcommands' refusals and their output
// on an empty target. A target the readers (list, verify, prune) are
// pointed at must exist: a mistyped directory is refused, not created.
func TestBackupCommandLine(t *testing.T) {
	target := "file://" + t.TempDir()
	missingDir := filepath.Join(t.TempDir(), "missing")
	missing := "file://" + missingDir
	writeTarget := "file://" + filepath.Join(t.TempDir(), "created") // create makes its target
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
		{name: "create without data dir", args: []string{"create", "--target=" + target}, code: 2, stderrPart: "--data-dir (a stopped member) or --endpoints (a running one) is required"},
		{name: "create of both", args: []string{"create", "--target=" + target, "--data-dir=x", "--endpoints=http://127.0.0.1:1"}, code: 2, stderrPart: "not both"},
		{name: "endpoints on list", args: []string{"list", "--target=" + target, "--endpoints=http://127.0.0.1:1"}, code: 2, stderrPart: "flag provided but not defined: -endpoints"},
		{name: "user without password", args: []string{"create", "--endpoints=http://127.0.0.1:1", "--user=root"}, code: 1, stderrPart: "--user needs a password"},
		{name: "stray argument", args: []string{"verify", "--target=" + target, "3"}, code: 2, stderrPart: "unexpected arguments"},
		{name: "bad target", args: []string{"list", "--target=ftp://x"}, code: 1, stderrPart: "want a file:// or s3:// URL"},
		{name: "list of an empty target", args: []string{"list", "--target=" + target}, code: 0, stdout: "VERSION  KIND  BASE  CREATED"},
		{name: "list --json of an empty target", args: []string{"list", "--target=" + target, "--json"}, code: 0, stdout: "[]"},
		{name: "verify of an empty target", args: []string{"verify", "--target=" + target}, code: 1, stderrPart: "holds no backup version"},
		{name: "prune without retention", args: []string{"prune", "--target=" + target}, code: 1, stderrPart: "no retention given"},
		{name: "unknown kind", args: []string{"create", "--endpoints=http://127.0.0.1:1", "--kind=delta"}, code: 2, stderrPart: `--kind "delta": want files or log`},
		{name: "log version of a stopped member", args: []string{"create", "--target=" + target, "--data-dir=x", "--kind=log"}, code: 2, stderrPart: "--kind log needs --endpoints"},
		{name: "create of a missing data dir", args: []string{"create", "--target=" + writeTarget, "--data-dir=" + t.TempDir() + "/none"}, code: 1, stderrPart: "not a strata data directory"},
		{name: "list of a missing target", args: []string{"list", "--target=" + missing}, code: 1, stderrPart: "backup target " + missing + ": no such directory"},
		{name: "verify of a missing target", args: []string{"verify", "--target=" + missing}, code: 1, stderrPart: "no such directory"},
		{name: "prune of a missing target", args: []string{"prune", "--target=" + missing, "--keep-last=1"}, code: 1, stderrPart: "no such directory"},
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
	if _, err := os.Stat(missingDir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the readers created the missing target %s (stat: %v)", missingDir, err)
	}
	if entries, err := os.ReadDir(strings.TrimPrefix(target, "file://")); err != nil || len(entries) != 0 {
		t.Errorf("list, verify and prune of an empty target wrote to it: %v, %v", entries, err)
	}
}

// TestRestoreFromFlags: --from and a backup file exclude each other,
// --version, --to-revision and --to-index need --from and exclude each
// other; --logger needs a revision or an index, --logger-cluster needs
// --logger and a hexadecimal ID.
func TestRestoreFromFlags(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new")
	for _, args := range [][]string{
		{"--from=file:///x", "--data-dir=" + dir, "backup.db"},
		{"--version=2", "--data-dir=" + dir, "backup.db"},
		{"--data-dir=" + dir},
		{"--to-revision=5", "--data-dir=" + dir, "backup.db"},
		{"--from=file:///x", "--version=2", "--to-revision=5", "--data-dir=" + dir},
		{"--from=file:///x", "--to-revision=-1", "--data-dir=" + dir},
		{"--to-time=2026-11-25T10:00:00Z", "--data-dir=" + dir, "backup.db"},
		{"--from=file:///x", "--to-time=2026-11-25 10:00", "--data-dir=" + dir},
		{"--from=file:///x", "--to-time=2026-11-25T10:00:00Z", "--to-revision=5", "--data-dir=" + dir},
		{"--from=file:///x", "--to-time=2026-11-25T10:00:00Z", "--version=2", "--data-dir=" + dir},
		{"--json", "--data-dir=" + dir, "backup.db"},
		{"--from=file:///x", "--to-revision=5", "--to-index=9", "--data-dir=" + dir},
		{"--from=file:///x", "--version=2", "--to-index=9", "--data-dir=" + dir},
		{"--to-index=9", "--data-dir=" + dir, "backup.db"},
		{"--from=file:///x", "--logger=http://127.0.0.1:2479", "--data-dir=" + dir},
		{"--from=file:///x", "--to-index=9", "--logger-cluster=c1", "--data-dir=" + dir},
		{"--from=file:///x", "--to-index=9", "--logger=http://127.0.0.1:2479", "--logger-cluster=xyz", "--data-dir=" + dir},
		{"--from=file:///x", "--to-time=2026-11-25T10:00:00Z", "--to-index=9", "--data-dir=" + dir},
	} {
		if code := runRestore(args); code != 2 {
			t.Errorf("strata restore %v: exit %d, want 2", args, code)
		}
	}
}

// TestMemberBackupFlags: the member's backup flags, the --s3-* ones
// shared with the CLI among them, into member.Config, and their refusals.
func TestMemberBackupFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
		check   func(cfg member.Config) bool
	}{
		{name: "off by default, log versions on once a target is given", check: func(cfg member.Config) bool {
			return reflect.DeepEqual(cfg.Backup, backup.Options{Policy: backup.Policy{LogRatio: defaultLogRatio}})
		}},
		{
			name: "every flag",
			args: []string{"--backup-target=s3://b/p", "--backup-interval=1h", "--backup-log-interval=1m", "--backup-keep-last=3", "--backup-keep-within=24h",
				"--backup-keep-exponential", "--s3-endpoint=http://127.0.0.1:9000", "--s3-region=r", "--s3-access-key=a", "--s3-secret-key=s",
				"--backup-log-ratio=0.5", "--backup-full-every=6"},
			check: func(cfg member.Config) bool {
				return reflect.DeepEqual(cfg.Backup, backup.Options{Target: "s3://b/p", Interval: time.Hour, LogInterval: time.Minute,
					Keep:          backup.Retention{KeepLast: 3, KeepWithin: 24 * time.Hour, Exponential: true},
					Policy:        backup.Policy{LogRatio: 0.5, FullEvery: 6},
					TargetOptions: backup.TargetOptions{Endpoint: "http://127.0.0.1:9000", Region: "r", AccessKey: "a", SecretKey: "s"}})
			},
		},
		{name: "keep without interval", args: []string{"--backup-target=file:///x", "--backup-keep-last=3"}, wantErr: "--backup-interval"},
		{name: "exponential without interval", args: []string{"--backup-target=file:///x", "--backup-keep-exponential"}, wantErr: "--backup-interval"},
		{name: "negative keep", args: []string{"--backup-target=file:///x", "--backup-interval=1h", "--backup-keep-last=-1"}, wantErr: "want 0 or more"},
		{name: "negative log ratio", args: []string{"--backup-target=file:///x", "--backup-log-ratio=-0.1"}, wantErr: "want 0 or more"},
		{name: "negative full-every", args: []string{"--backup-target=file:///x", "--backup-full-every=-1"}, wantErr: "want 0 or more"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var f flags
			fs := newFlagSet(&f)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			var cfg member.Config
			err := f.backup.apply(&cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("apply = %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !tc.check(cfg) {
				t.Errorf("apply = %v, config %+v", err, cfg.Backup)
			}
		})
	}
}

// TestLogRuns: archived log runs with the time range of their samples;
// a comma marks a gap.
func TestLogRuns(t *testing.T) {
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		runs []backup.LogRun
		want string
	}{
		{runs: []backup.LogRun{{First: 5, Last: 9}}, want: "5-9 (no time samples)"},
		{runs: []backup.LogRun{{First: 5, Last: 21, From: at, To: at.Add(90 * time.Second)}},
			want: "5-21 (2026-11-25T10:00:00Z to 2026-11-25T10:01:30Z)"},
		{runs: []backup.LogRun{{First: 5, Last: 9, From: at, To: at.Add(time.Second / 2)}, {First: 12, Last: 30, From: at.Add(time.Hour), To: at.Add(time.Hour)}},
			want: "5-9 (2026-11-25T10:00:00Z to 2026-11-25T10:00:00.5Z), 12-30 (2026-11-25T11:00:00Z to 2026-11-25T11:00:00Z)"},
	} {
		if got := logRuns(tc.runs); got != tc.want {
			t.Errorf("logRuns(%v) = %q, want %q", tc.runs, got, tc.want)
		}
	}
}
