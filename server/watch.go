package server

import (
	"context"
	"errors"
	"io"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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
func (s *Watch) Watch(stream pb.Watch_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	ws := s.hub.NewStream()
	defer ws.Close()
	recvErr := make(chan error, 1)
	go func() { recvErr <- s.recvLoop(ctx, stream, ws) }()
	for {
		resp, err := ws.Next(ctx)
		if err != nil {
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

// send fills the header and sends resp, split into fragments if its
// watcher asked for them and it is larger than the request size limit
// (etcd's rule: never fewer than one event per fragment).
func (s *Watch) send(stream pb.Watch_WatchServer, r watch.Response) error {
	resp := r.WatchResponse
	fillHeader(s.b, &resp.Header, s.b.Store().Rev())
	limit := s.limits.MaxRequestBytes
	if !r.Fragment || limit <= 0 || len(resp.Events) < 2 || proto.Size(resp) < limit {
		return stream.Send(resp)
	}
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
		if err := stream.Send(part); err != nil {
			return err
		}
	}
	return nil
}
