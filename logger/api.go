package logger

import (
	"errors"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/raftlog"
)

// The logger API's messages, encoded in the protobuf encoding with
// protowire by hand (as transport's frames are; transport/doc.go says why).
// As a .proto they read:
//
//	service Logger {
//	  rpc Status(StatusRequest) returns (StatusResponse);
//	  rpc Recover(RecoverRequest) returns (stream RecoverResponse);
//	  rpc Truncate(TruncateRequest) returns (TruncateResponse);
//	}
//	message StatusRequest   { uint64 cluster_id = 1; }           // 0: every cluster
//	message StatusResponse  { repeated ClusterStatus clusters = 1; }
//	message ClusterStatus {
//	  uint64 cluster_id = 1;  uint64 member_id = 2;
//	  uint64 first_index = 3; uint64 last_index = 4; uint64 commit_index = 5;
//	  uint64 bytes = 6;       uint64 leader_commit = 7; uint64 lag = 8;
//	  uint64 leader = 9;      repeated Gap gaps = 10;
//	  repeated Truncation truncations = 11; uint64 truncation_point = 12;
//	  uint64 compacted_first = 13; uint64 compacted_last = 14;
//	  uint64 compacted_batches = 15; uint64 compacted_bytes = 16;
//	  uint64 compacted_entries = 17; uint64 compacted_records = 18;
//	  string compaction = 19;
//	}
//	message Truncation { uint64 member_id = 1; uint64 index = 2; }
//	message Gap {
//	  uint64 snapshot_index = 1; uint64 snapshot_term = 2;
//	  uint64 discarded_first = 3; uint64 discarded_last = 4;
//	  int64 at_unix_nano = 5;     bool reconciled = 6;
//	}
//	message RecoverRequest  { uint64 cluster_id = 1; uint64 first = 2; uint64 last = 3;
//	                          bool accept_batches = 4; }
//	message RecoverResponse { repeated raftpb.Entry entries = 1; repeated CompactedBatch batches = 2; }
//	message CompactedBatch {  // raftlog.CompactedBatch; payload: logcompact's (logcompact/FORMAT.md)
//	  uint64 first_index = 1; uint64 last_index = 2; uint64 last_term = 3;
//	  uint64 records = 4;     uint32 payload_format = 5; bytes payload = 6;
//	}
//	message TruncateRequest  { uint64 cluster_id = 1; uint64 member_id = 2; uint64 index = 3; }
//	message TruncateResponse { uint64 truncation_point = 1; repeated Truncation truncations = 2; }
//
// Field numbers are wire format: never renumber them, only add new ones.

// codecName is the gRPC content subtype of the logger API
// ("application/grpc+strata-logger"). It is wire format.
const codecName = "strata-logger"

// errBadMessage is wrapped by every decoding error of the logger API.
var errBadMessage = errors.New("bad logger API message")

// message is a logger API message.
type message interface {
	marshal() ([]byte, error)
	unmarshal(b []byte) error
}

// StatusRequest asks for one cluster's status, or every cluster's (0).
type StatusRequest struct{ ClusterID uint64 }

// StatusResponse holds one ClusterStatus per cluster asked, by cluster ID.
type StatusResponse struct{ Clusters []*ClusterStatus }

// ClusterStatus is what the logger holds of one cluster.
type ClusterStatus struct {
	// ClusterID is the cluster's ID, MemberID the logger's in it.
	ClusterID, MemberID uint64
	// FirstIndex and LastIndex bound the entries held (LastIndex <
	// FirstIndex: none); CommitIndex is the highest the logger knows
	// committed and holds: Recover serves [FirstIndex, CommitIndex].
	FirstIndex, LastIndex, CommitIndex uint64
	// Bytes are the bytes of the log's frames on disk.
	Bytes uint64
	// LeaderCommit is the leader's commit index as last announced in an
	// append; Lag is LeaderCommit less LastIndex (0 if not behind).
	LeaderCommit, Lag uint64
	// Leader is the leader's member ID as the learner knows it (0: none).
	Leader uint64
	// Gaps are the snapshots the leader sent instead of entries, oldest
	// first.
	Gaps []Gap
	// Truncations are the voters' Truncate requests (the highest of
	// each), by member ID; TruncationPoint is the index up to which they
	// let the log be truncated (0: none yet).
	Truncations     []Truncation
	TruncationPoint uint64
	// Log compaction (docs/logger.md, "Log compaction"). CompactedFirst
	// and CompactedLast bound the entries the compacted batch files stand
	// for (CompactedBatches of them, 0: none): FirstIndex is then
	// CompactedFirst, and plain entries are held from CompactedLast+1.
	// CompactedBytes is the files' size, CompactedEntries the entries they
	// stand for, CompactedRecords the records they hold instead.
	CompactedFirst, CompactedLast      uint64
	CompactedBatches, CompactedBytes   uint64
	CompactedEntries, CompactedRecords uint64
	// Compaction is "off", "on", or "stopped: " and why (compaction.go,
	// invariant 3).
	Compaction string
}

// TruncateRequest is a member's request to drop the entries <= Index.
type TruncateRequest struct{ ClusterID, MemberID, Index uint64 }

// TruncateResponse is the truncation point after the request, and every
// voter's request.
type TruncateResponse struct {
	TruncationPoint uint64
	Truncations     []Truncation
}

// RecoverRequest asks for the entries [First, Last] of a cluster.
// AcceptBatches says the client takes compacted batches for the entries
// log compaction replaced; without it such a range is refused
// (FailedPrecondition).
type RecoverRequest struct {
	ClusterID, First, Last uint64
	AcceptBatches          bool
}

// RecoverResponse is one batch of entries, in index order, or compacted
// batches (each standing for a range of entries, consecutive), never both.
type RecoverResponse struct {
	Entries []*raftpb.Entry
	Batches []*raftlog.CompactedBatch
}

const (
	fReqCluster protowire.Number = 1

	fRespClusters protowire.Number = 1

	fStCluster      protowire.Number = 1
	fStMember       protowire.Number = 2
	fStFirst        protowire.Number = 3
	fStLast         protowire.Number = 4
	fStCommit       protowire.Number = 5
	fStBytes        protowire.Number = 6
	fStLeaderCommit protowire.Number = 7
	fStLag          protowire.Number = 8
	fStLeader       protowire.Number = 9
	fStGaps         protowire.Number = 10

	fGapIndex          protowire.Number = 1
	fGapTerm           protowire.Number = 2
	fGapDiscardedFirst protowire.Number = 3
	fGapDiscardedLast  protowire.Number = 4
	fGapAt             protowire.Number = 5
	fGapReconciled     protowire.Number = 6

	fRecCluster protowire.Number = 1
	fRecFirst   protowire.Number = 2
	fRecLast    protowire.Number = 3

	fRecEntries protowire.Number = 1
	fRecBatches protowire.Number = 2
	fRecAccept  protowire.Number = 4

	fBatchFirst   protowire.Number = 1
	fBatchLast    protowire.Number = 2
	fBatchTerm    protowire.Number = 3
	fBatchRecords protowire.Number = 4
	fBatchFormat  protowire.Number = 5
	fBatchPayload protowire.Number = 6

	fStCompactedFirst   protowire.Number = 13
	fStCompactedLast    protowire.Number = 14
	fStCompactedBatches protowire.Number = 15
	fStCompactedBytes   protowire.Number = 16
	fStCompactedEntries protowire.Number = 17
	fStCompactedRecords protowire.Number = 18
	fStCompaction       protowire.Number = 19

	fStTruncations     protowire.Number = 11
	fStTruncationPoint protowire.Number = 12

	fTrMember protowire.Number = 1
	fTrIndex  protowire.Number = 2

	fTruncCluster protowire.Number = 1
	fTruncMember  protowire.Number = 2
	fTruncIndex   protowire.Number = 3

	fTruncRespPoint       protowire.Number = 1
	fTruncRespTruncations protowire.Number = 2
)

func appendTruncations(b []byte, n protowire.Number, ts []Truncation) []byte {
	for _, t := range ts {
		tb := appendUint(nil, fTrMember, t.MemberID)
		tb = appendUint(tb, fTrIndex, t.Index)
		b = appendBytes(b, n, tb)
	}
	return b
}

func decodeTruncation(b []byte) (Truncation, error) {
	var t Truncation
	err := decodeFields(b, func(n protowire.Number, v uint64) error {
		switch n {
		case fTrMember:
			t.MemberID = v
		case fTrIndex:
			t.Index = v
		}
		return nil
	}, nil)
	return t, err
}

func (m *TruncateRequest) marshal() ([]byte, error) {
	b := appendUint(nil, fTruncCluster, m.ClusterID)
	b = appendUint(b, fTruncMember, m.MemberID)
	return appendUint(b, fTruncIndex, m.Index), nil
}

func (m *TruncateRequest) unmarshal(b []byte) error {
	return decodeFields(b, func(n protowire.Number, v uint64) error {
		switch n {
		case fTruncCluster:
			m.ClusterID = v
		case fTruncMember:
			m.MemberID = v
		case fTruncIndex:
			m.Index = v
		}
		return nil
	}, nil)
}

func (m *TruncateResponse) marshal() ([]byte, error) {
	b := appendUint(nil, fTruncRespPoint, m.TruncationPoint)
	return appendTruncations(b, fTruncRespTruncations, m.Truncations), nil
}

func (m *TruncateResponse) unmarshal(b []byte) error {
	return decodeFields(b, func(n protowire.Number, v uint64) error {
		if n == fTruncRespPoint {
			m.TruncationPoint = v
		}
		return nil
	}, func(n protowire.Number, v []byte) error {
		if n != fTruncRespTruncations {
			return nil
		}
		t, err := decodeTruncation(v)
		m.Truncations = append(m.Truncations, t)
		return err
	})
}

func appendUint(b []byte, n protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, n, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendBytes(b []byte, n protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

// decodeFields calls varint for every varint field and bytes for every
// length-delimited one; other wire types are skipped, as unknown fields are.
func decodeFields(b []byte, varint func(protowire.Number, uint64) error, bytes func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: tag: %v", errBadMessage, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType && varint != nil:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return fmt.Errorf("%w: field %d: %v", errBadMessage, num, protowire.ParseError(n))
			}
			b = b[n:]
			if err := varint(num, v); err != nil {
				return err
			}
		case typ == protowire.BytesType && bytes != nil:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return fmt.Errorf("%w: field %d: %v", errBadMessage, num, protowire.ParseError(n))
			}
			b = b[n:]
			if err := bytes(num, v); err != nil {
				return err
			}
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("%w: field %d: %v", errBadMessage, num, protowire.ParseError(n))
			}
			b = b[n:]
		}
	}
	return nil
}

func (m *StatusRequest) marshal() ([]byte, error) {
	return appendUint(nil, fReqCluster, m.ClusterID), nil
}

func (m *StatusRequest) unmarshal(b []byte) error {
	return decodeFields(b, func(n protowire.Number, v uint64) error {
		if n == fReqCluster {
			m.ClusterID = v
		}
		return nil
	}, nil)
}

func (m *StatusResponse) marshal() ([]byte, error) {
	var b []byte
	for _, c := range m.Clusters {
		cb := c.marshal()
		b = appendBytes(b, fRespClusters, cb)
	}
	return b, nil
}

func (m *StatusResponse) unmarshal(b []byte) error {
	return decodeFields(b, nil, func(n protowire.Number, v []byte) error {
		if n != fRespClusters {
			return nil
		}
		c := &ClusterStatus{}
		if err := c.unmarshal(v); err != nil {
			return err
		}
		m.Clusters = append(m.Clusters, c)
		return nil
	})
}

func (c *ClusterStatus) marshal() []byte {
	var b []byte
	for _, f := range []struct {
		n protowire.Number
		v uint64
	}{
		{fStCluster, c.ClusterID}, {fStMember, c.MemberID}, {fStFirst, c.FirstIndex}, {fStLast, c.LastIndex},
		{fStCommit, c.CommitIndex}, {fStBytes, c.Bytes}, {fStLeaderCommit, c.LeaderCommit}, {fStLag, c.Lag},
		{fStLeader, c.Leader}, {fStTruncationPoint, c.TruncationPoint},
		{fStCompactedFirst, c.CompactedFirst}, {fStCompactedLast, c.CompactedLast},
		{fStCompactedBatches, c.CompactedBatches}, {fStCompactedBytes, c.CompactedBytes},
		{fStCompactedEntries, c.CompactedEntries}, {fStCompactedRecords, c.CompactedRecords},
	} {
		b = appendUint(b, f.n, f.v)
	}
	if c.Compaction != "" {
		b = appendBytes(b, fStCompaction, []byte(c.Compaction))
	}
	for _, g := range c.Gaps {
		var gb []byte
		gb = appendUint(gb, fGapIndex, g.SnapshotIndex)
		gb = appendUint(gb, fGapTerm, g.SnapshotTerm)
		gb = appendUint(gb, fGapDiscardedFirst, g.DiscardedFirst)
		gb = appendUint(gb, fGapDiscardedLast, g.DiscardedLast)
		if !g.At.IsZero() {
			gb = appendUint(gb, fGapAt, uint64(g.At.UnixNano()))
		}
		if g.Reconciled {
			gb = appendUint(gb, fGapReconciled, 1)
		}
		b = appendBytes(b, fStGaps, gb)
	}
	return appendTruncations(b, fStTruncations, c.Truncations)
}

func (c *ClusterStatus) unmarshal(b []byte) error {
	return decodeFields(b, func(n protowire.Number, v uint64) error {
		switch n {
		case fStCluster:
			c.ClusterID = v
		case fStMember:
			c.MemberID = v
		case fStFirst:
			c.FirstIndex = v
		case fStLast:
			c.LastIndex = v
		case fStCommit:
			c.CommitIndex = v
		case fStBytes:
			c.Bytes = v
		case fStLeaderCommit:
			c.LeaderCommit = v
		case fStLag:
			c.Lag = v
		case fStLeader:
			c.Leader = v
		case fStTruncationPoint:
			c.TruncationPoint = v
		case fStCompactedFirst:
			c.CompactedFirst = v
		case fStCompactedLast:
			c.CompactedLast = v
		case fStCompactedBatches:
			c.CompactedBatches = v
		case fStCompactedBytes:
			c.CompactedBytes = v
		case fStCompactedEntries:
			c.CompactedEntries = v
		case fStCompactedRecords:
			c.CompactedRecords = v
		}
		return nil
	}, func(n protowire.Number, v []byte) error {
		if n == fStCompaction {
			c.Compaction = string(v)
			return nil
		}
		if n == fStTruncations {
			t, err := decodeTruncation(v)
			c.Truncations = append(c.Truncations, t)
			return err
		}
		if n != fStGaps {
			return nil
		}
		var g Gap
		err := decodeFields(v, func(n protowire.Number, v uint64) error {
			switch n {
			case fGapIndex:
				g.SnapshotIndex = v
			case fGapTerm:
				g.SnapshotTerm = v
			case fGapDiscardedFirst:
				g.DiscardedFirst = v
			case fGapDiscardedLast:
				g.DiscardedLast = v
			case fGapAt:
				g.At = unixNano(int64(v))
			case fGapReconciled:
				g.Reconciled = v != 0
			}
			return nil
		}, nil)
		c.Gaps = append(c.Gaps, g)
		return err
	})
}

func (m *RecoverRequest) marshal() ([]byte, error) {
	b := appendUint(nil, fRecCluster, m.ClusterID)
	b = appendUint(b, fRecFirst, m.First)
	b = appendUint(b, fRecLast, m.Last)
	if m.AcceptBatches {
		b = appendUint(b, fRecAccept, 1)
	}
	return b, nil
}

func (m *RecoverRequest) unmarshal(b []byte) error {
	return decodeFields(b, func(n protowire.Number, v uint64) error {
		switch n {
		case fRecCluster:
			m.ClusterID = v
		case fRecFirst:
			m.First = v
		case fRecLast:
			m.Last = v
		case fRecAccept:
			m.AcceptBatches = v != 0
		}
		return nil
	}, nil)
}

func (m *RecoverResponse) marshal() ([]byte, error) {
	var b []byte
	for _, e := range m.Entries {
		eb, err := proto.Marshal(e)
		if err != nil {
			return nil, fmt.Errorf("encode entry %d: %w", e.GetIndex(), err)
		}
		b = appendBytes(b, fRecEntries, eb)
	}
	for _, cb := range m.Batches {
		bb := appendUint(nil, fBatchFirst, cb.FirstIndex)
		bb = appendUint(bb, fBatchLast, cb.LastIndex)
		bb = appendUint(bb, fBatchTerm, cb.LastTerm)
		bb = appendUint(bb, fBatchRecords, cb.Records)
		bb = appendUint(bb, fBatchFormat, uint64(cb.PayloadFormat))
		bb = appendBytes(bb, fBatchPayload, cb.Payload)
		b = appendBytes(b, fRecBatches, bb)
	}
	return b, nil
}

func decodeCompactedBatch(v []byte) (*raftlog.CompactedBatch, error) {
	cb := &raftlog.CompactedBatch{}
	err := decodeFields(v, func(n protowire.Number, v uint64) error {
		switch n {
		case fBatchFirst:
			cb.FirstIndex = v
		case fBatchLast:
			cb.LastIndex = v
		case fBatchTerm:
			cb.LastTerm = v
		case fBatchRecords:
			cb.Records = v
		case fBatchFormat:
			if v > 1<<32-1 {
				return fmt.Errorf("%w: batch payload format %d", errBadMessage, v)
			}
			cb.PayloadFormat = uint32(v)
		}
		return nil
	}, func(n protowire.Number, v []byte) error {
		if n == fBatchPayload {
			cb.Payload = append([]byte(nil), v...)
		}
		return nil
	})
	if err == nil && cb.LastIndex < cb.FirstIndex {
		err = fmt.Errorf("%w: compacted batch %d-%d", errBadMessage, cb.FirstIndex, cb.LastIndex)
	}
	return cb, err
}

func (m *RecoverResponse) unmarshal(b []byte) error {
	return decodeFields(b, nil, func(n protowire.Number, v []byte) error {
		if n == fRecBatches {
			cb, err := decodeCompactedBatch(v)
			if err != nil {
				return err
			}
			m.Batches = append(m.Batches, cb)
			return nil
		}
		if n != fRecEntries {
			return nil
		}
		e := &raftpb.Entry{}
		if err := proto.Unmarshal(v, e); err != nil {
			return fmt.Errorf("%w: entry: %v", errBadMessage, err)
		}
		m.Entries = append(m.Entries, e)
		return nil
	})
}

// codec lets gRPC carry the logger API's messages. It is registered under
// codecName, so the server's default codec is untouched.
type codec struct{}

func init() { encoding.RegisterCodec(codec{}) }

// Marshal implements encoding.Codec.
func (codec) Marshal(v any) ([]byte, error) {
	m, ok := v.(message)
	if !ok {
		return nil, fmt.Errorf("logger codec: cannot marshal %T", v)
	}
	return m.marshal()
}

// Unmarshal implements encoding.Codec.
func (codec) Unmarshal(data []byte, v any) error {
	m, ok := v.(message)
	if !ok {
		return fmt.Errorf("logger codec: cannot unmarshal into %T", v)
	}
	return m.unmarshal(data)
}

// Name implements encoding.Codec.
func (codec) Name() string { return codecName }
