package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/internal/testutil"
)

// backupState is what the live member answered at one version: every
// key as a line (value, create and mod revision, version, lease), the
// revision and HashKV there.
type backupState struct {
	rev  int64
	hash uint32
	kvs  []string
}

func readBackupState(t *testing.T, ctx context.Context, cli *clientv3.Client, endpoint string) backupState {
	t.Helper()
	resp, err := cli.Get(ctx, "", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	st := backupState{rev: resp.Header.Revision}
	for _, kv := range resp.Kvs {
		st.kvs = append(st.kvs, fmt.Sprintf("%s=%q c%d m%d v%d l%x", kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease))
	}
	h, err := cli.HashKV(ctx, endpoint, st.rev)
	if err != nil {
		t.Fatal(err)
	}
	st.hash = h.Hash
	return st
}

// TestBackupIncrementalRestore: the backup scenario (backupScenario) on a
// file:// target, where a corrupt file is made by flipping a byte of it.
func TestBackupIncrementalRestore(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "target")
	backupScenario(t, "file://"+dir, nil, func(sum string) {
		path := filepath.Join(dir, "files", sum)
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		raw[len(raw)/2] ^= 1
		if err := os.WriteFile(path, raw, 0o600); err != nil {
			t.Fatal(err)
		}
	})
}

// backupScenario: `strata backup create` on a stopped member's data dir,
// twice with writes in between, into target (env holds what the strata
// commands need to reach it); `strata backup list --json` shows both
// versions at the revisions the member answered, the second having
// uploaded a part of the first's bytes; `verify` passes; `strata restore
// --from URL --version N` builds, for each version, a new member whose
// keys, values, revisions and HashKV equal what the live member answered
// at that version, under a new cluster ID; a running member's data dir, an
// existing data dir and a missing version are refused; a file that
// corrupt damages (by its sha256) is found by verify and refused by
// restore. It returns the source member, stopped, for more.
func backupScenario(t *testing.T, target string, env []string, corrupt func(sum string)) *testutil.Process {
	src := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src"})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	run := func(args ...string) testutil.Result {
		return testutil.RunToExit(t, 60*time.Second, "", env, binary(t, strata), args...)
	}
	mustRun := func(args ...string) string {
		t.Helper()
		res := run(args...)
		if res.Code != 0 {
			t.Fatalf("strata %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), res.Code, res.Stdout, res.Stderr)
		}
		return res.Stdout
	}

	var states []backupState
	// Round 1: many keys, overwrites, deletes and a compaction.
	cli := src.Client(t)
	for i := range 300 {
		if _, err := cli.Put(ctx, fmt.Sprintf("k%03d", i%200), fmt.Sprintf("v%d-%s", i, strings.Repeat("x", 200))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Delete(ctx, "k01", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	mid, err := cli.Get(ctx, "k000")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, mid.Header.Revision-100, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	states = append(states, readBackupState(t, ctx, cli, src.Endpoint()))
	src.Stop()
	if out := mustRun("backup", "create", "--data-dir="+src.DataDir(), "--target="+target); !strings.HasPrefix(out, "version 1 ") {
		t.Errorf("backup create printed %q, want version 1", out)
	}
	// A running member's data dir is refused (it holds the LOCK).
	src.Restart()
	if res := run("backup", "create", "--data-dir="+src.DataDir(), "--target="+target); res.Code == 0 || !strings.Contains(res.Stderr, "member running") {
		t.Errorf("backup create of a running member's data dir: exit %d, stderr %q; want a refusal", res.Code, res.Stderr)
	}

	// Round 2: a few changes.
	cli = src.Client(t)
	for i := range 5 {
		if _, err := cli.Put(ctx, fmt.Sprintf("k%03d", i), fmt.Sprintf("round2-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, "new", "key"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, "k150"); err != nil {
		t.Fatal(err)
	}
	states = append(states, readBackupState(t, ctx, cli, src.Endpoint()))
	src.Stop()
	if out := mustRun("backup", "create", "--data-dir="+src.DataDir(), "--target="+target); !strings.HasPrefix(out, "version 2 ") {
		t.Errorf("backup create printed %q, want version 2", out)
	}

	var list []backup.Manifest
	if err := json.Unmarshal([]byte(mustRun("backup", "list", "--target="+target, "--json")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 {
		t.Fatalf("backup list: %d versions, want 2", len(list))
	}
	for i, m := range list {
		if m.Version != uint64(i+1) || m.Revision != states[i].rev || m.RaftIndex == 0 || m.RaftTerm == 0 || len(m.ConfState.Voters) != 1 {
			t.Errorf("version %d: %+v; the member was at revision %d", i+1, m, states[i].rev)
		}
	}
	// bbolt rewrites its one file in place, so each of its files versions
	// uploads all of it (docs/backup.md, "Every engine").
	if testutil.Engine() != "bbolt" && list[1].NewBytes >= uint64(list[1].Size()) {
		t.Errorf("the second version uploaded %d of its %d bytes; want only its new files", list[1].NewBytes, list[1].Size())
	}
	out := mustRun("backup", "list", "--target="+target)
	t.Logf("strata backup list:\n%s", out)
	if len(strings.Split(strings.TrimSpace(out), "\n")) != 3 {
		t.Errorf("backup list printed\n%s\nwant a header and two lines", out)
	}
	for _, v := range []string{"1", "2"} {
		if out := mustRun("backup", "verify", "--target="+target, "--version="+v); !strings.Contains(out, "match their sha256") {
			t.Errorf("verify %s printed %q", v, out)
		}
	}

	for i, st := range states {
		version := fmt.Sprint(i + 1)
		p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "r" + version, Token: "restored"})
		out := mustRun("restore", "--from="+target, "--version="+version, "--data-dir="+p.DataDir(), "--name="+p.Name(),
			"--initial-cluster="+p.Name()+"="+p.PeerURL(), "--initial-advertise-peer-urls="+p.PeerURL(), "--initial-cluster-token=restored")
		if !strings.HasPrefix(out, "restored version "+version+" ") {
			t.Errorf("restore printed %q", out)
		}
		// Launch, not Start: Start may empty the data dir to retry on
		// new ports.
		p.Launch()
		if err := p.WaitReady(30 * time.Second); err != nil {
			t.Fatalf("restored version %s: %v", version, err)
		}
		got := readBackupState(t, ctx, p.Client(t), p.Endpoint())
		if got.rev != st.rev || got.hash != st.hash || strings.Join(got.kvs, "\n") != strings.Join(st.kvs, "\n") {
			t.Errorf("restored version %s: revision %d, HashKV %d, %d keys; the live member answered revision %d, HashKV %d, %d keys",
				version, got.rev, got.hash, len(got.kvs), st.rev, st.hash, len(st.kvs))
		}
		st, err := p.Client(t).Status(ctx, p.Endpoint())
		if err != nil {
			t.Fatal(err)
		}
		if st.Header.ClusterId == uint64(list[i].ClusterID) {
			t.Errorf("restored version %s kept the old cluster ID %x", version, st.Header.ClusterId)
		}
		p.Stop()
	}

	// A restore into an existing data dir, of a missing version, and of a
	// corrupt file are refused.
	existing := t.TempDir()
	if res := run("restore", "--from="+target, "--data-dir="+existing); res.Code == 0 || !strings.Contains(res.Stderr, "exists") {
		t.Errorf("restore into an existing dir: exit %d, stderr %q", res.Code, res.Stderr)
	}
	fresh := filepath.Join(t.TempDir(), "fresh")
	if res := run("restore", "--from="+target, "--version=7", "--data-dir="+fresh); res.Code == 0 || !strings.Contains(res.Stderr, "no version 7") {
		t.Errorf("restore of a missing version: exit %d, stderr %q", res.Code, res.Stderr)
	}
	var big backup.File
	for _, f := range list[1].Files {
		if f.Size > big.Size {
			big = f
		}
	}
	corrupt(big.SHA256)
	if res := run("backup", "verify", "--target="+target); res.Code == 0 || !strings.Contains(res.Stdout, "bad: "+big.Name) {
		t.Errorf("verify of a corrupt file: exit %d, stdout %q", res.Code, res.Stdout)
	}
	if res := run("restore", "--from="+target, "--data-dir="+fresh); res.Code == 0 || !strings.Contains(res.Stderr, "corrupt") {
		t.Errorf("restore of a corrupt file: exit %d, stderr %q", res.Code, res.Stderr)
	}
	if _, err := os.Stat(fresh); err == nil {
		t.Errorf("a refused restore left %s", fresh)
	}
	return src
}

// TestBackupRestoreThreeMembers: one version restores into the three
// members of a new cluster, each restored apart with its own --name and
// the shared --initial-cluster; the cluster starts, every member answers
// the live member's keys and HashKV, and takes writes.
func TestBackupRestoreThreeMembers(t *testing.T) {
	src := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src"})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cli := src.Client(t)
	for i := range 100 {
		if _, err := cli.Put(ctx, fmt.Sprintf("k%03d", i), fmt.Sprintf("v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	want := readBackupState(t, ctx, cli, src.Endpoint())
	src.Stop()
	target := "file://" + filepath.Join(t.TempDir(), "target")
	if res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "backup", "create", "--data-dir="+src.DataDir(), "--target="+target); res.Code != 0 {
		t.Fatalf("backup create: exit %d, stderr %s", res.Code, res.Stderr)
	}

	var peers []string
	peerURLs := map[string]string{}
	for i, port := range testutil.FreePorts(t, 3) {
		name, u := fmt.Sprintf("r%d", i+1), fmt.Sprintf("http://127.0.0.1:%d", port)
		peers = append(peers, name+"="+u)
		peerURLs[name] = u
	}
	initialCluster := strings.Join(peers, ",")
	var members []*testutil.Process
	for i := range 3 {
		name := fmt.Sprintf("r%d", i+1)
		p := testutil.NewProcess(t, testutil.Options{
			Binary: binary(t, strata), Name: name,
			Flags: append([]string{"--listen-peer-urls=" + peerURLs[name], "--initial-advertise-peer-urls=" + peerURLs[name],
				"--initial-cluster=" + initialCluster, "--initial-cluster-token=restored"}, clusterFlags...),
		})
		res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore", "--from="+target,
			"--data-dir="+p.DataDir(), "--name="+name, "--initial-cluster="+initialCluster,
			"--initial-advertise-peer-urls="+peerURLs[name], "--initial-cluster-token=restored")
		if res.Code != 0 {
			t.Fatalf("restore %s: exit %d, stderr %s", name, res.Code, res.Stderr)
		}
		members = append(members, p)
	}
	for _, m := range members {
		m.Launch()
	}
	for _, m := range members {
		if err := m.WaitReady(30 * time.Second); err != nil {
			t.Fatalf("restored %s: %v", m.Name(), err)
		}
	}
	for _, m := range members {
		got := readBackupState(t, ctx, m.Client(t), m.Endpoint())
		if got.rev != want.rev || got.hash != want.hash || strings.Join(got.kvs, "\n") != strings.Join(want.kvs, "\n") {
			t.Errorf("restored %s: revision %d, HashKV %d, %d keys; want %d, %d, %d", m.Name(), got.rev, got.hash, len(got.kvs), want.rev, want.hash, len(want.kvs))
		}
	}
	mcli := members[0].Client(t)
	if list, err := mcli.MemberList(ctx); err != nil || len(list.Members) != 3 {
		t.Errorf("restored cluster's members: %v, %v; want three", list, err)
	}
	if put, err := mcli.Put(ctx, "after", "restore"); err != nil || put.Header.Revision != want.rev+1 {
		t.Errorf("put on the restored cluster: %v, %v; want revision %d", put, err, want.rev+1)
	}
}

// TestBackupKilled: `strata backup create` killed (a failpoint's SIGKILL)
// after its first upload, or after every upload but before the manifest,
// leaves the target listing only the versions before it, each verifying;
// the next run completes, and its version restores to what the live
// member answered.
func TestBackupKilled(t *testing.T) {
	src := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src"})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	target := "file://" + filepath.Join(t.TempDir(), "target")
	create := func(env ...string) testutil.Result {
		return testutil.RunToExit(t, 60*time.Second, "", env, binary(t, strata), "backup", "create", "--data-dir="+src.DataDir(), "--target="+target)
	}
	put := func(prefix string) {
		cli := src.Client(t)
		for i := range 200 {
			if _, err := cli.Put(ctx, fmt.Sprintf("%s%03d", prefix, i), strings.Repeat(prefix, 100)); err != nil {
				t.Fatal(err)
			}
		}
	}
	put("a")
	src.Stop()
	if res := create(); res.Code != 0 {
		t.Fatalf("first backup: exit %d, stderr %s", res.Code, res.Stderr)
	}
	src.Restart()
	put("b")
	want := readBackupState(t, ctx, src.Client(t), src.Endpoint())
	src.Stop()
	for _, fp := range []string{"backup/after-file-upload=1", "backup/before-manifest=1"} {
		res := create("STRATA_FAILPOINTS=" + fp)
		if res.Code != -1 {
			t.Fatalf("backup with %s: exit %d (want killed), stdout %q, stderr %q", fp, res.Code, res.Stdout, res.Stderr)
		}
		out := testutil.RunToExit(t, 30*time.Second, "", nil, binary(t, strata), "backup", "list", "--target="+target)
		if out.Code != 0 || strings.Count(out.Stdout, "\n") != 2 {
			t.Errorf("after the backup killed at %s: exit %d, list\n%s\nwant one version", fp, out.Code, out.Stdout)
		}
		if v := testutil.RunToExit(t, 30*time.Second, "", nil, binary(t, strata), "backup", "verify", "--target="+target); v.Code != 0 {
			t.Errorf("after the backup killed at %s: verify exit %d, %s %s", fp, v.Code, v.Stdout, v.Stderr)
		}
	}
	res := create()
	if res.Code != 0 || !strings.HasPrefix(res.Stdout, "version 2 ") {
		t.Fatalf("backup after the killed ones: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	// Every file was uploaded by the killed runs: this one uploads none
	// but the copied MANIFEST, if the engine's changed.
	if !strings.Contains(res.Stdout, "uploaded 0 files") && !strings.Contains(res.Stdout, "uploaded 1 files") {
		t.Errorf("the run after the killed ones printed %q; want it to reuse their uploads", res.Stdout)
	}
	p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "r", Token: "restored"})
	if r := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore", "--from="+target, "--data-dir="+p.DataDir(),
		"--name=r", "--initial-cluster=r="+p.PeerURL(), "--initial-advertise-peer-urls="+p.PeerURL(), "--initial-cluster-token=restored"); r.Code != 0 {
		t.Fatalf("restore: exit %d, stderr %s", r.Code, r.Stderr)
	}
	p.Launch()
	if err := p.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	got := readBackupState(t, ctx, p.Client(t), p.Endpoint())
	if got.rev != want.rev || got.hash != want.hash || strings.Join(got.kvs, "\n") != strings.Join(want.kvs, "\n") {
		t.Errorf("restored: revision %d, HashKV %d, %d keys; want %d, %d, %d", got.rev, got.hash, len(got.kvs), want.rev, want.hash, len(want.kvs))
	}
}

// TestBackupProgressJSON: `strata backup create --json` and `strata
// restore --from --json` print JSON lines on stdout, every one parsable,
// progress events first and the result last; without --json and without a
// terminal, plain progress lines go to stderr, ending at 100%, and stdout
// holds only the result line.
func TestBackupProgressJSON(t *testing.T) {
	src := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cli := src.Client(t)
	for i := range 100 {
		if _, err := cli.Put(ctx, fmt.Sprintf("k%03d", i), strings.Repeat("v", 500)); err != nil {
			t.Fatal(err)
		}
	}
	want := readBackupState(t, ctx, cli, src.Endpoint())
	src.Stop()
	target := "file://" + filepath.Join(t.TempDir(), "target")
	jsonLines := func(what, stdout string) []map[string]any {
		t.Helper()
		var out []map[string]any
		for _, l := range strings.Split(strings.TrimSuffix(stdout, "\n"), "\n") {
			var e map[string]any
			if err := json.Unmarshal([]byte(l), &e); err != nil {
				t.Fatalf("%s --json: line %q is not JSON: %v", what, l, err)
			}
			out = append(out, e)
		}
		if len(out) < 2 || out[0]["event"] != "progress" || out[len(out)-1]["event"] != "result" {
			t.Fatalf("%s --json: %q; want progress events, then the result", what, stdout)
		}
		return out
	}
	res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "backup", "create", "--data-dir="+src.DataDir(), "--target="+target, "--json")
	if res.Code != 0 {
		t.Fatalf("backup create --json: exit %d, stderr %s", res.Code, res.Stderr)
	}
	lines := jsonLines("backup create", res.Stdout)
	if r := lines[len(lines)-1]; r["version"] != 1.0 || r["revision"] != float64(want.rev) || r["operation"] != "backup create" {
		t.Errorf("backup create --json result %v; want version 1 at revision %d", r, want.rev)
	}
	if p := lines[len(lines)-2]; p["files"] != p["total_files"] || p["bytes"] != p["total_bytes"] {
		t.Errorf("backup create --json: the last progress event %v is not complete", p)
	}
	res = testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "backup", "create", "--data-dir="+src.DataDir(), "--target="+target)
	if res.Code != 0 || !strings.HasPrefix(res.Stdout, "version 2 ") || strings.Count(res.Stdout, "\n") != 1 ||
		!strings.Contains(res.Stderr, "backup create: 100% ") {
		t.Errorf("backup create: exit %d, stdout %q, stderr %q; want the result alone on stdout and plain progress to 100%% on stderr", res.Code, res.Stdout, res.Stderr)
	}

	p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), Name: "r", Token: "restored"})
	res = testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore", "--from="+target, "--version=1", "--json",
		"--data-dir="+p.DataDir(), "--name=r", "--initial-cluster=r="+p.PeerURL(), "--initial-advertise-peer-urls="+p.PeerURL(), "--initial-cluster-token=restored")
	if res.Code != 0 {
		t.Fatalf("restore --json: exit %d, stderr %s", res.Code, res.Stderr)
	}
	if r := jsonLines("restore", res.Stdout); r[len(r)-1]["version"] != 1.0 || r[len(r)-1]["data_dir"] != p.DataDir() {
		t.Errorf("restore --json result %v", r[len(r)-1])
	}
	res = testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "restore", "--from="+target, "--version=9", "--json",
		"--data-dir="+filepath.Join(t.TempDir(), "none"))
	var last map[string]any
	if err := json.Unmarshal([]byte(strings.TrimSpace(res.Stdout)), &last); res.Code != 1 || err != nil || last["event"] != "error" {
		t.Errorf("restore --json of a missing version: exit %d, stdout %q (%v); want one error object", res.Code, res.Stdout, err)
	}
}

// TestBackupBadInput: issue 13's bad-input list against the real binary:
// an S3 endpoint nothing listens on, a version that does not exist, a
// revision before the oldest version and after the last archived entry, a
// time before the oldest version and after the archive's reach, a restore
// into a non-empty data dir. Each is refused with a clear error (exit 1),
// no data dir is created, the non-empty one is left as it was, and the
// target is byte for byte as before and still verifies.
func TestBackupBadInput(t *testing.T) {
	src := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cli := src.Client(t)
	for i := range 20 {
		if _, err := cli.Put(ctx, fmt.Sprintf("k%02d", i), "v"); err != nil {
			t.Fatal(err)
		}
	}
	rev := readBackupState(t, ctx, cli, src.Endpoint()).rev
	src.Stop()
	dir := filepath.Join(t.TempDir(), "target")
	target := "file://" + dir
	run := func(args ...string) testutil.Result {
		return testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), args...)
	}
	if res := run("backup", "create", "--data-dir="+src.DataDir(), "--target="+target); res.Code != 0 {
		t.Fatalf("backup create: exit %d, stderr %s", res.Code, res.Stderr)
	}
	before := treeDigest(t, dir)

	unreachable := fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
	nonEmpty := t.TempDir()
	if err := os.WriteFile(filepath.Join(nonEmpty, "keep"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	s3 := []string{"--s3-endpoint=" + unreachable, "--s3-access-key=a", "--s3-secret-key=b"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"restore from an unreachable S3 endpoint", append([]string{"restore", "--from=s3://bucket/p"}, s3...), "connection refused"},
		{"backup create to an unreachable S3 endpoint", append([]string{"backup", "create", "--data-dir=" + src.DataDir(), "--target=s3://bucket/p"}, s3...), "connection refused"},
		{"a version that does not exist", []string{"restore", "--from=" + target, "--version=5"}, "no version 5"},
		{"a revision before the oldest version", []string{"restore", "--from=" + target, "--to-revision=1"}, "revision 1 is before the oldest version's"},
		{"a revision after the last archived entry", []string{"restore", "--from=" + target, fmt.Sprintf("--to-revision=%d", rev+1)}, "revision out of the restorable range"},
		{"a time before the oldest version", []string{"restore", "--from=" + target, "--to-time=2000-01-01T00:00:00Z"}, "is before the oldest version (version 1, created "},
		{"a time after the archive's reach", []string{"restore", "--from=" + target, "--to-time=" + time.Now().Add(time.Hour).Format(time.RFC3339)},
			"is after the last archived sample: the archive reaches "},
		{"a target directory that does not exist", []string{"restore", "--from=" + target + "-mistyped"}, "no such directory"},
	} {
		dataDir := filepath.Join(t.TempDir(), "new")
		args := tc.args
		if args[0] == "restore" {
			args = append(args, "--data-dir="+dataDir)
		}
		res := run(args...)
		if res.Code != 1 || !strings.Contains(res.Stderr, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit 1 and %q", tc.name, res.Code, res.Stderr, tc.want)
		}
		if _, err := os.Stat(dataDir); err == nil {
			t.Errorf("%s: the refused restore created %s", tc.name, dataDir)
		}
	}
	if res := run("restore", "--from="+target, "--data-dir="+nonEmpty); res.Code != 1 || !strings.Contains(res.Stderr, "exists; restore builds a new one") {
		t.Errorf("restore into a non-empty data dir: exit %d, stderr %q", res.Code, res.Stderr)
	}
	if entries, err := os.ReadDir(nonEmpty); err != nil || len(entries) != 1 {
		t.Errorf("the non-empty data dir after the refused restore: %v, %v", entries, err)
	} else if raw, err := os.ReadFile(filepath.Join(nonEmpty, "keep")); err != nil || string(raw) != "mine" {
		t.Errorf("the non-empty data dir's file after the refused restore: %q, %v", raw, err)
	}
	if _, err := os.Stat(dir + "-mistyped"); err == nil {
		t.Errorf("a restore from a missing target created %s-mistyped", dir)
	}
	if after := treeDigest(t, dir); after != before {
		t.Errorf("the target changed under refused commands:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if res := run("backup", "verify", "--target="+target); res.Code != 0 {
		t.Errorf("verify after the refusals: exit %d, %s %s", res.Code, res.Stdout, res.Stderr)
	}
}

// treeDigest lists every file under dir with its size and SHA-256.
func treeDigest(t *testing.T, dir string) string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out = append(out, fmt.Sprintf("%s %d %x", rel, len(raw), sha256.Sum256(raw)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(out, "\n")
}
