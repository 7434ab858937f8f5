package pebble

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func commitKV(t *testing.T, e *Engine, index uint64, kv map[string]string) {
	t.Helper()
	b := e.NewBatch()
	for k, v := range kv {
		if err := b.Set([]byte(k), []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Commit(index); err != nil {
		t.Fatal(err)
	}
}

func contents(t *testing.T, e *Engine) map[string]string {
	t.Helper()
	got := map[string]string{}
	it := e.NewIter([]byte("a"), []byte("z"))
	for ok := it.First(); ok; ok = it.Next() {
		got[string(it.Key())] = string(it.Value())
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	return got
}

// A snapshot exported from one engine and installed in another replaces the
// receiver's content exactly -- keys it had that the sender lacks are gone
// -- and the receiver's applied and durable index become the sender's,
// also after a reopen.
func TestSnapshotExportInstall(t *testing.T) {
	sender := openMem(t, vfs.NewMem(), Options{})
	receiver := openMem(t, vfs.NewMem(), Options{})
	for i := uint64(1); i <= 20; i++ {
		commitKV(t, sender, i, map[string]string{fmt.Sprintf("k%02d", i): fmt.Sprint("v", i)})
	}
	commitKV(t, receiver, 3, map[string]string{"k01": "stale", "k99": "only-on-receiver"})
	commitKV(t, receiver, 4, map[string]string{"mx": "unflushed"})

	w, err := receiver.NewSnapshotWriter("snap.sst")
	if err != nil {
		t.Fatal(err)
	}
	view, err := sender.NewExportView()
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	// A batch after the view was taken is not in it.
	commitKV(t, sender, 21, map[string]string{"k21": "after"})
	if err := view.ForEach(w.Add); err != nil {
		t.Fatal(err)
	}
	if applied := view.AppliedIndex(); applied != 20 {
		t.Fatalf("export view holds applied index %d, want 20", applied)
	}
	if err := w.Finish(); err != nil {
		t.Fatal(err)
	}
	idx, err := receiver.InstallSnapshot("snap.sst")
	if err != nil {
		t.Fatal(err)
	}
	if idx != 20 || receiver.AppliedIndex() != 20 || receiver.DurableIndex() != 20 {
		t.Fatalf("after install: returned %d, applied %d, durable %d; want 20", idx, receiver.AppliedIndex(), receiver.DurableIndex())
	}
	want := contents(t, sender)
	delete(want, "k21")
	got := contents(t, receiver)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("receiver holds %v, want %v", got, want)
	}
	// Batches after the install build on it.
	commitKV(t, receiver, 21, map[string]string{"k21": "v21"})
	if v, err := receiver.Get([]byte("k21")); err != nil || !bytes.Equal(v, []byte("v21")) {
		t.Fatalf("get after install: %q %v", v, err)
	}
}

// An installed snapshot survives a power cut at once: InstallSnapshot's
// caller (the node) restarts the raft log after the snapshot as soon as it
// returns, so an install lost in a crash would leave the engine at its old
// index with the log's entries up to the snapshot gone. Pebble slides an
// ingest that overlaps the memtable on top of it as a flushable, which only
// its WAL would make durable; with the WAL off the install must flush.
// The receiver's memtable holds batches in every case, so the ingest
// overlaps it.
func TestSnapshotInstallSurvivesPowerCut(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flushed bool // the receiver flushed its batches before the install
	}{
		{name: "unflushed receiver"},
		{name: "flushed receiver", flushed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sender := openMem(t, vfs.NewMem(), Options{})
			defer sender.Close()
			for i := uint64(1); i <= 20; i++ {
				commitKV(t, sender, i, map[string]string{fmt.Sprintf("k%02d", i): fmt.Sprint("v", i)})
			}
			fs := vfs.NewCrashableMem()
			receiver := openMem(t, fs, Options{})
			defer receiver.Close()
			commitKV(t, receiver, 3, map[string]string{"k01": "stale", "k99": "only-on-receiver"})
			if tc.flushed {
				if err := receiver.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			commitKV(t, receiver, 4, map[string]string{"k98": "unflushed"})

			view, err := sender.NewExportView()
			if err != nil {
				t.Fatal(err)
			}
			defer view.Close()
			w, err := receiver.NewSnapshotWriter("snap.sst")
			if err != nil {
				t.Fatal(err)
			}
			if err := view.ForEach(w.Add); err != nil {
				t.Fatal(err)
			}
			if err := w.Finish(); err != nil {
				t.Fatal(err)
			}
			if _, err := receiver.InstallSnapshot("snap.sst"); err != nil {
				t.Fatal(err)
			}
			crashed := openMem(t, fs.CrashClone(vfs.CrashCloneCfg{}), Options{})
			defer crashed.Close()
			if got := crashed.AppliedIndex(); got != 20 {
				t.Fatalf("after a power cut right after the install: applied index %d, want the snapshot's 20", got)
			}
			if got, want := contents(t, crashed), contents(t, sender); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("after a power cut right after the install: content %v, want the snapshot's %v", got, want)
			}
		})
	}
}
