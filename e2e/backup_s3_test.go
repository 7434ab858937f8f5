package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/internal/testutil"
)

var (
	s3Once sync.Once
	s3Bin  string
	s3Err  error
)

// s3ServerBinary builds tools/cmd/s3server once per test binary.
func s3ServerBinary(t *testing.T) string {
	t.Helper()
	s3Once.Do(func() {
		root, err := testutil.RepoRoot()
		if err != nil {
			s3Err = err
			return
		}
		s3Bin, s3Err = testutil.BuildTool(root, binDir, "./cmd/s3server")
	})
	if s3Err != nil {
		t.Fatalf("build s3server: %v", s3Err)
	}
	return s3Bin
}

// s3Server is one run of tools/cmd/s3server: an S3-compatible store on a
// loopback port whose objects live in a file of the test's temp dir. It is
// signalled through its own os.Process only (never by name) and killed
// when the test ends, or with the test binary (Pdeathsig).
type s3Server struct {
	t        *testing.T
	addr, db string
	bucket   string
	cmd      *exec.Cmd
	out      *testutil.SyncBuffer
	exited   chan struct{}
}

func startS3Server(t *testing.T, addr, db, bucket string) *s3Server {
	t.Helper()
	s := &s3Server{t: t, addr: addr, db: db, bucket: bucket}
	s.start()
	t.Cleanup(func() {
		s.kill()
		if t.Failed() {
			t.Logf("s3server output:\n%s", s.out.String())
		}
	})
	return s
}

// start launches the server and waits, at most 10 s, until it listens.
func (s *s3Server) start() {
	s.t.Helper()
	s.out = &testutil.SyncBuffer{}
	s.cmd = exec.Command(s3ServerBinary(s.t), "--listen="+s.addr, "--db="+s.db, "--bucket="+s.bucket)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start s3server: %v", err)
	}
	exited := make(chan struct{})
	s.exited = exited
	go func(cmd *exec.Cmd) {
		_ = cmd.Wait()
		close(exited)
	}(s.cmd)
	deadline := time.After(10 * time.Second)
	for !strings.Contains(s.out.String(), "s3server ready") {
		select {
		case <-exited:
			s.t.Fatalf("s3server exited before it was ready:\n%s", s.out.String())
		case <-deadline:
			s.t.Fatalf("s3server not ready after 10 s:\n%s", s.out.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill sends SIGKILL to this run's process and waits for it to exit.
func (s *s3Server) kill() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Kill()
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		s.t.Errorf("s3server pid %d did not exit after SIGKILL", s.cmd.Process.Pid)
	}
}

// client is a minio-go client of the server, for damaging an object.
func (s *s3Server) client() *minio.Client {
	s.t.Helper()
	c, err := minio.New(s.addr, &minio.Options{Creds: credentials.NewStaticV4("test", "testsecret", ""), Region: "us-east-1"})
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// TestBackupS3: the backup scenario (backupScenario) on an s3:// target
// served by a real S3 protocol server (tools/cmd/s3server) on a free port,
// reached through the AWS_* variables; then, with the server killed -9, a
// backup fails clearly and writes nothing, and once the server is back on
// its data the next backup completes and verifies.
func TestBackupS3(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePorts(t, 1)[0])
	const bucket = "strata-e2e"
	srv := startS3Server(t, addr, t.TempDir()+"/s3.db", bucket)
	env := []string{"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=testsecret", "AWS_REGION=us-east-1", "AWS_ENDPOINT_URL=http://" + addr}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	src := backupScenario(t, "s3://"+bucket+"/cluster-a", env, func(sum string) {
		c := srv.client()
		key := "cluster-a/files/" + sum
		obj, err := c.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(obj)
		obj.Close()
		if err != nil {
			t.Fatal(err)
		}
		raw[len(raw)/2] ^= 1
		if _, err := c.PutObject(ctx, bucket, key, bytes.NewReader(raw), int64(len(raw)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	run := func(args ...string) testutil.Result {
		return testutil.RunToExit(t, 60*time.Second, "", env, binary(t, strata), args...)
	}
	other := "s3://" + bucket + "/cluster-b"
	srv.kill()
	if res := run("backup", "create", "--data-dir="+src.DataDir(), "--target="+other); res.Code == 0 || !strings.Contains(res.Stderr, addr) {
		t.Errorf("backup with the S3 server down: exit %d, stderr %q; want a failure naming %s", res.Code, res.Stderr, addr)
	}
	srv.start()
	if res := run("backup", "list", "--target="+other); res.Code != 0 || strings.Count(res.Stdout, "\n") != 1 {
		t.Errorf("after the failed backup: exit %d, stdout %q, stderr %q; want no version", res.Code, res.Stdout, res.Stderr)
	}
	if res := run("backup", "create", "--data-dir="+src.DataDir(), "--target="+other); res.Code != 0 || !strings.HasPrefix(res.Stdout, "version 1 ") {
		t.Errorf("backup after the S3 server came back: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	if res := run("backup", "verify", "--target="+other); res.Code != 0 {
		t.Errorf("verify: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	if res := run("backup", "list", "--target=s3://no-such-bucket/x"); res.Code == 0 || !strings.Contains(res.Stderr, `bucket "no-such-bucket" does not exist`) {
		t.Errorf("list of a missing bucket: exit %d, stderr %q", res.Code, res.Stderr)
	}

	// The Target contract on S3 itself: a name is never overwritten (the
	// conditional PUT), absent names are ErrNotExist, empty objects work.
	tg, err := backup.OpenTarget(ctx, "s3://"+bucket+"/contract", backup.TargetOptions{
		Endpoint: "http://" + addr, Region: "us-east-1", AccessKey: "test", SecretKey: "testsecret"})
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{0, 5} {
		name := fmt.Sprintf("files/obj%d", size)
		body := strings.Repeat("x", size)
		if err := tg.Put(ctx, name, strings.NewReader(body), int64(size)); err != nil {
			t.Fatalf("put %s: %v", name, err)
		}
		if err := tg.Put(ctx, name, strings.NewReader(strings.Repeat("y", size)), int64(size)); !errors.Is(err, backup.ErrExist) {
			t.Errorf("second put of %s = %v, want ErrExist", name, err)
		}
		r, err := tg.Get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || string(got) != body {
			t.Errorf("get %s = %q, %v; want %q (the first put's)", name, got, err, body)
		}
	}
	// A table larger than minio-go's single-PUT size goes up in parts.
	big := bytes.Repeat([]byte("0123456789abcdef"), 20<<20/16)
	if err := tg.Put(ctx, "big/obj", bytes.NewReader(big), int64(len(big))); err != nil {
		t.Fatalf("put of %d bytes: %v", len(big), err)
	}
	if r, err := tg.Get(ctx, "big/obj"); err != nil {
		t.Fatal(err)
	} else {
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, big) {
			t.Errorf("get of the %d-byte object: %d bytes, %v", len(big), len(got), err)
		}
	}
	if objs, err := tg.List(ctx, "files/"); err != nil || len(objs) != 2 || objs[0].Name != "files/obj0" || objs[1].Size != 5 {
		t.Errorf("list = %+v, %v", objs, err)
	}
	if _, err := tg.Get(ctx, "files/none"); !errors.Is(err, backup.ErrNotExist) {
		t.Errorf("get of an absent name = %v, want ErrNotExist", err)
	}
	if _, err := tg.Stat(ctx, "files/none"); !errors.Is(err, backup.ErrNotExist) {
		t.Errorf("stat of an absent name = %v, want ErrNotExist", err)
	}
	if err := tg.Delete(ctx, "files/obj5"); err != nil {
		t.Error(err)
	}
	if _, err := tg.Stat(ctx, "files/obj5"); !errors.Is(err, backup.ErrNotExist) {
		t.Errorf("stat after delete = %v, want ErrNotExist", err)
	}
}
