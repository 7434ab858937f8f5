// Package discovery bootstraps a new cluster through etcd's v3 discovery
// (--discovery-token, --discovery-endpoints): instead of being told every
// member's peer URLs (--initial-cluster), each member registers itself in
// another etcd cluster, the discovery service, and waits there until the
// cluster's size have registered.
//
// # The registry
//
// The operator picks a token, unique to the new cluster, and writes its
// size in the discovery service (the wire format is etcd's, so strata and
// etcd members may share a token):
//
//	/_etcd/registry/<token>/_config/size          "3"  (written by the operator)
//	/_etcd/registry/<token>/members/<member id>   "m1=http://10.0.0.1:2380"  (one per member)
//
// The member ID is computed as for --initial-cluster, from the member's
// peer URLs with the discovery token as the cluster token
// (datadir.MemberID), and printed in unpadded lower-case hex. The value is
// the member's own --initial-cluster entries ("name=url" for each peer URL,
// sorted, comma-separated).
//
// # Joining
//
// Join follows etcd's steps:
//
//  1. Read the size and the registrations. A missing size key
//     (ErrSizeNotFound) or a bad one (ErrBadSizeKey) fails at once; a
//     service that does not answer is retried after 2, 4, 8, ... 256 s, 256 s
//     from then on (etcd's backoff; only the context ends it).
//  2. If size members other than this one registered first (by create
//     revision), fail with ErrFullCluster: the token was already used.
//  3. Register (put the member key), then read again and check again.
//  4. Watch the members prefix until size members have registered.
//  5. Return the --initial-cluster string of the first size registrations
//     in create-revision order; later ones are ignored, so members that
//     raced past the size still agree on one cluster.
//
// A member already registered (restarted on an empty data directory, with
// the same name and peer URLs and so the same ID) passes step 2 and gets
// the same cluster again.
//
// Concurrency: Join is safe to call from any goroutine; it blocks until the
// cluster is complete, an error, or ctx ends.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/datadir"
)

// Config is how to reach the discovery service and which token to use:
// etcd's --discovery-* flags.
type Config struct {
	// Token is --discovery-token; also the cluster token member IDs are
	// derived from.
	Token string
	// Endpoints are the discovery service's client URLs
	// (--discovery-endpoints).
	Endpoints []string
	// DialTimeout, RequestTimeout, KeepAliveTime and KeepAliveTimeout are
	// --discovery-dial-timeout (2s), --discovery-request-timeout (5s, each
	// read and write), --discovery-keepalive-time (2s) and
	// --discovery-keepalive-timeout (6s).
	DialTimeout, RequestTimeout     time.Duration
	KeepAliveTime, KeepAliveTimeout time.Duration
	// CertFile, KeyFile and CAFile are --discovery-cert, --discovery-key
	// and --discovery-cacert; ServerName is discovery-config's
	// client.secure.server-name (no flag).
	CertFile, KeyFile, CAFile, ServerName string
	// InsecureTransport is --discovery-insecure-transport (true: plain
	// connections unless a certificate or CA is given); InsecureSkipVerify
	// is --discovery-insecure-skip-tls-verify.
	InsecureTransport, InsecureSkipVerify bool
	// User and Password are --discovery-user and --discovery-password;
	// AuthToken is discovery-config's client.auth.token (no flag).
	User, Password, AuthToken string
	// Logger reports progress; nil discards it.
	Logger *zap.Logger

	// backoff is the wait before retry n (from 1); nil is etcd's. Tests
	// shorten it.
	backoff func(n int) time.Duration
}

// etcdBackoff is etcd's wait before retry n: 2^n seconds, at most 2^8.
func etcdBackoff(n int) time.Duration {
	return time.Duration(1<<min(n, 8)) * time.Second
}

// Join registers the member name with peerURLs under cfg.Token and waits
// until the cluster's size have registered; it returns the cluster as an
// --initial-cluster string. Its errors read as etcd's ("failed to join
// discovery cluster (discovery: cluster is full)") and wrap the package's
// sentinel errors.
func Join(ctx context.Context, cfg Config, name string, peerURLs []string) (string, error) {
	s, err := join(ctx, cfg, name, peerURLs)
	if err != nil {
		return "", fmt.Errorf("failed to join discovery cluster (%w)", err)
	}
	return s, nil
}

func join(ctx context.Context, cfg Config, name string, peerURLs []string) (string, error) {
	if cfg.Token == "" || len(cfg.Endpoints) == 0 {
		return "", errors.New("both --discovery-token and --discovery-endpoints must be set")
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.backoff == nil {
		cfg.backoff = etcdBackoff
	}
	lg := cfg.Logger.With(zap.String("discovery-token", cfg.Token), zap.String("discovery-endpoints", strings.Join(cfg.Endpoints, ",")))
	cli, err := newClient(cfg, lg)
	if err != nil {
		return "", err
	}
	defer cli.Close()
	id := datadir.MemberID(peerURLs, cfg.Token)
	s := &session{cfg: cfg, lg: lg, cli: cli, self: MemberKey(cfg.Token, id)}

	if _, _, _, err := s.check(ctx); err != nil {
		return "", err
	}
	value := RegistrationValue(name, peerURLs)
	if err := s.retry(ctx, "register member itself", func(ctx context.Context) error {
		_, err := cli.Put(ctx, s.self, value)
		return err
	}); err != nil {
		return "", err
	}
	lg.Info("registered member itself", zap.String("memberKey", s.self), zap.String("memberInfo", value))
	for {
		reg, size, rev, err := s.check(ctx)
		if err != nil {
			return "", err
		}
		if s.wait(ctx, reg, size, rev) {
			cluster, err := reg.initialCluster(size)
			if err == nil {
				lg.Info("discovery got the cluster", zap.String("initial-cluster", cluster))
			}
			return cluster, err
		}
		// The watch ended early (the service restarted, or compacted
		// past rev): read the registry again.
		if err := ctx.Err(); err != nil {
			return "", err
		}
	}
}

// newClient dials the discovery service as etcd does (clientv3's
// NewClientConfig from the same ConfigSpec), so that the TLS and auth
// flags mean what they mean to etcd.
func newClient(cfg Config, lg *zap.Logger) (*clientv3.Client, error) {
	spec := &clientv3.ConfigSpec{
		Endpoints:        cfg.Endpoints,
		DialTimeout:      cfg.DialTimeout,
		RequestTimeout:   cfg.RequestTimeout,
		KeepAliveTime:    cfg.KeepAliveTime,
		KeepAliveTimeout: cfg.KeepAliveTimeout,
		Secure: &clientv3.SecureConfig{
			Cert: cfg.CertFile, Key: cfg.KeyFile, Cacert: cfg.CAFile, ServerName: cfg.ServerName,
			InsecureTransport: cfg.InsecureTransport, InsecureSkipVerify: cfg.InsecureSkipVerify,
		},
		Auth: &clientv3.AuthConfig{Username: cfg.User, Password: cfg.Password, Token: cfg.AuthToken},
	}
	ccfg, err := clientv3.NewClientConfig(spec, lg)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	ccfg.Logger = lg.Named("client")
	cli, err := clientv3.New(*ccfg)
	if err != nil {
		return nil, fmt.Errorf("discovery client for %v: %w", cfg.Endpoints, err)
	}
	return cli, nil
}

// session is one Join's connection and identity.
type session struct {
	cfg  Config
	lg   *zap.Logger
	cli  *clientv3.Client
	self string // this member's key
}

// retry runs op, each attempt bounded by the request timeout, until it
// succeeds or ctx ends, waiting etcd's backoff between attempts.
func (s *session) retry(ctx context.Context, step string, op func(context.Context) error) error {
	for n := 1; ; n++ {
		rctx, cancel := s.requestContext(ctx)
		err := op(rctx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last error: %v)", step, ctx.Err(), err)
		}
		wait := s.cfg.backoff(n)
		s.lg.Warn("retry connecting to discovery service", zap.String("reason", step), zap.Duration("backoff", wait), zap.Error(err))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last error: %v)", step, ctx.Err(), err)
		}
	}
}

func (s *session) requestContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.cfg.RequestTimeout > 0 {
		return context.WithTimeout(ctx, s.cfg.RequestTimeout)
	}
	return context.WithCancel(ctx)
}

// check reads the size and the registrations (step 1) and refuses a full
// cluster (step 2). rev is the revision the registrations were read at.
func (s *session) check(ctx context.Context) (reg *registry, size int, rev int64, err error) {
	var sizeResp, membersResp *clientv3.GetResponse
	err = s.retry(ctx, "cluster status check", func(ctx context.Context) error {
		var err error
		if sizeResp, err = s.cli.Get(ctx, SizeKey(s.cfg.Token)); err != nil {
			return err
		}
		membersResp, err = s.cli.Get(ctx, MembersPrefix(s.cfg.Token), clientv3.WithPrefix())
		return err
	})
	if err != nil {
		return nil, 0, 0, err
	}
	if len(sizeResp.Kvs) == 0 {
		return nil, 0, 0, ErrSizeNotFound
	}
	if size, err = parseSize(sizeResp.Kvs[0].Value); err != nil {
		return nil, 0, 0, err
	}
	reg = &registry{token: s.cfg.Token}
	for _, kv := range membersResp.Kvs {
		s.add(reg, string(kv.Key), string(kv.Value), kv.CreateRevision)
	}
	if reg.full(s.self, size) {
		return nil, 0, 0, ErrFullCluster
	}
	return reg, size, membersResp.Header.Revision, nil
}

// add records a registration, logging one it ignores as etcd does.
func (s *session) add(reg *registry, key, value string, createRev int64) {
	if err := reg.add(key, value, createRev); err != nil {
		s.lg.Warn("ignoring a registration", zap.String("memberKey", key), zap.String("memberInfo", value), zap.Error(err))
		return
	}
	s.lg.Info("found peer from discovery service", zap.String("memberKey", key), zap.String("memberInfo", value))
}

// wait watches the registrations after rev until size have registered
// (step 4); false if the watch ended first.
func (s *session) wait(ctx context.Context, reg *registry, size int, rev int64) bool {
	if len(reg.regs) >= size {
		return true
	}
	s.lg.Info("waiting for peers from discovery service", zap.Int("clusterSize", size), zap.Int("found-peers", len(reg.regs)))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for resp := range s.cli.Watch(wctx, MembersPrefix(s.cfg.Token), clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			s.lg.Warn("discovery watch failed", zap.Error(err))
			return false
		}
		for _, ev := range resp.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			s.add(reg, string(ev.Kv.Key), string(ev.Kv.Value), ev.Kv.CreateRevision)
		}
		if len(reg.regs) >= size {
			s.lg.Info("found all needed peers from discovery service", zap.Int("clusterSize", size))
			return true
		}
	}
	return false
}
