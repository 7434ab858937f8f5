package apply

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/strata-kv/strata/node"
)

// TestWarnSlowApply: a request whose apply takes longer than
// WarnApplyDuration (--warning-apply-duration) is logged in etcd's words,
// its value left out; below the threshold nothing is logged.
func TestWarnSlowApply(t *testing.T) {
	for _, tc := range []struct {
		name     string
		warn     time.Duration
		wantLogs int
	}{
		{name: "every apply slower than 1ns", warn: time.Nanosecond, wantLogs: 1},
		{name: "etcd's 100ms", wantLogs: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, store := openStore(t, vfs.NewMem())
			core, logs := observer.New(zap.WarnLevel)
			a, err := New(Config{Store: store, WarnApplyDuration: tc.warn, Logger: zap.New(core)})
			if err != nil {
				t.Fatal(err)
			}
			in := make(chan node.Committed, 1)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx, in) }()
			w := a.cfg.Waiters.Register(7)
			in <- node.Committed{Entries: []*raftpb.Entry{normal(t, 1, put(7, "k", "secret-value"))}}
			select {
			case <-w:
			case <-time.After(10 * time.Second):
				t.Fatal("put not applied")
			}
			cancel()
			<-done
			if logs.Len() != tc.wantLogs {
				t.Fatalf("%d warnings, want %d: %v", logs.Len(), tc.wantLogs, logs.All())
			}
			if tc.wantLogs == 0 {
				return
			}
			e := logs.All()[0]
			req, _ := e.ContextMap()["request"].(string)
			if e.Message != "apply request took too long" || strings.Contains(req, "secret-value") || !strings.Contains(req, "value_size") {
				t.Errorf("logged %q with request %q", e.Message, req)
			}
		})
	}
}
