package logger

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestLeave: Leave refuses while a logger holds the data directory and for
// a cluster not joined; otherwise the cluster is gone, and a logger opened
// after it serves the others only.
func TestLeave(t *testing.T) {
	dir := newDataDir(t, 0, 10, 10)
	if err := addCluster(vfs.Default, dir, &ClusterRecord{ClusterID: 0xc2, MemberID: 3, PeerURLs: []string{"http://127.0.0.1:1"}}); err != nil {
		t.Fatal(err)
	}
	l, err := Open(Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := Leave(nil, dir, 0xc1); !errors.Is(err, ErrLocked) {
		t.Fatalf("Leave with the logger running: %v, want ErrLocked", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Leave(nil, dir, 0xc9); !errors.Is(err, ErrNotJoined) {
		t.Fatalf("Leave of a cluster not joined: %v, want ErrNotJoined", err)
	}
	if err := Leave(nil, dir, 0xc1); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	l, err = Open(Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := l.Clusters(); len(got) != 1 || got[0] != 0xc2 {
		t.Fatalf("clusters after Leave: %x, want [c2]", got)
	}
}
