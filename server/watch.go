package server

import (
	"context"
	"errors"
	"io"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/watch"
)

// Watch implements etcd's Watch service on a watch.Hub. It translates the
// wire conventions (empty key, "\x00" range end, filters) into watch
// requests, and each queued response into one or, with fragment, several
// messages; the hub does the rest.
//
// Concurrency: each Watch call runs a receive goroutine (create, cancel,
// progress) beside the handler goroutine, which sends.
type Watch struct {
	pb.UnimplementedWatchServer
	b      Backend
	hub    *watch.Hub
	limits Limits
}

// NewWatch returns the Watch service over hub; b fills response headers,
// limits.MaxRequestBytes is the size above which a response of a watcher
// created with fragment is split, as etcd splits it.
func NewWatch(b Backend, hub *watch.Hub, limits Limits) *Watch {
	return &Watch{b: b, hub: hub, limits: limits}
}

// Watch serves one watch stream until the client or the member ends it.
//
// A client that asks for a leader (clientv3.WithRequireLeader, as
// Kubernetes does) is refused when the member knows none, and its stream
// ends with etcd's "no leader" error once the member has had none for
// noLeaderChecks checks in a row, as etcd's monitorLeader ends it; the
// client then moves to another member.
func (s *Watch) Watch(stream pb.Watch_WatchServer) error {
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	if requiresLeader(ctx) {
		if s.b.Leader() == 0 {
			return rpctypes.ErrGRPCNoLeader
		}
		go s.monitorLeader(ctx, cancel)
	}
	ws := s.hub.NewStream()
	defer ws.Close()
	recvErr := make(chan error, 1)
	go func() { recvErr <- s.recvLoop(ctx, stream, ws) }()
	for {
		resp, err := ws.Next(ctx)
		if err != nil {
			if errors.Is(context.Cause(ctx), errLostLeader) {
				return rpctypes.ErrGRPCNoLeader
			}
			select {
			case rerr := <-recvErr:
				if rerr != nil {
					return rerr
				}
			default:
			}
			if errors.Is(err, watch.ErrClosed) {
				return errStopping
			}
			return toGRPCError(err)
		}
		if err := s.send(stream, resp); err != nil {
			return err
		}
	}
}

// Leader monitoring of streams that require a leader.
const (
	noLeaderInterval = time.Second
	noLeaderChecks   = 3
)

var errLostLeader = errors.New("watch: member lost its leader")

// requiresLeader reports whether the client sent etcd's require-leader
// metadata.
func requiresLeader(ctx context.Context) bool {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return false
	}
	v := md.Get(rpctypes.MetadataRequireLeaderKey)
	return len(v) > 0 && v[0] == rpctypes.MetadataHasLeader
}

// monitorLeader cancels ctx with errLostLeader once the member has had no
// leader for noLeaderChecks checks in a row.
func (s *Watch) monitorLeader(ctx context.Context, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(noLeaderInterval)
	defer tick.Stop()
	missed := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if s.b.Leader() != 0 {
			missed = 0
			continue
		}
		if missed++; missed >= noLeaderChecks {
			cancel(errLostLeader)
			return
		}
	}
}

// errStopping ends streams when the member stops; clients reconnect and
// resume from the revision they reached.
var errStopping = rpctypes.ErrGRPCStopped

// recvLoop reads requests until the client closes its side (then the
// stream goes on sending, as in etcd) or fails (then the stream ends).
func (s *Watch) recvLoop(ctx context.Context, stream pb.Watch_WatchServer, ws *watch.Stream) error {
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		// A client that sends requests but reads no answers is held here.
		if err := ws.WaitRoom(ctx); err != nil {
			return nil
		}
		switch {
		case req.GetCreateRequest() != nil:
			ws.Watch(createRequest(req.GetCreateRequest()))
		case req.GetCancelRequest() != nil:
			ws.Cancel(req.GetCancelRequest().GetWatchId())
		case req.GetProgressRequest() != nil:
			ws.RequestProgress()
		}
		// Other requests (an empty union) are ignored, as etcd ignores them.
	}
}

// createRequest applies etcd's conventions: an empty key is "\x00" (the
// smallest key), an empty range_end means the key alone, and "\x00" means
// every key from key on.
func createRequest(c *pb.WatchCreateRequest) watch.Request {
	r := watch.Request{
		Key: c.GetKey(), End: c.GetRangeEnd(), StartRev: c.GetStartRevision(), WatchID: c.GetWatchId(),
		PrevKV: c.GetPrevKv(), ProgressNotify: c.GetProgressNotify(), Fragment: c.GetFragment(),
	}
	if len(r.Key) == 0 {
		r.Key = []byte{0}
	}
	switch {
	case len(r.End) == 0:
		r.End = nil
	case len(r.End) == 1 && r.End[0] == 0:
		r.End = []byte{}
	}
	for _, f := range c.GetFilters() {
		switch f {
		case pb.WatchCreateRequest_NOPUT:
			r.NoPut = true
		case pb.WatchCreateRequest_NODELETE:
			r.NoDelete = true
		}
	}
	return r
}

// send fills the header and sends the response, in fragments if its
// watcher asked for them.
func (s *Watch) send(stream pb.Watch_WatchServer, r watch.Response) error {
	rev := s.b.Store().Rev()
	if r.CompactRevision != 0 {
		rev = 0 // etcd's compacted answer carries header revision 0
	}
	fillHeader(s.b, &r.Header, rev)
	limit := 0
	if r.Fragment {
		limit = s.limits.MaxRequestBytes
	}
	for _, part := range fragments(r.WatchResponse, limit) {
		if err := stream.Send(part); err != nil {
			return err
		}
	}
	return nil
}

// fragments splits resp as etcd does when its encoding reaches limit
// (0: never): each part carries as many events as fit under the limit but
// at least one, all parts but the last are marked fragment, and each
// carries the header and watch ID.
func fragments(resp *pb.WatchResponse, limit int) []*pb.WatchResponse {
	if limit <= 0 || len(resp.Events) < 2 || proto.Size(resp) < limit {
		return []*pb.WatchResponse{resp}
	}
	var parts []*pb.WatchResponse
	evs := resp.Events
	for len(evs) > 0 {
		part := &pb.WatchResponse{Header: resp.Header, WatchId: resp.WatchId, Fragment: true}
		n := 0
		for n < len(evs) {
			part.Events = evs[:n+1]
			if n > 0 && proto.Size(part) >= limit {
				break
			}
			n++
		}
		part.Events = evs[:n]
		evs = evs[n:]
		part.Fragment = len(evs) > 0
		parts = append(parts, part)
	}
	return parts
}
