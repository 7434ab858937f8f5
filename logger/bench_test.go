package logger

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/raftlog"
)

type discardSender struct{}

func (discardSender) Send([]*raftpb.Message) {}

type noPeers struct{}

func (noPeers) AddPeer(uint64, []string)    {}
func (noPeers) UpdatePeer(uint64, []string) {}
func (noPeers) RemovePeer(uint64)           {}

// BenchmarkLearnerLogging is the logger's logging rate alone (seed 003's
// "maximum logging throughput", measured there at about 46,000
// commands/s): one learner over a raftlog on the real disk (t.TempDir,
// fdatasync per Ready), fed appends of batch 1,024-byte entries as a
// leader sends them (MsgApp, commit index at the last entry), with no
// network and no leader: each append is stepped, then the Ready performed
// (append with one sync, acknowledgement handed to a sender that drops it).
// Reports entries/s. docs/bench/logger.md has a run.
func BenchmarkLearnerLogging(b *testing.B) {
	for _, batch := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			dir := b.TempDir()
			log, err := raftlog.Open(raftlog.Options{FS: vfs.Default, Dirs: []string{filepath.Join(dir, "log")}})
			if err != nil {
				b.Fatal(err)
			}
			defer log.Close()
			ln, err := newLearner(learnerConfig{
				Record: &ClusterRecord{ClusterID: 0xc1, MemberID: 2, Peers: map[uint64][]string{1: {"http://leader"}}, Voters: []uint64{1}},
				Dir:    dir, FS: vfs.Default, Log: log, Inbox: NewInbox(), Sender: discardSender{}, Peers: noPeers{},
				TickInterval: time.Hour,
			})
			if err != nil {
				b.Fatal(err)
			}
			data := make([]byte, 1024)
			var last uint64
			b.ResetTimer()
			start := time.Now()
			for n := 0; n < b.N; n += batch {
				ents := make([]*raftpb.Entry, batch)
				for i := range ents {
					ents[i] = &raftpb.Entry{Index: proto.Uint64(last + uint64(i) + 1), Term: proto.Uint64(1),
						Type: raftpb.EntryNormal.Enum(), Data: data}
				}
				ln.step(&raftpb.Message{Type: raftpb.MessageType_MsgApp.Enum(), From: proto.Uint64(1), To: proto.Uint64(2),
					Term: proto.Uint64(1), Index: proto.Uint64(last), LogTerm: proto.Uint64(min(last, 1)),
					Commit: proto.Uint64(last + uint64(batch)), Entries: ents})
				for ln.rn.HasReady() {
					if err := ln.handleReady(); err != nil {
						b.Fatal(err)
					}
				}
				last += uint64(batch)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			if got, _ := log.LastIndex(); got != last {
				b.Fatalf("the log ends at %d, want %d", got, last)
			}
			b.ReportMetric(float64(last)/elapsed.Seconds(), "entries/s")
		})
	}
}
