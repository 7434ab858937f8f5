package logger

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.etcd.io/raft/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-kv/strata/raftlog"
)

// The logger API service, written by hand (api.go has its .proto).
const (
	serviceName    = "strata.logger.Logger"
	statusMethod   = "/" + serviceName + "/Status"
	recoverMethod  = "/" + serviceName + "/Recover"
	truncateMethod = "/" + serviceName + "/Truncate"
)

// recoverBatchBytes bounds the entries of one RecoverResponse (at least one
// entry goes in regardless).
const recoverBatchBytes = 1 << 20

// apiServer is the handler type gRPC checks registerAPI's argument against.
type apiServer interface {
	Status(ctx context.Context, req *StatusRequest) (*StatusResponse, error)
	Recover(ctx context.Context, req *RecoverRequest, send func(*RecoverResponse) error) error
	Truncate(ctx context.Context, req *TruncateRequest) (*TruncateResponse, error)
}

var apiDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*apiServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Status",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			req := &StatusRequest{}
			if err := dec(req); err != nil {
				return nil, err
			}
			return srv.(apiServer).Status(ctx, req)
		},
	}, {
		MethodName: "Truncate",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			req := &TruncateRequest{}
			if err := dec(req); err != nil {
				return nil, err
			}
			return srv.(apiServer).Truncate(ctx, req)
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName: "Recover",
		Handler: func(srv any, s grpc.ServerStream) error {
			req := &RecoverRequest{}
			if err := s.RecvMsg(req); err != nil {
				return err
			}
			return srv.(apiServer).Recover(s.Context(), req, func(r *RecoverResponse) error { return s.SendMsg(r) })
		},
		ServerStreams: true,
	}},
	Metadata: "logger/api.go",
}

func registerAPI(s *grpc.Server, l *Logger) { s.RegisterService(&apiDesc, l) }

// Status returns the status of one cluster, or of every cluster if
// req.ClusterID is 0. An unknown cluster is NotFound.
func (l *Logger) Status(ctx context.Context, req *StatusRequest) (*StatusResponse, error) {
	ids := []uint64{req.ClusterID}
	if req.ClusterID == 0 {
		ids = l.Clusters()
	}
	resp := &StatusResponse{}
	for _, id := range ids {
		c := l.cluster(id)
		if c == nil {
			return nil, status.Errorf(codes.NotFound, "logger serves no cluster %x", id)
		}
		resp.Clusters = append(resp.Clusters, c.status())
	}
	return resp, nil
}

func (c *cluster) status() *ClusterStatus {
	first, _ := c.log.FirstIndex()
	last, _ := c.log.LastIndex()
	st := &ClusterStatus{
		ClusterID:    c.rec.ClusterID,
		MemberID:     c.rec.MemberID,
		FirstIndex:   first,
		LastIndex:    last,
		CommitIndex:  c.ln.commit.Load(),
		Bytes:        uint64(c.log.Stats().Bytes),
		LeaderCommit: c.ln.cfg.Inbox.leaderCommit.Load(),
		Leader:       c.ln.leader.Load(),
		Gaps:         c.ln.gaps(),
	}
	if st.LeaderCommit > last {
		st.Lag = st.LeaderCommit - last
	}
	st.Compaction = "off"
	if c.comp != nil {
		st.Compaction = "on"
		if why := c.comp.stoppedReason(); why != "" {
			st.Compaction = "stopped: " + why
		}
	}
	if cf, cl, n := c.log.CompactedRange(); n > 0 {
		ls := c.log.Stats()
		st.FirstIndex = cf
		st.CompactedFirst, st.CompactedLast, st.CompactedBatches = cf, cl, uint64(n)
		st.CompactedBytes, st.CompactedEntries, st.CompactedRecords = uint64(ls.BatchBytes), ls.BatchCommands, ls.BatchRecords
	}
	st.Truncations, st.TruncationPoint = c.truncations()
	return st
}

// truncations returns the voters' requests and the truncation point.
func (c *cluster) truncations() ([]Truncation, uint64) {
	c.trunc.Lock()
	defer c.trunc.Unlock()
	voters := c.ln.voters()
	var ts []Truncation
	for _, v := range voters {
		if idx, ok := c.trunc.requests[v]; ok {
			ts = append(ts, Truncation{MemberID: v, Index: idx})
		}
	}
	return ts, truncationPoint(c.trunc.requests, voters)
}

// Truncate records a voter's request to drop the entries <= req.Index
// (durably, before answering) and truncates the log up to the lowest index
// more than half of the voters asked for, once the logger holds it
// committed. A request lower than the member's earlier one changes
// nothing. Refused: an unknown cluster (NotFound), index 0
// (InvalidArgument), a member that is not a voter of the cluster
// (FailedPrecondition).
func (l *Logger) Truncate(ctx context.Context, req *TruncateRequest) (*TruncateResponse, error) {
	c := l.cluster(req.ClusterID)
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "logger serves no cluster %x", req.ClusterID)
	}
	if req.Index == 0 {
		return nil, status.Error(codes.InvalidArgument, "truncate: index 0")
	}
	voters := c.ln.voters()
	if !slices.Contains(voters, req.MemberID) {
		return nil, status.Errorf(codes.FailedPrecondition, "truncate: member %x is not a voter of cluster %x (its voters: %s)",
			req.MemberID, req.ClusterID, hexIDs(voters))
	}
	c.trunc.Lock()
	if req.Index > c.trunc.requests[req.MemberID] {
		next := maps.Clone(c.trunc.requests)
		next[req.MemberID] = req.Index
		if err := writeTruncations(l.fs, c.dir, next); err != nil {
			c.trunc.Unlock()
			return nil, status.Errorf(codes.Internal, "truncate: record the request of member %x: %v", req.MemberID, err)
		}
		c.trunc.requests = next
	}
	c.trunc.Unlock()
	ts, point := c.truncations()
	c.ln.requestTrim(point)
	return &TruncateResponse{TruncationPoint: point, Truncations: ts}, nil
}

func hexIDs(ids []uint64) string {
	var parts []string
	for _, id := range ids {
		parts = append(parts, fmt.Sprintf("%x", id))
	}
	return strings.Join(parts, " ")
}

// Recover streams the committed entries [req.First, req.Last] of a
// cluster, in index order, in batches of up to 1 MiB; where log compaction
// replaced the entries, the compacted batches standing for them (one per
// message; the last may stand for entries past req.Last), if the client
// accepts them (req.AcceptBatches). It refuses (InvalidArgument) First ==
// 0 or First > Last; (OutOfRange) a range starting below the first index
// held (in a gap, or before the logger joined) or ending past the commit
// index the logger holds; (FailedPrecondition) a compacted range, to a
// client that does not accept batches; (NotFound) an unknown cluster.
func (l *Logger) Recover(ctx context.Context, req *RecoverRequest, send func(*RecoverResponse) error) error {
	c := l.cluster(req.ClusterID)
	if c == nil {
		return status.Errorf(codes.NotFound, "logger serves no cluster %x", req.ClusterID)
	}
	if req.First == 0 || req.First > req.Last {
		return status.Errorf(codes.InvalidArgument, "recover [%d, %d]: want 0 < first <= last", req.First, req.Last)
	}
	if err := c.checkHeld(req.First, req.Last); err != nil {
		return err
	}
	for lo := req.First; lo <= req.Last; {
		if err := ctx.Err(); err != nil {
			return status.FromContextError(err).Err()
		}
		if first, _ := c.log.FirstIndex(); lo < first {
			// Compacted (or truncated, or in a gap, since checked).
			b, err := c.log.CompactedBatchAt(lo)
			if err != nil {
				return status.Errorf(codes.Internal, "read the compacted batch holding %d of cluster %x: %v", lo, req.ClusterID, err)
			}
			if b == nil {
				return c.checkHeld(lo, req.Last)
			}
			if !req.AcceptBatches {
				return status.Errorf(codes.FailedPrecondition,
					"recover [%d, %d] of cluster %x: log compaction replaced entries %d-%d with compacted batches (one record per key state), and this client takes only entries",
					req.First, req.Last, req.ClusterID, lo, b.LastIndex)
			}
			if err := send(&RecoverResponse{Batches: []*raftlog.CompactedBatch{b}}); err != nil {
				return err
			}
			lo = b.LastIndex + 1
			continue
		}
		ents, err := c.log.Entries(lo, req.Last+1, recoverBatchBytes)
		if errors.Is(err, raft.ErrCompacted) {
			// Log compaction moved the snapshot point meanwhile (the loop
			// reads the batch), or a snapshot restarted the log (refused).
			continue
		}
		if err != nil {
			return status.Errorf(codes.Internal, "read entries [%d, %d] of cluster %x: %v", lo, req.Last, req.ClusterID, err)
		}
		if len(ents) == 0 {
			return status.Errorf(codes.Internal, "read entries from %d of cluster %x: none", lo, req.ClusterID)
		}
		if err := send(&RecoverResponse{Entries: ents}); err != nil {
			return err
		}
		lo = ents[len(ents)-1].GetIndex() + 1
	}
	return nil
}

// checkHeld returns an OutOfRange error naming what is missing if the
// committed entries [first, last] are not all held.
func (c *cluster) checkHeld(first, last uint64) error {
	held, _ := c.log.FirstIndex()
	if cf, _, n := c.log.CompactedRange(); n > 0 {
		held = min(held, cf)
	}
	commit := c.ln.commit.Load()
	if first < held {
		msg := fmt.Sprintf("recover [%d, %d] of cluster %x: the logger holds entries from %d on", first, last, c.rec.ClusterID, held)
		gaps := c.ln.gaps()
		_, point := c.truncations()
		switch {
		case point >= held-1 && (len(gaps) == 0 || gaps[len(gaps)-1].SnapshotIndex < held-1):
			msg += fmt.Sprintf(": the entries up to %d were truncated at the request of a majority of the voters", held-1)
		case len(gaps) > 0:
			msg += ": " + gaps[len(gaps)-1].String()
		}
		return status.Error(codes.OutOfRange, msg)
	}
	if last > commit {
		return status.Errorf(codes.OutOfRange, "recover [%d, %d] of cluster %x: the logger holds committed entries up to %d",
			first, last, c.rec.ClusterID, commit)
	}
	return nil
}

func unixNano(n int64) time.Time { return time.Unix(0, n).UTC() }
