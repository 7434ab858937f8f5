package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/raftlog"
)

// TestPrintEntries: `strata inspect log --entries` prints the HardState and
// every entry of the log, with their data, as JSON a tool can decode.
func TestPrintEntries(t *testing.T) {
	dir := t.TempDir()
	l, err := raftlog.Open(raftlog.Options{FS: vfs.Default, Dirs: []string{dir}, SegmentSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	var want []*raftpb.Entry
	for i := uint64(1); i <= 5; i++ {
		want = append(want, &raftpb.Entry{Index: proto.Uint64(i), Term: proto.Uint64(1),
			Type: raftpb.EntryType_EntryNormal.Enum(), Data: []byte(fmt.Sprintf("data %d", i))})
	}
	want[0].Type = raftpb.EntryType_EntryConfChange.Enum()
	hs := &raftpb.HardState{Term: proto.Uint64(1), Vote: proto.Uint64(7), Commit: proto.Uint64(4)}
	if err := l.Append(want, hs); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := printEntries(&buf, dir); err != nil {
		t.Fatal(err)
	}
	var got exportedEntries
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.HardState.Term != 1 || got.HardState.Vote != 7 || got.HardState.Commit != 4 {
		t.Fatalf("hard state %+v", got.HardState)
	}
	if len(got.Entries) != len(want) {
		t.Fatalf("%d entries, want %d", len(got.Entries), len(want))
	}
	for i, e := range got.Entries {
		w := want[i]
		if e.Index != w.GetIndex() || e.Term != w.GetTerm() || e.Type != int32(w.GetType()) || string(e.Data) != string(w.GetData()) {
			t.Fatalf("entry %d: %+v, want %v", i, e, w)
		}
	}
}
