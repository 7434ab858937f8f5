package e2e

import (
	"context"
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

// logVersionWrites writes a round of puts, an overwrite, a delete, a put
// under a lease and a txn through cli.
func logVersionWrites(t *testing.T, ctx context.Context, cli *clientv3.Client, round int) {
	t.Helper()
	for i := range 20 {
		if _, err := cli.Put(ctx, fmt.Sprintf("k%02d", (i*7+round)%23), fmt.Sprintf("r%d-%d", round, i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Delete(ctx, fmt.Sprintf("k%02d", round%23)); err != nil {
		t.Fatal(err)
	}
	lease, err := cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, fmt.Sprintf("leased%d", round), "x", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version("k03"), ">", 0)).
		Then(clientv3.OpPut("txn", fmt.Sprint(round))).Else(clientv3.OpDelete("txn")).Commit(); err != nil {
		t.Fatal(err)
	}
}

// TestBackupLogVersions: with the real binary, `strata backup create
// --endpoints` of a running member takes a files version, then log
// versions on it (the member's default policy), each restored with
// `strata restore --from URL --version N` into a new member that answers
// what the live member answered then (keys, values, revisions, leases,
// HashKV); a revision between two log versions restores from the first;
// `backup list` shows each version's kind, base and new bytes, `verify`
// checks a log version's base and log objects; `--kind files` forces a
// files version. Then a damaged log object and a missing base are named
// by verify and refused by restore.
func TestBackupLogVersions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "target")
	target := "file://" + dir
	p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src", Flags: []string{"--backup-target=" + target}})
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	cli := p.Client(t)
	run := func(args ...string) testutil.Result {
		return testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), args...)
	}
	create := func(args ...string) testutil.Result {
		t.Helper()
		res := run(append([]string{"backup", "create", "--endpoints=" + p.Endpoint()}, args...)...)
		if res.Code != 0 {
			t.Fatalf("backup create %v: exit %d, stderr %s", args, res.Code, res.Stderr)
		}
		return res
	}
	// A base of some size: 300 values of 1 KiB.
	for i := range 300 {
		if _, err := cli.Put(ctx, fmt.Sprintf("big%03d", i), strings.Repeat(string(rune('a'+i%26)), 1024)); err != nil {
			t.Fatal(err)
		}
	}
	logVersionWrites(t, ctx, cli, 1)
	if res := create(); strings.Contains(res.Stdout, "log version") || !strings.HasPrefix(res.Stdout, "version 1 of ") {
		t.Fatalf("the first version: %q; want a files version", res.Stdout)
	}
	want := map[uint64]backupState{1: readBackupState(t, ctx, cli, p.Endpoint())}
	for v := uint64(2); v <= 3; v++ {
		logVersionWrites(t, ctx, cli, int(v))
		res := create()
		if prefix := fmt.Sprintf("version %d of %s by member ", v, target); !strings.HasPrefix(res.Stdout, prefix) || !strings.Contains(res.Stdout, ": a log version on version 1: ") {
			t.Fatalf("version %d: %q; want a log version on version 1", v, res.Stdout)
		}
		want[v] = readBackupState(t, ctx, cli, p.Endpoint())
	}
	tgt, err := backup.OpenTarget(ctx, target, backup.TargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := backup.List(ctx, tgt)
	if err != nil || len(list) != 3 {
		t.Fatalf("list: %d versions, %v", len(list), err)
	}
	v1, v2, v3 := list[0], list[1], list[2]
	if !v3.IsLog() || v3.Base != 1 || v3.NewBytes == 0 || v3.NewBytes >= uint64(v3.LogSize()) || v3.NewBytes*20 > uint64(v1.Size()) {
		t.Errorf("version 3: a %s version on %d, %d new bytes of %d log bytes; version 1 holds %d bytes; want a log version uploading only what follows version 2",
			v3.Kind, v3.Base, v3.NewBytes, v3.LogSize(), v1.Size())
	}
	out := run("backup", "list", "--target="+target)
	t.Logf("strata backup list:\n%s", out.Stdout)
	lines := strings.Split(strings.TrimSpace(out.Stdout), "\n")
	field := func(line, col int) string {
		if f := strings.Fields(lines[line]); col < len(f) {
			return f[col]
		}
		return ""
	}
	if out.Code != 0 || len(lines) < 4 || field(0, 1) != "KIND" || field(0, 2) != "BASE" || field(0, 11) != "NEW-BYTES" ||
		field(1, 1) != "files" || field(1, 2) != "-" || field(3, 1) != "log" || field(3, 2) != "1" || field(3, 11) != fmt.Sprint(v3.NewBytes) {
		t.Errorf("backup list: exit %d\n%s", out.Code, out.Stdout)
	}
	if res := run("backup", "verify", "--target="+target, "--version=3"); res.Code != 0 ||
		!strings.Contains(res.Stdout, fmt.Sprintf("version 3 of %s, a log version on version 1: ", tgt)) || !strings.Contains(res.Stdout, " log objects (") {
		t.Errorf("verify of version 3: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	for v := uint64(1); v <= 3; v++ {
		restoreAndCompare(t, target, nil, v, want[v])
	}
	// Between versions 2 and 3: version 2 (a log version), then the
	// objects version 3 archived, which follow it.
	if mid := (v2.Revision + v3.Revision) / 2; mid > v2.Revision {
		restoreToRevision(t, target, mid, readBackupStateAt(t, ctx, cli, p.Endpoint(), mid))
	} else {
		t.Errorf("versions 2 and 3 at revisions %d and %d: nothing between", v2.Revision, v3.Revision)
	}
	// --kind files forces a files version; --kind log on a target with
	// none refuses.
	logVersionWrites(t, ctx, cli, 4)
	if res := create("--kind=files"); strings.Contains(res.Stdout, "log version") || !strings.HasPrefix(res.Stdout, "version 4 of ") {
		t.Errorf("--kind files: %q", res.Stdout)
	}
	empty := "file://" + filepath.Join(t.TempDir(), "empty")
	if res := run("backup", "create", "--endpoints="+p.Endpoint(), "--target="+empty, "--kind=log"); res.Code != 1 ||
		!strings.Contains(res.Stderr, "no log version possible: the target holds no version to base it on") {
		t.Errorf("--kind log into an empty target: exit %d, stderr %q", res.Code, res.Stderr)
	}

	// A damaged log object of version 3: named by verify, refused by
	// restore, with no data dir left.
	obj := filepath.Join(dir, "log", fmt.Sprintf("%020d-%020d", v3.Log[len(v3.Log)-1].First, v3.Log[len(v3.Log)-1].Last))
	raw, err := os.ReadFile(obj)
	if err != nil {
		t.Fatal(err)
	}
	flipped := append([]byte(nil), raw...)
	flipped[len(flipped)-1] ^= 1
	if err := os.WriteFile(obj, flipped, 0o600); err != nil {
		t.Fatal(err)
	}
	fresh := filepath.Join(t.TempDir(), "fresh")
	restore := func(version string) testutil.Result {
		return run("restore", "--from="+target, "--version="+version, "--data-dir="+fresh, "--name=r",
			"--initial-cluster=r=http://127.0.0.1:1", "--initial-advertise-peer-urls=http://127.0.0.1:1", "--initial-cluster-token=x")
	}
	if res := run("backup", "verify", "--target="+target, "--version=3"); res.Code != 1 || !strings.Contains(res.Stdout, "bad: log object "+strings.TrimPrefix(obj, dir+"/")) {
		t.Errorf("verify of a damaged log object: exit %d, stdout %q", res.Code, res.Stdout)
	}
	if res := restore("3"); res.Code != 1 || !strings.Contains(res.Stderr, "corrupt: log version 3: ") || !strings.Contains(res.Stderr, "has sha256") {
		t.Errorf("restore over a damaged log object: exit %d, stderr %q", res.Code, res.Stderr)
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("a refused restore left %s: %v", fresh, err)
	}
	if err := os.WriteFile(obj, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	// The base gone (a target damaged by hand: prune never does this).
	if err := os.Remove(filepath.Join(dir, "manifests", fmt.Sprintf("%020d.json", 1))); err != nil {
		t.Fatal(err)
	}
	for _, res := range []testutil.Result{run("backup", "verify", "--target="+target, "--version=2"), restore("2")} {
		if res.Code != 1 || !strings.Contains(res.Stderr, "version 2 is a log version on version 1, which ") {
			t.Errorf("verify or restore of a log version without its base: exit %d, stderr %q", res.Code, res.Stderr)
		}
	}
	if _, err := os.Stat(fresh); !os.IsNotExist(err) {
		t.Errorf("a refused restore left %s: %v", fresh, err)
	}
}

// TestBackupLogVersionsContinuous: a member in continuous mode with
// --backup-full-every 3 (and a log ratio that never binds) takes a files version, two log versions, a files
// version, ... under load; --backup-keep-last 2 keeps the base of a kept
// log version; the newest version restores to what the live member
// answered at its revision.
func TestBackupLogVersionsContinuous(t *testing.T) {
	target := "file://" + filepath.Join(t.TempDir(), "target")
	p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src", Flags: []string{"--backup-target=" + target,
		"--backup-interval=400ms", "--backup-full-every=3", "--backup-log-ratio=100", "--backup-keep-last=2"}})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cli := p.Client(t)
	tgt, err := backup.OpenTarget(ctx, target, backup.TargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; scrape(t, p.Endpoint())["strata_backup_versions_total"] < 6; i++ {
		if ctx.Err() != nil {
			t.Fatalf("fewer than 6 versions: %v", scrape(t, p.Endpoint()))
		}
		if _, err := cli.Put(ctx, fmt.Sprintf("k%03d", i%200), fmt.Sprintf("v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	list, err := backup.List(ctx, tgt)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[uint64]backup.Kind{}
	for _, m := range list {
		kinds[m.Version] = m.Kind
		// full-every 3: versions 1, 4, 7, ... are files versions, the
		// rest log versions on the files version before them.
		wantLog := m.Version%3 != 1
		if m.IsLog() != wantLog || (wantLog && m.Base != m.Version-(m.Version-1)%3) {
			t.Errorf("version %d is a %s version on %d; want log %v", m.Version, m.Kind, m.Base, wantLog)
		}
	}
	newest := list[len(list)-1]
	if newest.IsLog() && kinds[newest.Base] != backup.KindFiles {
		t.Errorf("prune dropped version %d, the base of the kept version %d: kept %v", newest.Base, newest.Version, kinds)
	}
	if v := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "backup", "verify", "--target="+target); v.Code != 0 {
		t.Errorf("verify: exit %d, %s %s", v.Code, v.Stdout, v.Stderr)
	}
	restoreAndCompare(t, target, nil, newest.Version, readBackupStateAt(t, ctx, cli, p.Endpoint(), newest.Revision))
}

// TestBackupLogVersionsS3: log versions on an s3:// target (a real S3
// protocol server, tools/cmd/s3server, the member reaching it through the
// AWS_* variables): a files version, then two log versions, whose log
// objects are S3 objects; the last restores to what the live member
// answered, and verify checks its base and log objects.
func TestBackupLogVersionsS3(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
	const bucket = "strata-e2e"
	startS3Server(t, addr, t.TempDir()+"/s3.db", bucket)
	env := []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=testsecret", "AWS_REGION=us-east-1", "AWS_ENDPOINT_URL=http://" + addr}
	target := "s3://" + bucket + "/lv"
	// The state is a few KB, so the log of two rounds is a large part of
	// it: a ratio that does not bind keeps both versions log versions.
	p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src", Env: env,
		Flags: []string{"--backup-target=" + target, "--backup-log-ratio=10"}})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cli := p.Client(t)
	for round := 1; round <= 3; round++ {
		logVersionWrites(t, ctx, cli, round)
		res := testutil.RunToExit(t, 60*time.Second, "", env, binary(t, strata), "backup", "create", "--endpoints="+p.Endpoint())
		if isLog := strings.Contains(res.Stdout, ": a log version on version 1: "); res.Code != 0 || isLog != (round > 1) {
			t.Fatalf("version %d: exit %d, stdout %q, stderr %q; want a files version, then log versions on it", round, res.Code, res.Stdout, res.Stderr)
		}
	}
	want := readBackupState(t, ctx, cli, p.Endpoint())
	if res := testutil.RunToExit(t, 60*time.Second, "", env, binary(t, strata), "backup", "verify", "--target="+target, "--version=3"); res.Code != 0 ||
		!strings.Contains(res.Stdout, "a log version on version 1: ") {
		t.Errorf("verify of version 3: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	restoreAndCompare(t, target, env, 3, want)
}
