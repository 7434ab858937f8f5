package member

import (
	"context"
	"fmt"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/mvcc"
	"github.com/strata-kv/strata/server"
)

// AuthConfig is etcd's auth flags.
type AuthConfig struct {
	// Token is --auth-token: "simple" (default) or
	// "jwt,pub-key=PATH,priv-key=PATH,sign-method=RS256[,ttl=5m]".
	Token string
	// TokenTTL is --auth-token-ttl for simple tokens (0: 300 s).
	TokenTTL time.Duration
	// BcryptCost is --bcrypt-cost (0: bcrypt's default, 10).
	BcryptCost int
}

// startSecurity builds the auth store from the engine, hands it to the
// applier, and prepares the client gRPC server's options (TLS credentials,
// auth interceptors) and the Auth service. It runs before the applier.
func (m *Member) startSecurity(limits server.Limits) ([]grpc.ServerOption, error) {
	tokens, err := auth.ParseTokenOptions(m.cfg.Auth.Token, m.cfg.Auth.TokenTTL)
	if err != nil {
		return nil, err
	}
	if m.cfg.Auth.BcryptCost != 0 {
		if err := auth.ValidateBcryptCost(m.cfg.Auth.BcryptCost); err != nil {
			return nil, fmt.Errorf("--bcrypt-cost: %w", err)
		}
	}
	m.authStore = auth.New(auth.Options{
		BcryptCost: m.cfg.Auth.BcryptCost, Tokens: tokens, Logger: m.logger.Named("auth"),
	})
	if err := m.authStore.Load(m.engine); err != nil {
		return nil, err
	}
	m.applier.SetAuth(authApplier{m.authStore})
	opts, err := serverCreds("--listen-client-urls", m.cfg.ListenClientURLs, m.cfg.TLS.Client)
	if err != nil {
		return nil, err
	}
	m.authService = server.NewAuth(m, m.authStore, limits, m.cfg.TLS.Client.ClientCertAuth)
	return append(opts, m.authService.ServerOptions()...), nil
}

// requestHeader is the raft header of a proposal: its ID, and the caller
// and auth revision that the applier checks writes against.
func requestHeader(ctx context.Context, id uint64) *pb.RequestHeader {
	h := &pb.RequestHeader{ID: id}
	if ai := server.AuthInfoFromContext(ctx); ai != nil {
		h.Username, h.AuthRevision = ai.Username, ai.Revision
	}
	return h
}

// authApplier is apply.Auth over the auth store.
type authApplier struct{ s *auth.Store }

// Apply implements apply.Auth.
func (x authApplier) Apply(w *mvcc.WriteBatch, r *pb.InternalRaftRequest) (apply.Result, bool, error) {
	if h := r.Header; h != nil && h.Username != "" && x.s.Enabled() {
		// Auth management is decided again at apply time, as etcd's auth
		// applier does: the caller may have lost the root role since.
		if err := x.checkManagement(&auth.Info{Username: h.Username, Revision: h.AuthRevision}, r); err != nil {
			return apply.Result{Err: err}, true, nil
		}
	}
	resp, handled, refused, err := x.s.Apply(w.Batch(), r)
	if err != nil {
		return apply.Result{}, true, err
	}
	if handled {
		return apply.Result{Response: resp, Err: refused}, true, nil
	}
	h := r.Header
	if h == nil || h.Username == "" || !x.s.Enabled() {
		// Auth is off, or the request is the member's own (lease expiry,
		// auto-compaction, attributes), which etcd makes as root.
		return apply.Result{}, false, nil
	}
	refused, err = x.check(w, &auth.Info{Username: h.Username, Revision: h.AuthRevision}, r)
	if err != nil || refused != nil {
		return apply.Result{Err: refused}, true, err
	}
	return apply.Result{}, false, nil
}

// checkManagement permits an auth management request to the root role,
// and a user changing its own password.
func (x authApplier) checkManagement(info *auth.Info, r *pb.InternalRaftRequest) error {
	switch {
	case r.AuthUserChangePassword != nil && r.AuthUserChangePassword.Name == info.Username:
		return x.s.IsUserOrAdmin(info, info.Username)
	case r.AuthEnable != nil, r.AuthDisable != nil, r.AuthUserAdd != nil, r.AuthUserDelete != nil,
		r.AuthUserChangePassword != nil, r.AuthUserGrantRole != nil, r.AuthUserRevokeRole != nil,
		r.AuthRoleAdd != nil, r.AuthRoleDelete != nil, r.AuthRoleGrantPermission != nil,
		r.AuthRoleRevokePermission != nil:
		return x.s.IsAdminPermitted(info)
	}
	return nil
}

// check decides a user's write as etcd's auth applier does: refused is
// etcd's answer, err a failure to read the batch (fatal).
func (x authApplier) check(w *mvcc.WriteBatch, info *auth.Info, r *pb.InternalRaftRequest) (refused, err error) {
	switch {
	case r.Put != nil:
		if err := x.s.IsOpPermitted(info, &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: r.Put}}); err != nil {
			return err, nil
		}
		return x.leaseKeys(w, info, r.Put.Lease)
	case r.DeleteRange != nil:
		return x.s.IsOpPermitted(info, &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: r.DeleteRange}}), nil
	case r.Txn != nil:
		return x.s.IsTxnPermitted(info, r.Txn), nil
	case r.Compaction != nil:
		return x.s.IsAdminPermitted(info), nil
	case r.LeaseRevoke != nil:
		return x.leaseKeys(w, info, r.LeaseRevoke.ID)
	}
	return nil, nil
}

// leaseKeys checks write access to every key attached to a lease: putting
// with a lease, or revoking it, may delete them all.
func (x authApplier) leaseKeys(w *mvcc.WriteBatch, info *auth.Info, id int64) (refused, err error) {
	if id == 0 {
		return nil, nil
	}
	keys, err := w.LeaseKeys(id)
	if err != nil {
		return nil, fmt.Errorf("keys of lease %x: %w", id, err)
	}
	for _, k := range keys {
		if err := x.s.IsPutPermitted(info, k); err != nil {
			return err, nil
		}
	}
	return nil, nil
}
