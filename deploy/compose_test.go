// Package deploy_test runs the container image and the Compose cluster of
// deploy/ as an operator would: the image built FROM scratch from the static
// binary, three members on a private network, health checks, a member killed
// and brought back with its volume.
package deploy_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/internal/testutil"
)

// TestComposeCluster builds the image, starts deploy/compose.yaml's three
// members, waits for Docker to call all three healthy (through `strata
// health` inside the image), and checks that they form one cluster that
// replicates, keeps serving with a member killed, and gets it back with its
// data.
func TestComposeCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an image and starts containers")
	}
	if err := exec.Command("docker", "info").Run(); err != nil {
		t.Skipf("no Docker engine to run the image on: %v", err)
	}
	if _, err := exec.LookPath("docker-compose"); err != nil {
		t.Skip("docker-compose is not installed")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed (the image is built by `make image`)")
	}
	root, err := testutil.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// The image, built by `make image`, under a name of this test's own.
	suffix := fmt.Sprintf("%d%d", os.Getpid(), time.Now().UnixNano()%1e6)
	image := "strata-test:" + suffix
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", image).Run() })
	run(t, exec.Command("make", "-C", root, "image", "IMAGE="+image, "IMAGE_DIR="+t.TempDir()))

	ports := testutil.FreePorts(t, 3)
	project := "stratatest" + suffix
	compose := func(args ...string) *exec.Cmd {
		cmd := exec.Command("docker-compose", append([]string{"-p", project, "-f", filepath.Join(root, "deploy", "compose.yaml")}, args...)...)
		cmd.Env = append(os.Environ(), "STRATA_IMAGE="+image)
		for i, p := range ports {
			cmd.Env = append(cmd.Env, fmt.Sprintf("STRATA_PORT_%d=%d", i+1, p))
		}
		return cmd
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := compose("logs", "--no-color", "--tail=50").CombinedOutput()
			t.Logf("member logs:\n%s", out)
		}
		_ = compose("down", "-v", "--timeout", "5").Run()
	})
	run(t, compose("up", "-d"))
	waitHealthy(t, compose, []string{"s1", "s2", "s3"})

	endpoint := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", ports[i]) }
	client := func(i int) *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint(i)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c1, c3 := client(0), client(2)

	members, err := c1.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range members.Members {
		if m.IsLearner {
			t.Errorf("member %s is a learner", m.Name)
		}
		names = append(names, m.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"s1", "s2", "s3"}) {
		t.Fatalf("member list names %v, want s1 s2 s3", names)
	}

	if _, err := c1.Put(ctx, "greeting", "hello"); err != nil {
		t.Fatal(err)
	}
	if got := get(ctx, t, c3, "greeting"); got != "hello" {
		t.Fatalf("s3 reads %q, want the value written through s1", got)
	}

	// A member killed: the two others are a quorum and go on. If s2 led,
	// a put sent before the others elect a new leader is lost with it
	// and times out (as on etcd): a client tries again.
	run(t, compose("kill", "s2"))
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, pcancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c1.Put(pctx, "greeting", "again")
		pcancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("put with s2 down, for 30 s: %v", err)
		}
	}
	// Back on its volume, it catches up and is healthy again.
	run(t, compose("start", "s2"))
	waitHealthy(t, compose, []string{"s2"})
	c2 := client(1)
	if got := get(ctx, t, c2, "greeting"); got != "again" {
		t.Fatalf("s2 reads %q after its restart, want the value written while it was down", got)
	}
}

// run runs cmd and fails the test with its output if it fails.
func run(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out.String())
	}
}

// waitHealthy waits, for at most a minute, until Docker's health check calls
// every service healthy.
func waitHealthy(t *testing.T, compose func(args ...string) *exec.Cmd, services []string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for _, svc := range services {
		for {
			id, _ := compose("ps", "-q", svc).Output()
			status, _ := exec.Command("docker", "inspect", "--format", "{{.State.Health.Status}}", strings.TrimSpace(string(id))).Output()
			if strings.TrimSpace(string(status)) == "healthy" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not healthy after a minute (status %q)", svc, strings.TrimSpace(string(status)))
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

// get reads key linearizably.
func get(ctx context.Context, t *testing.T, c *clientv3.Client, key string) string {
	t.Helper()
	resp, err := c.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}
