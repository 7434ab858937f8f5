package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/raftlog"
)

// runInspect implements `strata inspect log`: a read-only listing of the
// raft log's files, in the spirit of etcd-dump-logs.
func runInspect(args []string) int {
	if len(args) == 0 || args[0] != "log" {
		fmt.Fprintln(os.Stderr, "usage: strata inspect log --data-dir DIR [--log-dir DIR]... [--json | --entries]")
		return 2
	}
	fs := flag.NewFlagSet("strata inspect log", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "The member's data directory.")
	var logDirs stringList
	fs.Var(&logDirs, "log-dir", "A raft log directory, if the member ran with --log-dir (repeatable).")
	asJSON := fs.Bool("json", false, "Print JSON, one object per file, for scripts.")
	entries := fs.Bool("entries", false, "Print, as JSON, the last HardState and every raft entry the log's segments still hold, "+
		"including those at or below the snapshot point (for tools that rebuild a member's history). One log directory only.")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	if len(logDirs) == 0 {
		if *dataDir == "" {
			fmt.Fprintln(os.Stderr, "strata inspect log: --data-dir or --log-dir is required")
			return 2
		}
		logDirs = stringList{datadir.Log(*dataDir)}
	}
	if *entries {
		if len(logDirs) != 1 {
			fmt.Fprintln(os.Stderr, "strata inspect log: --entries reads one log directory")
			return 2
		}
		if err := printEntries(os.Stdout, logDirs[0]); err != nil {
			fmt.Fprintf(os.Stderr, "strata inspect log: %v\n", err)
			return 1
		}
		return 0
	}
	segments, err := raftlog.Inspect(vfs.Default, logDirs)
	if err != nil {
		fmt.Fprintf(os.Stderr, "strata inspect log: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(segments); err != nil {
			fmt.Fprintf(os.Stderr, "strata inspect log: %v\n", err)
			return 1
		}
		return 0
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	// COMMANDS is what a file stands for, RECORDS what it holds (frames of
	// a segment, records of a compacted batch); LIVE-* leave out a
	// segment's entries at or below the snapshot point, which raft and
	// recovery no longer need.
	fmt.Fprintln(tw, "FILE\tFIRST\tLAST\tRECORDS\tBYTES\tCOMPACTED\tCOMMANDS\tLIVE-COMMANDS\tLIVE-BYTES")
	var records int
	var bytes, liveBytes int64
	var commands, live, snap uint64
	for _, s := range segments {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%v\t%d\t%d\t%d\n", filepath.Join(s.Dir, s.Name), s.FirstIndex, s.LastIndex,
			s.Records, s.Bytes, s.Compacted, s.Commands, s.LiveCommands, s.LiveBytes)
		records += s.Records
		bytes += s.Bytes
		commands += s.Commands
		live += s.LiveCommands
		liveBytes += s.LiveBytes
		snap = max(snap, s.SnapshotIndex)
	}
	fmt.Fprintf(tw, "total: %d files\t\t\t%d\t%d\t\t%d\t%d\t%d\n", len(segments), records, bytes, commands, live, liveBytes)
	fmt.Fprintf(tw, "snapshot point: %d\t\t\t\t\t\t\t\t\n", snap)
	if err := tw.Flush(); err != nil {
		return 1
	}
	return 0
}

// exportedEntries is what `strata inspect log --entries` prints: plain
// fields, so that a reader needs neither strata's packages nor a particular
// raftpb version.
type exportedEntries struct {
	HardState struct {
		Term   uint64 `json:"term"`
		Vote   uint64 `json:"vote"`
		Commit uint64 `json:"commit"`
	} `json:"hard_state"`
	Entries []exportedEntry `json:"entries"`
}

type exportedEntry struct {
	Index uint64 `json:"index"`
	Term  uint64 `json:"term"`
	Type  int32  `json:"type"` // raftpb.EntryType
	Data  []byte `json:"data"` // base64 in JSON
}

func printEntries(w io.Writer, dir string) error {
	hs, ents, err := raftlog.ReadEntries(vfs.Default, dir)
	if err != nil {
		return err
	}
	var out exportedEntries
	out.HardState.Term, out.HardState.Vote, out.HardState.Commit = hs.GetTerm(), hs.GetVote(), hs.GetCommit()
	out.Entries = make([]exportedEntry, 0, len(ents))
	for _, e := range ents {
		out.Entries = append(out.Entries, exportedEntry{Index: e.GetIndex(), Term: e.GetTerm(), Type: int32(e.GetType()), Data: e.GetData()})
	}
	return json.NewEncoder(w).Encode(out)
}
