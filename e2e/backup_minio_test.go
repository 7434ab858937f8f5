package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/strata-kv/strata/internal/testutil"
)

var (
	minioOnce sync.Once
	minioBin  string
	minioErr  error
)

// minioBinary builds the MinIO server of tools/minio once per test binary
// (or takes testutil.MinIOEnvVar's), or waits for prebuildMinIO's build.
func minioBinary(t *testing.T) string {
	t.Helper()
	minioOnce.Do(func() { buildMinIO(testutil.BuildMinIO) })
	if minioErr != nil {
		t.Fatalf("build MinIO: %v", minioErr)
	}
	return minioBin
}

func buildMinIO(build func(repoRoot, dir string) (string, error)) {
	root, err := testutil.RepoRoot()
	if err != nil {
		minioErr = err
		return
	}
	minioBin, minioErr = build(root, binDir)
}

// prebuildMinIO starts MinIO's build in the background at the lowest CPU
// priority when the run includes the MinIO tests (-run matches
// TestBackupMinIO, or none was given): a cold build takes minutes, which
// then overlap the tests before them instead of adding to the package's
// time. minioBinary waits for it. The MinIO tests are parallel tests for
// this: go test starts them only after every sequential test of the package
// has finished, by when the build is done; as sequential tests they came
// second in the package and waited about three minutes for it.
func prebuildMinIO() {
	if f := flag.Lookup("test.run"); f != nil && f.Value.String() != "" {
		top, _, _ := strings.Cut(f.Value.String(), "/")
		if ok, err := regexp.MatchString(top, "TestBackupMinIO"); err != nil || !ok {
			return
		}
	}
	go minioOnce.Do(func() { buildMinIO(testutil.BuildMinIOInBackground) })
}

// The MinIO root credentials of the tests.
const (
	minioUser     = "strata-e2e"
	minioPassword = "strata-e2e-secret"
	minioBucket   = "strata-e2e"
)

// minioServer is one run of a MinIO server on a loopback port with its
// objects in a directory of the test's. It is signalled through its own
// os.Process only (never by name), killed when the test ends or with the
// test binary (Pdeathsig).
type minioServer struct {
	t         *testing.T
	addr, dir string
	cmd       *exec.Cmd
	out       *testutil.SyncBuffer
	exited    chan struct{}
}

// startMinIO starts a server on a free port and creates minioBucket.
func startMinIO(t *testing.T) *minioServer {
	t.Helper()
	s := &minioServer{t: t, addr: fmt.Sprintf("127.0.0.1:%d", testutil.FreePorts(t, 1)[0]), dir: t.TempDir()}
	s.start()
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			t.Logf("MinIO output:\n%s", s.out.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.client().MakeBucket(ctx, minioBucket, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("make bucket: %v", err)
	}
	return s
}

// start launches the server and waits, at most 60 s, until its liveness
// endpoint answers 200.
func (s *minioServer) start() {
	s.t.Helper()
	s.out = &testutil.SyncBuffer{}
	s.cmd = exec.Command(minioBinary(s.t), "server", "--quiet", "--address", s.addr, s.dir)
	s.cmd.Env = append(s.cmd.Environ(), "MINIO_ROOT_USER="+minioUser, "MINIO_ROOT_PASSWORD="+minioPassword,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off", "MINIO_CI_CD=1")
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start MinIO: %v", err)
	}
	exited := make(chan struct{})
	s.exited = exited
	go func(cmd *exec.Cmd) {
		_ = cmd.Wait()
		close(exited)
	}(s.cmd)
	deadline := time.After(60 * time.Second)
	for {
		select {
		case <-exited:
			s.t.Fatalf("MinIO exited before it was ready:\n%s", s.out.String())
		case <-deadline:
			s.t.Fatalf("MinIO not ready after 60 s:\n%s", s.out.String())
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := http.Get("http://" + s.addr + "/minio/health/live")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
	}
}

// kill sends SIGKILL to this run's process and waits for it to exit.
func (s *minioServer) kill() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		s.t.Errorf("MinIO pid %d did not exit after SIGKILL", s.cmd.Process.Pid)
	}
}

// client is a minio-go client of the server as root.
func (s *minioServer) client() *minio.Client {
	s.t.Helper()
	c, err := minio.New(s.addr, &minio.Options{Creds: credentials.NewStaticV4(minioUser, minioPassword, ""), Region: "us-east-1"})
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// env is what the strata commands need to reach the server, with the
// given secret key.
func (s *minioServer) env(secret string) []string {
	return []string{"AWS_ACCESS_KEY_ID=" + minioUser, "AWS_SECRET_ACCESS_KEY=" + secret, "AWS_REGION=us-east-1",
		"AWS_ENDPOINT_URL=http://" + s.addr}
}

// TestBackupMinIO: the backup scenario (backupScenario) on a real MinIO
// server; then what gofakes3 cannot show: MinIO checks request
// signatures, so a wrong secret key or an unknown access key is refused
// with a clear error and writes nothing, and a member whose continuous
// backups are refused still serves and counts the failures.
func TestBackupMinIO(t *testing.T) {
	t.Parallel() // after the sequential tests: see prebuildMinIO
	srv := startMinIO(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	target := "s3://" + minioBucket + "/cluster-a"
	src := backupScenario(t, target, srv.env(minioPassword), func(sum string) {
		c := srv.client()
		key := "cluster-a/files/" + sum
		obj, err := c.GetObject(ctx, minioBucket, key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(obj)
		obj.Close()
		if err != nil {
			t.Fatal(err)
		}
		raw[len(raw)/2] ^= 1
		if _, err := c.PutObject(ctx, minioBucket, key, bytes.NewReader(raw), int64(len(raw)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	other := "s3://" + minioBucket + "/refused"
	for _, tc := range []struct {
		name    string
		env     []string
		wantErr string
	}{
		{name: "wrong secret key", env: srv.env("not-the-secret"),
			wantErr: `refused the credentials (access key "` + minioUser + `" from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY): The request signature`},
		{name: "unknown access key", env: append(srv.env(minioPassword), "AWS_ACCESS_KEY_ID=nobody"),
			wantErr: `refused the credentials (access key "nobody" from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY): The Access Key Id`},
	} {
		for _, args := range [][]string{
			{"backup", "create", "--data-dir=" + src.DataDir(), "--target=" + other},
			{"backup", "list", "--target=" + other},
		} {
			res := testutil.RunToExit(t, 60*time.Second, "", tc.env, binary(t, strata), args...)
			if res.Code != 1 || !strings.Contains(res.Stderr, tc.wantErr) || !strings.Contains(res.Stderr, srv.addr) {
				t.Errorf("%s: strata %s: exit %d, stderr %q; want a refusal naming %q and the endpoint", tc.name, args[1], res.Code, res.Stderr, tc.wantErr)
			}
		}
	}
	for o := range srv.client().ListObjects(ctx, minioBucket, minio.ListObjectsOptions{Prefix: "refused/", Recursive: true}) {
		t.Errorf("a refused backup wrote %s (%v)", o.Key, o.Err)
	}

	// `strata backup create --endpoints`: the member reaches MinIO with its
	// own credentials; the CLI has none (docs/backup.md, "Taking a version
	// of a running member").
	online := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "online", Env: srv.env(minioPassword)})
	if _, err := online.Client(t).Put(ctx, "online", "yes"); err != nil {
		t.Fatal(err)
	}
	res := testutil.RunToExit(t, 60*time.Second, "", nil, binary(t, strata), "backup", "create", "--endpoints="+online.Endpoint(),
		"--target=s3://"+minioBucket+"/online")
	if res.Code != 0 || !strings.HasPrefix(res.Stdout, "version 1 of s3://"+minioBucket+"/online by member ") {
		t.Errorf("backup create --endpoints into MinIO: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	if res := testutil.RunToExit(t, 60*time.Second, "", srv.env(minioPassword), binary(t, strata), "backup", "verify",
		"--target=s3://"+minioBucket+"/online"); res.Code != 0 {
		t.Errorf("verify of the online version: exit %d, %s %s", res.Code, res.Stdout, res.Stderr)
	}

	// A member whose continuous backups MinIO refuses serves and counts.
	p := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "refused", Env: srv.env("not-the-secret"),
		Flags: []string{"--backup-target=" + other, "--backup-interval=100ms"}})
	deadline := time.Now().Add(30 * time.Second)
	for scrape(t, p.Endpoint())["strata_backup_failures_total"] < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no failures counted in 30 s: %v", scrape(t, p.Endpoint()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := p.Client(t).Put(ctx, "still", "serving"); err != nil {
		t.Errorf("a member whose backups fail: %v", err)
	}
	if out := p.CurrentOutput(); !strings.Contains(out, "refused the credentials") {
		t.Errorf("the member's log does not say why its backups fail:\n%s", out)
	}
}

// TestBackupMinIOKilled: MinIO killed -9 while `strata backup create`
// uploads a version leaves the target consistent (the versions before it,
// each verifying, and no manifest of the interrupted one); once MinIO is
// back on its data the next backup completes, and restores to what the
// live member answered.
func TestBackupMinIOKilled(t *testing.T) {
	t.Parallel() // after the sequential tests: see prebuildMinIO
	srv := startMinIO(t)
	ctx, cancel := context.WithTimeout(context.Background(), 180*time.Second)
	defer cancel()
	src := testutil.StartProcess(t, testutil.Options{Binary: binary(t, strata), Name: "src"})
	env := srv.env(minioPassword)
	run := func(args ...string) testutil.Result {
		return testutil.RunToExit(t, 120*time.Second, "", env, binary(t, strata), args...)
	}
	cli := src.Client(t)
	put := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			v := make([]byte, 64<<10) // incompressible: the tables stay large
			_, _ = rand.Read(v)
			if _, err := cli.Put(ctx, fmt.Sprintf("%s%04d", prefix, i), string(v)); err != nil {
				t.Fatal(err)
			}
		}
	}
	put("a", 20)
	src.Stop()
	target := "s3://" + minioBucket + "/killed"
	if res := run("backup", "create", "--data-dir="+src.DataDir(), "--target="+target); res.Code != 0 {
		t.Fatalf("first backup: exit %d, stderr %s", res.Code, res.Stderr)
	}
	src.Restart()
	cli = src.Client(t)
	put("b", 600) // about 40 MB: seconds of uploads, some as multipart
	want := readBackupState(t, ctx, cli, src.Endpoint())
	src.Stop()

	// Start a backup and kill MinIO as soon as the second version has
	// begun to upload: a new object under files/, or a multipart upload
	// under way.
	mc := srv.client()
	countFiles := func() int {
		n := 0
		for o := range mc.ListObjects(ctx, minioBucket, minio.ListObjectsOptions{Prefix: "killed/files/", Recursive: true}) {
			if o.Err == nil {
				n++
			}
		}
		return n
	}
	before := countFiles()
	cmd := exec.Command(binary(t, strata), "backup", "create", "--data-dir="+src.DataDir(), "--target="+target)
	cmd.Env = append(cmd.Environ(), env...)
	var stderr testutil.SyncBuffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	killed := false
	for deadline := time.Now().Add(60 * time.Second); !killed && time.Now().Before(deadline); {
		select {
		case err := <-waited:
			t.Fatalf("the backup finished (%v) before it was seen uploading; stderr %s", err, stderr.String())
		default:
		}
		uploading := false
		for u := range mc.ListIncompleteUploads(ctx, minioBucket, "killed/files/", true) {
			uploading = uploading || u.Err == nil
		}
		if uploading || countFiles() > before {
			srv.kill()
			killed = true
		}
	}
	if !killed {
		t.Fatal("the backup was not seen uploading in 60 s")
	}
	select {
	case err := <-waited:
		if err == nil || !strings.Contains(stderr.String(), srv.addr) {
			t.Errorf("backup with MinIO killed under it: %v, stderr %q; want a failure naming %s", err, stderr.String(), srv.addr)
		}
	case <-time.After(120 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the backup did not end within 120 s of MinIO's death")
	}

	srv.start()
	if res := run("backup", "list", "--target="+target); res.Code != 0 || strings.Count(res.Stdout, "\n") != 2 {
		t.Errorf("after the interrupted backup: exit %d, stdout %q, stderr %q; want version 1 alone", res.Code, res.Stdout, res.Stderr)
	}
	if res := run("backup", "verify", "--target="+target, "--version=1"); res.Code != 0 {
		t.Errorf("verify of version 1 after the interrupted backup: exit %d, %s %s", res.Code, res.Stdout, res.Stderr)
	}
	res := run("backup", "create", "--data-dir="+src.DataDir(), "--target="+target)
	if res.Code != 0 || !strings.HasPrefix(res.Stdout, "version 2 ") {
		t.Fatalf("backup after MinIO came back: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	t.Logf("the backup after the interrupted one: %s", res.Stdout)
	if res := run("backup", "verify", "--target="+target); res.Code != 0 {
		t.Errorf("verify of version 2: exit %d, %s %s", res.Code, res.Stdout, res.Stderr)
	}
	restoreAndCompare(t, target, env, 2, want)
}
