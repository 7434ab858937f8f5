package logger

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/strata-kv/strata/transport"
)

// ErrNotAdded means the cluster has no learner with the logger's peer
// URLs: the operator adds it first (etcdctl member add NAME --learner
// --peer-urls=...).
var ErrNotAdded = errors.New("logger: the cluster has no learner with the logger's peer URLs")

// ErrWrongCluster means the endpoints answer for another cluster than the
// one the operator named.
var ErrWrongCluster = errors.New("logger join: wrong cluster")

// JoinConfig is what Join needs.
type JoinConfig struct {
	// DataDir is the logger's data directory.
	DataDir string
	// Name is the name the operator gave the logger in the cluster
	// (recorded; the logger is found by its peer URLs).
	Name string
	// Endpoints are client URLs of the cluster's members, tried in turn.
	Endpoints []string
	// AdvertisePeerURLs are the logger's advertised peer URLs, as given to
	// etcdctl member add --peer-urls.
	AdvertisePeerURLs []string
	// ClusterID, if not 0, is the cluster the operator means to join: Join
	// refuses endpoints that answer for another.
	ClusterID uint64
	// Timeout bounds the question to each endpoint. 0: 5 s.
	Timeout time.Duration
	// TLS dials https endpoints (the CA, a client certificate: etcdctl's
	// --cacert, --cert, --key). nil: the system's CAs, no certificate.
	TLS *tls.Config
	// FS is the file system. nil: vfs.Default.
	FS vfs.FS
}

// Join records a cluster in the logger's data directory: it asks a member
// for the member list and the cluster ID through etcd's Cluster API, finds
// the learner with the logger's peer URLs, and writes the cluster's
// directory whole (docs/logger.md, "Joining a cluster"). A running logger
// serves it within its ScanInterval; one started later at start. Join takes
// no lock: it only adds a directory, atomically.
func Join(ctx context.Context, cfg JoinConfig) (*ClusterRecord, error) {
	if cfg.FS == nil {
		cfg.FS = vfs.Default
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.DataDir == "" || len(cfg.Endpoints) == 0 || len(cfg.AdvertisePeerURLs) == 0 {
		return nil, errors.New("logger join: the data directory, the cluster's endpoints and the logger's peer URLs are required")
	}
	var resp *pb.MemberListResponse
	var errs []error
	for _, ep := range cfg.Endpoints {
		r, err := memberList(ctx, ep, cfg.Timeout, cfg.TLS)
		if err == nil {
			resp = r
			break
		}
		errs = append(errs, fmt.Errorf("%s: %w", ep, err))
	}
	if resp == nil {
		return nil, fmt.Errorf("logger join: ask the cluster for its members: %w", errors.Join(errs...))
	}
	rec, err := recordFor(resp, cfg)
	if err != nil {
		return nil, err
	}
	if err := addCluster(cfg.FS, cfg.DataDir, rec); err != nil {
		return nil, fmt.Errorf("logger join: %w", err)
	}
	return rec, nil
}

// recordFor builds the cluster record from a member list: the logger is
// the member whose peer URLs are cfg.AdvertisePeerURLs, and it must be a
// learner.
func recordFor(resp *pb.MemberListResponse, cfg JoinConfig) (*ClusterRecord, error) {
	cid := resp.GetHeader().GetClusterId()
	if cid == 0 {
		return nil, errors.New("logger join: the member list names no cluster ID")
	}
	if cfg.ClusterID != 0 && cfg.ClusterID != cid {
		return nil, fmt.Errorf("%w: the endpoints answer for cluster %x, not %x", ErrWrongCluster, cid, cfg.ClusterID)
	}
	rec := &ClusterRecord{ClusterID: cid, Name: cfg.Name, PeerURLs: slices.Clone(cfg.AdvertisePeerURLs), Peers: map[uint64][]string{}, Joined: time.Now().UTC()}
	var known []string
	for _, m := range resp.Members {
		if sameURLs(m.PeerURLs, cfg.AdvertisePeerURLs) {
			if !m.IsLearner {
				return nil, fmt.Errorf("logger join: member %x of cluster %x has the logger's peer URLs %v but is a voter: a logger must be added as a learner",
					m.ID, cid, m.PeerURLs)
			}
			rec.MemberID = m.ID
			continue
		}
		known = append(known, fmt.Sprintf("%x=%s", m.ID, strings.Join(m.PeerURLs, ",")))
		rec.Peers[m.ID] = slices.Clone(m.PeerURLs)
		if !m.IsLearner {
			rec.Voters = append(rec.Voters, m.ID)
		}
	}
	slices.Sort(rec.Voters)
	if rec.MemberID == 0 {
		return nil, fmt.Errorf("%w %v in cluster %x (its members: %s); add it first with etcdctl member add %s --learner --peer-urls=%s",
			ErrNotAdded, cfg.AdvertisePeerURLs, cid, strings.Join(known, " "), cmp.Or(cfg.Name, "NAME"), strings.Join(cfg.AdvertisePeerURLs, ","))
	}
	return rec, nil
}

func memberList(ctx context.Context, endpoint string, timeout time.Duration, tlsCfg *tls.Config) (*pb.MemberListResponse, error) {
	addr, err := transport.HostPort(endpoint)
	if err != nil {
		return nil, err
	}
	creds := insecure.NewCredentials()
	if strings.HasPrefix(endpoint, "https://") {
		if tlsCfg == nil {
			tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		creds = credentials.NewTLS(tlsCfg.Clone())
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return pb.NewClusterClient(conn).MemberList(ctx, &pb.MemberListRequest{Linearizable: true})
}
