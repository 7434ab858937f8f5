package membership

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/strata-kv/strata/datadir"
	"github.com/strata-kv/strata/membership/memberlist"
	"github.com/strata-kv/strata/tlsconfig"
	"github.com/strata-kv/strata/transport"
)

// What a member learns from its peers rather than from its own log: the
// cluster it is to join, and whether the cluster has removed it. Both ask
// the read-only Cluster service that every member serves on its peer URLs.

// memberListTimeout bounds one question to one peer.
const memberListTimeout = 3 * time.Second

// fetchMembers asks the member at peer URL u for the member list.
func fetchMembers(u string, tls tlsconfig.Info, logger *zap.Logger) (*pb.MemberListResponse, error) {
	addr, err := transport.HostPort(u)
	if err != nil {
		return nil, err
	}
	return memberList(addr, tls.DialCreds(u, logger))
}

func memberList(addr string, creds credentials.TransportCredentials) (*pb.MemberListResponse, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), memberListTimeout)
	defer cancel()
	return pb.NewClusterClient(conn).MemberList(ctx, &pb.MemberListRequest{})
}

// JoinConfig is what Discover needs: etcd's flags of a member started with
// --initial-cluster-state=existing.
type JoinConfig struct {
	// Name is this member's --name; InitialCluster its --initial-cluster,
	// name to peer URLs.
	Name           string
	InitialCluster map[string][]string
	// AdvertisePeerURLs find this member in the cluster's list.
	AdvertisePeerURLs []string
	// PeerTLS dials the peers.
	PeerTLS tlsconfig.Info
	Logger  *zap.Logger
}

// LoadIdentity reads the identity of the data directory dir, or creates and
// records it: on restart the data directory wins, as in etcd, and it must
// name engineName (datadir.LoadOrCreateID refuses another engine). A member
// of a new cluster derives its identity from --initial-cluster and token;
// one joining an existing cluster (state "existing") asks its peers
// (Discover), and members is then the cluster as it found it, nil
// otherwise.
func LoadIdentity(fs vfs.FS, dir, engineName, state, token string, join JoinConfig) (id datadir.ID, members []*pb.Member, err error) {
	id, err = datadir.LoadOrCreateID(fs, dir, engineName, func() (datadir.ID, error) {
		if state == "existing" {
			var id datadir.ID
			id, members, err = Discover(join)
			return id, err
		}
		return datadir.BootstrapID(join.Name, join.InitialCluster, token)
	})
	if err != nil {
		return datadir.ID{}, nil, err
	}
	return id, members, nil
}

// Discover asks the peers named in --initial-cluster for the cluster this
// member was added to, and finds this member in it by its peer URLs, as
// etcd does for --initial-cluster-state=existing. It returns the identity
// to record and the cluster's members, the peers this member can answer
// until the leader's log or snapshot arrives.
func Discover(cfg JoinConfig) (datadir.ID, []*pb.Member, error) {
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	var lastErr error
	for name, urls := range cfg.InitialCluster {
		if name == cfg.Name {
			continue
		}
		for _, u := range urls {
			resp, err := fetchMembers(u, cfg.PeerTLS, cfg.Logger)
			if err != nil {
				lastErr = err
				continue
			}
			for _, mem := range resp.Members {
				if memberlist.URLsTaken([]*pb.Member{mem}, cfg.AdvertisePeerURLs, 0) {
					id := datadir.ID{Name: cfg.Name, MemberID: mem.ID, ClusterID: resp.Header.GetClusterId(), Joined: true}
					return id, resp.Members, nil
				}
			}
			return datadir.ID{}, nil, fmt.Errorf("no member with peer URLs %v in the cluster of %s: add it first (etcdctl member add)", cfg.AdvertisePeerURLs, u)
		}
	}
	if lastErr == nil {
		lastErr = errors.New("--initial-cluster names no other member")
	}
	return datadir.ID{}, nil, fmt.Errorf("cannot reach the cluster to join: %w", lastErr)
}

// Peers asks this member's peers for the member list: how a member learns
// of its own removal, which it may never apply itself (the leader stops
// replicating to a member once its removal commits).
type Peers struct {
	// MemberID and ClusterID are this member's; answers from another
	// cluster's members are ignored.
	MemberID, ClusterID uint64
	// Members is this member's view, whose other members are asked.
	Members Members
	TLS     tlsconfig.Info
	Logger  *zap.Logger
}

// List asks the other members, in turn, for the member list, and returns
// the first answer from a member of this cluster that lists itself. A
// member that does not (one just added, before the leader's snapshot or
// entries reach it, answers an empty list) has not applied its own
// addition, so its list says nothing about anyone's removal: taken at its
// word, it made the only voter of a cluster of one stop as removed when
// the member it had just added was slow to catch up (the voter, its
// quorum of two not active, had no leader meanwhile).
func (p *Peers) List() ([]*pb.Member, bool) {
	for _, mem := range p.Members.Members() {
		if mem.ID == p.MemberID || len(mem.PeerURLs) == 0 {
			continue
		}
		resp, err := fetchMembers(mem.PeerURLs[0], p.TLS, p.Logger)
		if err != nil || resp.Header.GetClusterId() != p.ClusterID || memberlist.Find(resp.Members, resp.Header.GetMemberId()) == nil {
			continue
		}
		return resp.Members, true
	}
	return nil, false
}

// listWithout returns a believable peer's member list (List) if it lacks
// this member.
func (p *Peers) listWithout() ([]*pb.Member, bool) {
	members, ok := p.List()
	return members, ok && memberlist.Find(members, p.MemberID) == nil
}

// AwaitRemoval polls the peers' member lists until one of this cluster's
// members answers without this member, and then delivers that list. It
// gives up when ctx ends.
func (p *Peers) AwaitRemoval(ctx context.Context) <-chan []*pb.Member {
	out := make(chan []*pb.Member, 1)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			if members, ok := p.listWithout(); ok {
				out <- members
				return
			}
		}
	}()
	return out
}
