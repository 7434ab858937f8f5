package concurrency

import (
	"context"
	"errors"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/strata-kv/strata/server/concurrency/v3lockpb"
)

// ErrSessionExpired answers a Lock whose key vanished while it waited:
// its lease ended. The text is etcd's.
var ErrSessionExpired = errors.New("mutex: session is expired")

// Lock implements etcd's v3lock service (see the package comment for the
// recipe).
type Lock struct {
	v3lockpb.UnimplementedLockServer
	r recipe
}

// NewLock returns the Lock service over b.
func NewLock(b Backend) *Lock { return &Lock{r: newRecipe(b)} }

// Lock waits until the caller holds the lock named req.Name and returns
// its key. A second Lock with the same lease returns the same key.
func (s *Lock) Lock(ctx context.Context, req *v3lockpb.LockRequest) (*v3lockpb.LockResponse, error) {
	resp, err := s.lock(ctx, req)
	return resp, asEtcd(err)
}

func (s *Lock) lock(ctx context.Context, req *v3lockpb.LockRequest) (*v3lockpb.LockResponse, error) {
	lease, err := s.r.session(ctx, req.Lease)
	if err != nil {
		return nil, err
	}
	pfx := string(req.Name) + "/"
	key := ownKey(pfx, lease)
	resp, myRev, err := s.r.acquire(ctx, pfx, key, "", lease)
	if err != nil {
		return nil, err
	}
	if o := owner(resp); o == nil || o.CreateRevision == myRev {
		return &v3lockpb.LockResponse{Header: resp.Header, Key: []byte(key)}, nil
	}
	if _, err := s.r.waitDeletes(ctx, pfx, myRev-1); err != nil {
		s.release(ctx, key)
		return nil, err
	}
	// Every older key is gone, but so may be ours, if its lease ended
	// while we waited.
	g, err := s.r.b.KV.Range(ctx, &pb.RangeRequest{Key: []byte(key)})
	if err != nil {
		s.release(ctx, key)
		return nil, err
	}
	if len(g.Kvs) == 0 {
		return nil, ErrSessionExpired
	}
	return &v3lockpb.LockResponse{Header: g.Header, Key: []byte(key)}, nil
}

// release deletes the key of a Lock that failed while it waited.
func (s *Lock) release(ctx context.Context, key string) {
	s.r.cleanup(ctx, "lock", key, func(ctx context.Context) error {
		_, err := s.r.b.KV.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: []byte(key)})
		return err
	})
}

// Unlock deletes a key returned by Lock; the next waiter then holds the
// lock. Deleting a key that is already gone succeeds, as in etcd.
func (s *Lock) Unlock(ctx context.Context, req *v3lockpb.UnlockRequest) (*v3lockpb.UnlockResponse, error) {
	resp, err := s.r.b.KV.DeleteRange(ctx, &pb.DeleteRangeRequest{Key: req.Key})
	if err != nil {
		return nil, asEtcd(err)
	}
	return &v3lockpb.UnlockResponse{Header: resp.Header}, nil
}
