package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strata-kv/strata/internal/testutil"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// seedKeys puts n keys under prefix and returns the revision after the last
// one; checkSeed later proves none of them was lost or changed.
func seedKeys(t *testing.T, cli *clientv3.Client, prefix string, n int) map[string]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	mods := map[string]int64{}
	for i := range n {
		k := fmt.Sprintf("%s%03d", prefix, i)
		resp, err := cli.Put(ctx, k, "value-of-"+k)
		if err != nil {
			t.Fatalf("seed put %s: %v", k, err)
		}
		mods[k] = resp.Header.Revision
	}
	return mods
}

// checkSeed requires every seeded key to hold its value at its revision.
func checkSeed(t *testing.T, cli *clientv3.Client, prefix string, mods map[string]int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("read back seeded keys: %v", err)
	}
	got := map[string]int64{}
	for _, kv := range resp.Kvs {
		if string(kv.Value) != "value-of-"+string(kv.Key) {
			t.Errorf("key %s holds %q", kv.Key, kv.Value)
		}
		got[string(kv.Key)] = kv.ModRevision
	}
	for k, mod := range mods {
		if got[k] != mod {
			t.Errorf("key %s: mod revision %d, want %d (0 means lost)", k, got[k], mod)
		}
	}
	if len(got) != len(mods) {
		t.Errorf("%d keys under %q, want %d", len(got), prefix, len(mods))
	}
}

// TestBadRequests sends requests a server must refuse and checks each
// error's gRPC code and message, that the refused request changed nothing,
// and that the server still serves.
func TestBadRequests(t *testing.T) {
	t.Parallel()
	type badCase struct {
		name     string
		do       func(ctx context.Context, cli *clientv3.Client) error
		code     codes.Code
		msg      string // exact message, or a prefix if prefix is set
		isPrefix bool
	}
	big := strings.Repeat("v", maxRequestBytes+1024)
	cases := []badCase{
		{name: "empty key", code: codes.InvalidArgument, msg: "etcdserver: key is not provided",
			do: func(ctx context.Context, cli *clientv3.Client) error { _, err := cli.Put(ctx, "", "v"); return err }},
		{name: "value over --max-request-bytes", code: codes.InvalidArgument, msg: "etcdserver: request is too large",
			do: func(ctx context.Context, cli *clientv3.Client) error {
				_, err := cli.Put(ctx, "seed/big", big)
				return err
			}},
		{name: "key over --max-request-bytes", code: codes.InvalidArgument, msg: "etcdserver: request is too large",
			do: func(ctx context.Context, cli *clientv3.Client) error {
				_, err := cli.Put(ctx, "seed/"+big, "v")
				return err
			}},
		{name: "request over the gRPC limit", code: codes.ResourceExhausted, msg: "grpc: received message larger than max", isPrefix: true,
			do: func(ctx context.Context, cli *clientv3.Client) error {
				_, err := cli.Put(ctx, "seed/huge", strings.Repeat("v", 1<<20))
				return err
			}},
		{name: "txn over --max-txn-ops", code: codes.InvalidArgument, msg: "etcdserver: too many operations in txn request",
			do: func(ctx context.Context, cli *clientv3.Client) error {
				ops := make([]clientv3.Op, maxTxnOps+1)
				for i := range ops {
					ops[i] = clientv3.OpPut(fmt.Sprintf("seed/txn%02d", i), "v")
				}
				_, err := cli.Txn(ctx).Then(ops...).Commit()
				return err
			}},
		{name: "revision in the future", code: codes.OutOfRange, msg: "etcdserver: mvcc: required revision is a future revision",
			do: func(ctx context.Context, cli *clientv3.Client) error {
				_, err := cli.Get(ctx, "seed/000", clientv3.WithRev(1_000_000))
				return err
			}},
		{name: "revision compacted", code: codes.OutOfRange, msg: "etcdserver: mvcc: required revision has been compacted",
			do: func(ctx context.Context, cli *clientv3.Client) error {
				_, err := cli.Get(ctx, "seed/000", clientv3.WithRev(2))
				return err
			}},
		{name: "compaction in the future", code: codes.OutOfRange, msg: "etcdserver: mvcc: required revision is a future revision",
			do: func(ctx context.Context, cli *clientv3.Client) error {
				_, err := cli.Compact(ctx, 1_000_000)
				return err
			}},
	}
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			p := start(t, f, limitFlags...)
			cli := p.Client(t)
			mods := seedKeys(t, cli, "seed/", 20)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			// Compact below the seed so that "revision compacted" has
			// something to refuse; keys at the compaction point survive it.
			if _, err := cli.Compact(ctx, 5); err != nil {
				t.Fatalf("compact: %v", err)
			}
			before, err := cli.Get(ctx, "seed/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatalf("get: %v", err)
			}
			for _, c := range cases {
				err := c.do(ctx, cli)
				code, msg := grpcError(err)
				switch {
				case err == nil:
					t.Errorf("%s: accepted, want %s %q", c.name, c.code, c.msg)
				case code != c.code:
					t.Errorf("%s: code %s (%q), want %s %q", c.name, code, msg, c.code, c.msg)
				case c.isPrefix && !strings.HasPrefix(msg, c.msg), !c.isPrefix && msg != c.msg:
					t.Errorf("%s: message %q, want %q", c.name, msg, c.msg)
				}
			}
			after, err := cli.Get(ctx, "seed/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatalf("get after the refused requests: %v", err)
			}
			if after.Header.Revision != before.Header.Revision || after.Count != before.Count {
				t.Errorf("refused requests changed the store: revision %d -> %d, count %d -> %d",
					before.Header.Revision, after.Header.Revision, before.Count, after.Count)
			}
			checkSeed(t, cli, "seed/", mods)
		})
	}
}

// grpcError returns the gRPC code and message of an error from clientv3,
// which turns the server's status errors into rpctypes.EtcdError values.
func grpcError(err error) (codes.Code, string) {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code(), ee.Error()
	}
	st, _ := status.FromError(err)
	return st.Code(), st.Message()
}

// refuseStart runs a server that must refuse to start and checks that it
// exits non-zero within a bounded time with stderr naming every want.
func refuseStart(t *testing.T, binary string, args []string, wants ...string) {
	t.Helper()
	res := testutil.RunToExit(t, 30*time.Second, "", nil, binary, args...)
	if res.Code == 0 {
		t.Fatalf("%s %s: exit code 0, want a refusal; stderr:\n%s", filepath.Base(binary), strings.Join(args, " "), res.Stderr)
	}
	t.Logf("%s refused to start (exit %d): %s", filepath.Base(binary), res.Code, errorLine(res.Stderr, wants))
	for _, w := range wants {
		if !strings.Contains(res.Stderr, w) {
			t.Errorf("%s refused to start (exit %d) but stderr does not name %q:\n%s", filepath.Base(binary), res.Code, w, res.Stderr)
		}
	}
}

// TestBadStart checks that fatal start-up errors are refused with a clear
// message and a non-zero exit, and that the data already stored survives.
func TestBadStart(t *testing.T) {
	t.Parallel()
	t.Run("unknown flag", func(t *testing.T) {
		for _, f := range flavors {
			t.Run(string(f), func(t *testing.T) {
				t.Parallel()
				p := start(t, f)
				mods := seedKeys(t, p.Client(t), "seed/", 10)
				p.Stop()
				refuseStart(t, binary(t, f), append(p.Args(), "--no-such-flag=1"), "no-such-flag")
				p.Restart()
				checkSeed(t, p.Client(t), "seed/", mods)
			})
		}
	})
	t.Run("unknown feature gate", func(t *testing.T) {
		// etcd's words, on both servers; and a gate etcd knows starts
		// both (kubeadm passes InitialCorruptCheck=true).
		for _, f := range flavors {
			t.Run(string(f), func(t *testing.T) {
				t.Parallel()
				p := start(t, f, "--feature-gates=InitialCorruptCheck=true,StopGRPCServiceOnDefrag=false")
				mods := seedKeys(t, p.Client(t), "seed/", 10)
				p.Stop()
				refuseStart(t, binary(t, f), append(p.Args(), "--feature-gates=Bogus=true"), "unrecognized feature gate: Bogus")
				p.Restart()
				checkSeed(t, p.Client(t), "seed/", mods)
			})
		}
	})
	t.Run("data dir is a regular file", func(t *testing.T) {
		// Tests run as root, so chmod cannot make a directory unwritable;
		// a regular file where the directory should be can't be written
		// into by anyone.
		for _, f := range flavors {
			t.Run(string(f), func(t *testing.T) {
				t.Parallel()
				path := filepath.Join(t.TempDir(), "not-a-dir")
				content := []byte("a file that is in the way\n")
				if err := os.WriteFile(path, content, 0o600); err != nil {
					t.Fatal(err)
				}
				p := testutil.NewProcess(t, testutil.Options{Binary: binary(t, f), DataDir: path})
				refuseStart(t, binary(t, f), p.Args(), path)
				got, err := os.ReadFile(path)
				if err != nil || !bytes.Equal(got, content) {
					t.Errorf("the file in the way was changed: %q, %v", got, err)
				}
			})
		}
	})
	t.Run("data dir locked by another strata", func(t *testing.T) {
		t.Parallel()
		first := start(t, strata)
		cli := first.Client(t)
		mods := seedKeys(t, cli, "seed/", 10)
		second := testutil.NewProcess(t, testutil.Options{Binary: binary(t, strata), DataDir: first.DataDir()})
		refuseStart(t, binary(t, strata), second.Args(), first.DataDir())
		// The first server still serves, and its data is intact, also
		// after a restart (the refused second one must not have touched
		// its files).
		checkSeed(t, cli, "seed/", mods)
		first.Kill()
		first.Restart()
		checkSeed(t, cli, "seed/", mods)
	})
}

// errorLine picks the line of a refusal worth showing: the first that
// names one of wants, else the last non-empty one.
func errorLine(stderr string, wants []string) string {
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	for _, l := range lines {
		for _, w := range wants {
			if strings.Contains(l, w) {
				return l
			}
		}
	}
	return lines[len(lines)-1]
}
