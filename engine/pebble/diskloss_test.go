package pebble

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestFlushFailsWhenTheDirectoryIsGone: with its directory deleted under
// it (a disk lost, an operator's rm), a flush fails with an error instead
// of waiting for good, Close returns, and Pebble's retries are not logged
// one by one. Pebble retried the flush in a loop, logging each failure with
// a stack trace (38 GB of log in 40 minutes here), Flush never returned,
// and a member asked to stop hung in it (found running a probe).
func TestFlushFailsWhenTheDirectoryIsGone(t *testing.T) {
	core, logs := observer.New(zapcore.ErrorLevel)
	dir := filepath.Join(t.TempDir(), "engine")
	e, err := Open(dir, Options{Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	b := e.NewBatch()
	if err := b.Set([]byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(1); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	flushed := make(chan error, 1)
	go func() { flushed <- e.Flush() }()
	select {
	case err := <-flushed:
		if err == nil {
			t.Fatal("a flush into a deleted directory succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Flush still waiting 10 s after its directory was deleted")
	}
	time.Sleep(time.Second) // Pebble goes on retrying meanwhile
	if n := logs.Len(); n > 5 {
		t.Errorf("%d error lines logged in about a second of retries, want a few", n)
	}
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close still waiting 10 s after the flush failed")
	}
}
