package server

import (
	"context"
	"errors"
	"strings"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/strata-kv/strata/auth"
)

// Auth implements etcd's Auth service and the interceptors that establish
// who calls (a token in the "token" metadata, as clientv3 sends it, or with
// ClientCertAuth the verified client certificate's common name) and check
// permissions before any handler runs. Keeping every permission check in
// the interceptors leaves the KV, Lease, Watch, Cluster and Maintenance
// handlers unaware of auth; writes are checked once more when applied
// (apply.Auth), against the auth revision their raft header carries.
//
// Concurrency: handlers and interceptors run on many goroutines at once.
type Auth struct {
	pb.UnimplementedAuthServer
	kv             *KV
	b              Backend
	s              *auth.Store
	leases         LeaseLister
	clientCertAuth bool
}

// LeaseLister lists the leases a member knows (lease.Lessor), for the
// permission check of LeaseLeases.
type LeaseLister interface {
	Leases() []int64
}

// NewAuth returns the Auth service over b and the auth store s; leases
// lists the leases (nil: none). clientCertAuth is etcd's
// --client-cert-auth: a caller without a token is the user its certificate
// names.
func NewAuth(b Backend, s *auth.Store, limits Limits, clientCertAuth bool, leases LeaseLister) *Auth {
	return &Auth{kv: NewKV(b, limits), b: b, s: s, leases: leases, clientCertAuth: clientCertAuth}
}

// ServerOptions returns the interceptors to install on the client gRPC
// server.
func (a *Auth) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(a.unary),
		grpc.ChainStreamInterceptor(a.stream),
	}
}

// callerInfo finds who makes the call: the "token" metadata (or
// "authorization", from the JSON gateway), else the client certificate. A
// token that is not valid is an error even if a certificate would do, as
// in etcd.
func (a *Auth) callerInfo(ctx context.Context) (*auth.Info, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		ts := md.Get(rpctypes.TokenFieldNameGRPC)
		if len(ts) == 0 {
			// The JSON gateway forwards the HTTP Authorization header.
			ts = md.Get(rpctypes.TokenFieldNameSwagger)
		}
		if len(ts) > 0 && ts[0] != "" {
			// etcd takes the token with or without "Bearer " before it.
			token := strings.TrimPrefix(ts[0], "Bearer ")
			info, err := a.s.TokenInfo(token)
			if errors.Is(err, auth.ErrInvalidAuthToken) {
				// A simple token issued at an index this member has not
				// applied yet (the client logged in through a member
				// ahead of it): wait for what is committed, as etcd waits
				// for the token's index, and look again.
				if index, ok := auth.SimpleTokenIndex(token); ok && index > a.b.Store().AppliedIndex() {
					if berr := a.kv.barrier(ctx); berr == nil {
						info, err = a.s.TokenInfo(token)
					}
				}
			}
			if err != nil {
				return nil, err
			}
			return &info, nil
		}
	}
	if !a.clientCertAuth {
		return nil, nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return nil, nil
	}
	cn := ti.State.VerifiedChains[0][0].Subject.CommonName
	if cn == "" {
		return nil, nil
	}
	info := a.s.CertInfo(cn)
	return &info, nil
}

func (a *Auth) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !a.s.Enabled() || info.FullMethod == "/etcdserverpb.Auth/Authenticate" {
		return handler(ctx, req)
	}
	ai, err := a.callerInfo(ctx)
	if err != nil {
		return nil, authError(err)
	}
	ctx = auth.NewContext(ctx, ai)
	if linearizableRead(req) {
		// The check reads the auth state: first let it reflect every
		// change committed before the read (etcd checks a linearizable
		// read after its read index, too). The KV handler skips its own
		// barrier then.
		if err := a.kv.barrier(ctx); err != nil {
			return nil, err
		}
		ctx = withBarrierDone(ctx)
	}
	if err := a.checkUnary(info.FullMethod, req, ai); err != nil {
		return nil, authError(err)
	}
	return handler(ctx, req)
}

// adminMethods need the root role once auth is on, as in etcd.
var adminMethods = map[string]bool{
	"/etcdserverpb.KV/Compact":                true,
	"/etcdserverpb.Maintenance/Alarm":         true,
	"/etcdserverpb.Maintenance/Defragment":    true,
	"/etcdserverpb.Maintenance/Hash":          true,
	"/etcdserverpb.Maintenance/HashKV":        true,
	"/etcdserverpb.Maintenance/Snapshot":      true,
	"/etcdserverpb.Maintenance/MoveLeader":    true,
	"/etcdserverpb.Maintenance/Downgrade":     true,
	"/etcdserverpb.Cluster/MemberAdd":         true,
	"/etcdserverpb.Cluster/MemberRemove":      true,
	"/etcdserverpb.Cluster/MemberUpdate":      true,
	"/etcdserverpb.Cluster/MemberPromote":     true,
	"/etcdserverpb.Auth/AuthEnable":           true,
	"/etcdserverpb.Auth/AuthDisable":          true,
	"/etcdserverpb.Auth/UserAdd":              true,
	"/etcdserverpb.Auth/UserDelete":           true,
	"/etcdserverpb.Auth/UserChangePassword":   true, // her own too, as in etcd 3.7
	"/etcdserverpb.Auth/UserList":             true,
	"/etcdserverpb.Auth/UserGrantRole":        true,
	"/etcdserverpb.Auth/UserRevokeRole":       true,
	"/etcdserverpb.Auth/RoleAdd":              true,
	"/etcdserverpb.Auth/RoleDelete":           true,
	"/etcdserverpb.Auth/RoleList":             true,
	"/etcdserverpb.Auth/RoleGrantPermission":  true,
	"/etcdserverpb.Auth/RoleRevokePermission": true,
	// strata's own: a backup version (backup.CreateMethod).
	"/strata.backup.v1.Backup/Create": true,
}

// userMethods need an authenticated caller once auth is on, whoever it is
// (etcd's requireAuthInfo): the member list and a member's status, which
// tools such as etcdctl endpoint health ask for first, and the lease
// requests, which some then check further (checkUnary, keepAlivePermitted).
var userMethods = map[string]bool{
	"/etcdserverpb.Cluster/MemberList":    true,
	"/etcdserverpb.Maintenance/Status":    true,
	"/etcdserverpb.Lease/LeaseGrant":      true,
	"/etcdserverpb.Lease/LeaseRevoke":     true,
	"/etcdserverpb.Lease/LeaseTimeToLive": true,
	"/etcdserverpb.Lease/LeaseLeases":     true,
	"/etcdserverpb.Lease/LeaseKeepAlive":  true,
}

// requireUser refuses a call without an authenticated caller once auth is
// on.
func (a *Auth) requireUser(ai *auth.Info) error {
	if a.s.Enabled() && ai == nil {
		return auth.ErrUserEmpty
	}
	return nil
}

// checkUnary is the one place where a unary call's permission is decided.
func (a *Auth) checkUnary(method string, req any, ai *auth.Info) error {
	if r, ok := req.(*pb.AlarmRequest); ok && r.Action == pb.AlarmRequest_GET {
		// Listing alarms is any user's (etcdctl endpoint health does it);
		// raising and clearing them is root's.
		return a.requireUser(ai)
	}
	if adminMethods[method] {
		return a.s.IsAdminPermitted(ai)
	}
	if userMethods[method] {
		if err := a.requireUser(ai); err != nil {
			return err
		}
	}
	switch r := req.(type) {
	case *pb.RangeRequest:
		return a.s.IsRangePermitted(ai, r.Key, r.RangeEnd)
	case *pb.PutRequest:
		return a.s.IsTxnPermitted(ai, &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestPut{RequestPut: r}}}})
	case *pb.DeleteRangeRequest:
		return a.s.IsTxnPermitted(ai, &pb.TxnRequest{Success: []*pb.RequestOp{{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: r}}}})
	case *pb.TxnRequest:
		return a.s.IsTxnPermitted(ai, r)
	case *pb.LeaseTimeToLiveRequest:
		if !r.Keys {
			return nil // etcd checks only when the keys are asked for
		}
		return a.checkLeaseTimeToLive(ai, r.ID)
	case *pb.LeaseRevokeRequest:
		return a.checkLeaseRevoke(ai, r.ID)
	case *pb.LeaseLeasesRequest:
		return a.checkLeaseLeases(ai)
	case *pb.AuthUserGetRequest:
		return a.s.IsUserOrAdmin(ai, r.Name)
	case *pb.AuthRoleGetRequest:
		if err := a.s.IsAdminPermitted(ai); err == nil {
			return nil
		}
		if ai != nil && a.s.HasRole(ai.Username, r.Role) {
			return nil
		}
		return auth.ErrPermissionDenied
	}
	return nil
}

// checkLeaseTimeToLive permits TimeToLive with keys to a user who may read
// every key attached to the lease, as etcd does.
func (a *Auth) checkLeaseTimeToLive(ai *auth.Info, id int64) error {
	return a.leaseKeysPermitted(ai, id, a.readKey)
}

// checkLeaseLeases permits listing the leases to a user who may read every
// key attached to any of them, as etcd's checkLeaseLeases.
func (a *Auth) checkLeaseLeases(ai *auth.Info) error {
	if a.leases == nil {
		return nil
	}
	for _, id := range a.leases.Leases() {
		if err := a.leaseKeysPermitted(ai, id, a.readKey); err != nil {
			return err
		}
	}
	return nil
}

// keepAlivePermitted permits a renewal to a user who may write every key
// attached to the lease, as etcd's checkLeaseRenew: a renewal keeps them
// all. It is decided for each request of the stream, as auth stands then.
func (a *Auth) keepAlivePermitted(ctx context.Context, id int64) error {
	if !a.s.Enabled() {
		return nil
	}
	ai, err := a.callerInfo(ctx)
	if err != nil {
		return err
	}
	if err := a.requireUser(ai); err != nil {
		return err
	}
	return a.leaseKeysPermitted(ai, id, a.s.IsPutPermitted)
}

// checkLeaseRevoke permits a revoke, which deletes every key attached to
// the lease, to a user who may write each of them, as etcd's auth applier
// does (checkLeasePuts). The applier checks the revoke again.
func (a *Auth) checkLeaseRevoke(ai *auth.Info, id int64) error {
	return a.leaseKeysPermitted(ai, id, a.s.IsPutPermitted)
}

// leaseKeysPermitted permits root, and a user whom permitted allows every
// key attached to lease id, as etcd's lease checks do.
func (a *Auth) leaseKeysPermitted(ai *auth.Info, id int64, permitted func(*auth.Info, []byte) error) error {
	if err := a.s.IsAdminPermitted(ai); err == nil {
		return nil
	}
	keys, err := a.b.Store().LeaseKeys(id)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := permitted(ai, k); err != nil {
			return err
		}
	}
	return nil
}

// readKey checks read access to one key.
func (a *Auth) readKey(ai *auth.Info, key []byte) error {
	return a.s.IsRangePermitted(ai, key, nil)
}

// ForwardToken copies the caller's token into the outgoing metadata of a
// request forwarded to the leader, which checks the caller again.
func ForwardToken(ctx context.Context) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ctx
	}
	if ts := md.Get(rpctypes.TokenFieldNameGRPC); len(ts) > 0 {
		return metadata.AppendToOutgoingContext(ctx, rpctypes.TokenFieldNameGRPC, ts[0])
	}
	return ctx
}

func (a *Auth) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if !a.s.Enabled() {
		if info.FullMethod == watchMethod || info.FullMethod == keepAliveMethod {
			// A watch or keep-alive stream outlives the auth state it
			// opened in: each create or renewal is checked as auth stands
			// when it arrives, as etcd checks it (watchPermitted,
			// keepAlivePermitted), so a stream opened before auth was
			// enabled is refused from then on unless its token names a
			// permitted user.
			return handler(srv, &authStream{ServerStream: ss, a: a, ctx: ss.Context()})
		}
		return handler(srv, ss)
	}
	ai, callerErr := a.callerInfo(ss.Context())
	if callerErr != nil {
		if info.FullMethod != watchMethod {
			return authError(callerErr)
		}
		// etcd refuses each watch of such a stream, not the stream.
		ai = nil
	}
	if adminMethods[info.FullMethod] {
		if err := a.s.IsAdminPermitted(ai); err != nil {
			return authError(err)
		}
	}
	return handler(srv, &authStream{ServerStream: ss, a: a, ai: ai, ctx: auth.NewContext(ss.Context(), ai)})
}

// watchMethod is the Watch service's stream, keepAliveMethod the Lease
// service's.
const (
	watchMethod     = "/etcdserverpb.Watch/Watch"
	keepAliveMethod = "/etcdserverpb.Lease/LeaseKeepAlive"
)

// authStream checks what a stream asks to read: a RangeStream's range
// (refused with etcd's permission error, as Range is), and each watch it
// creates. A refused create is answered as etcd answers it (a created-and-canceled
// response with watch ID -1 and the permission error as the reason) and
// never reaches the Watch handler.
//
// Concurrency: gRPC allows one SendMsg at a time; sendMu orders the
// handler's sends and the refusals RecvMsg sends.
type authStream struct {
	grpc.ServerStream
	a   *Auth
	ai  *auth.Info
	ctx context.Context

	sendMu sync.Mutex
}

func (s *authStream) Context() context.Context { return s.ctx }

func (s *authStream) SendMsg(m any) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.ServerStream.SendMsg(m)
}

func (s *authStream) RecvMsg(m any) error {
	for {
		if err := s.ServerStream.RecvMsg(m); err != nil {
			return err
		}
		if r, ok := m.(*pb.RangeRequest); ok {
			// RangeStream's one request: checked as Range is, after the
			// read barrier if it is linearizable (see unary).
			if !r.Serializable {
				if err := s.a.kv.barrier(s.ctx); err != nil {
					return err
				}
				s.ctx = withBarrierDone(s.ctx)
			}
			if err := s.a.s.IsRangePermitted(s.ai, r.Key, r.RangeEnd); err != nil {
				return authError(err)
			}
			return nil
		}
		if r, ok := m.(*pb.LeaseKeepAliveRequest); ok {
			// Each renewal is checked, as etcd checks each (LeaseRenew):
			// a refusal ends the stream with the error.
			if err := s.a.keepAlivePermitted(s.ServerStream.Context(), r.ID); err != nil {
				return authError(err)
			}
			return nil
		}
		w, ok := m.(*pb.WatchRequest)
		if !ok || w.GetCreateRequest() == nil {
			return nil
		}
		err := s.watchPermitted(w.GetCreateRequest())
		if err == nil {
			return nil
		}
		resp := &pb.WatchResponse{WatchId: -1, Created: true, Canceled: true, CancelReason: watchRefusal(err)}
		fillHeader(s.a.b, &resp.Header, s.a.b.Store().Rev())
		if err := s.SendMsg(resp); err != nil {
			return err
		}
	}
}

// watchPermitted decides one watch create as etcd's isWatchPermitted does,
// as auth stands when the create arrives: the caller is found again from
// the stream's token, so a simple token that expired (or was revoked) since
// the stream opened refuses the create, and a valid one's TTL starts again,
// as every use of a token restarts it.
func (s *authStream) watchPermitted(c *pb.WatchCreateRequest) error {
	if !s.a.s.Enabled() {
		return nil
	}
	ai, err := s.a.callerInfo(s.ServerStream.Context())
	if err != nil {
		return err
	}
	key := c.Key
	if len(key) == 0 {
		key = []byte{0} // the key the watch is placed on (watch.go), as etcd checks it
	}
	return s.a.s.IsRangePermitted(ai, key, c.RangeEnd)
}

// watchRefusal is the cancel reason etcd gives a refused watch create:
// the token's or the user's fault named, any other refusal permission
// denied.
func watchRefusal(err error) string {
	switch {
	case errors.Is(err, auth.ErrInvalidAuthToken):
		return rpctypes.ErrGRPCInvalidAuthToken.Error()
	case errors.Is(err, auth.ErrAuthOldRevision):
		return rpctypes.ErrGRPCAuthOldRevision.Error()
	case errors.Is(err, auth.ErrUserEmpty):
		return rpctypes.ErrGRPCUserEmpty.Error()
	}
	return rpctypes.ErrGRPCPermissionDenied.Error()
}

// authError maps an auth package error, or any other, to etcd's gRPC
// error.
func authError(err error) error { return toGRPCError(err) }

// AuthorizeKV implements concurrency.Authorizer: it checks a KV request that
// the lock and election services make for their caller as the auth
// interceptor checks the KV service's own callers: reads and writes against
// the caller's permissions, nobody's when the call carries no token.
// (Writes are checked again when applied, as every write is.)
func (a *Auth) AuthorizeKV(ctx context.Context, req any) error {
	if a.s == nil || !a.s.Enabled() {
		return nil
	}
	ai := auth.FromContext(ctx)
	var err error
	switch r := req.(type) {
	case *pb.RangeRequest:
		err = a.s.IsRangePermitted(ai, r.Key, r.RangeEnd)
	case *pb.TxnRequest:
		err = a.s.IsTxnPermitted(ai, r)
	case *pb.DeleteRangeRequest:
		err = a.s.IsDeleteRangePermitted(ai, r.Key, r.RangeEnd)
	default:
		err = auth.ErrPermissionDenied // a request this check does not know
	}
	if err != nil {
		return authError(err)
	}
	return nil
}

// authGRPCError maps an auth package error to etcd's gRPC error; toGRPCError
// asks it, so that writes the applier refused map too.
func authGRPCError(err error) (error, bool) {
	for _, m := range authErrors {
		if errors.Is(err, m.err) {
			return m.grpc, true
		}
	}
	return nil, false
}

var authErrors = []struct{ err, grpc error }{
	{auth.ErrRootUserNotExist, rpctypes.ErrGRPCRootUserNotExist},
	{auth.ErrRootRoleNotExist, rpctypes.ErrGRPCRootRoleNotExist},
	{auth.ErrUserAlreadyExist, rpctypes.ErrGRPCUserAlreadyExist},
	{auth.ErrUserEmpty, rpctypes.ErrGRPCUserEmpty},
	{auth.ErrUserNotFound, rpctypes.ErrGRPCUserNotFound},
	{auth.ErrRoleAlreadyExist, rpctypes.ErrGRPCRoleAlreadyExist},
	{auth.ErrRoleNotFound, rpctypes.ErrGRPCRoleNotFound},
	{auth.ErrRoleEmpty, rpctypes.ErrGRPCRoleEmpty},
	{auth.ErrPermissionNotGiven, rpctypes.ErrGRPCPermissionNotGiven},
	{auth.ErrAuthFailed, rpctypes.ErrGRPCAuthFailed},
	{auth.ErrNoPasswordUser, rpctypes.ErrGRPCAuthFailed},
	{auth.ErrPermissionDenied, rpctypes.ErrGRPCPermissionDenied},
	{auth.ErrRoleNotGranted, rpctypes.ErrGRPCRoleNotGranted},
	{auth.ErrPermissionNotGranted, rpctypes.ErrGRPCPermissionNotGranted},
	{auth.ErrAuthNotEnabled, rpctypes.ErrGRPCAuthNotEnabled},
	{auth.ErrAuthOldRevision, rpctypes.ErrGRPCAuthOldRevision},
	{auth.ErrInvalidAuthToken, rpctypes.ErrGRPCInvalidAuthToken},
	{auth.ErrInvalidAuthMgmt, rpctypes.ErrGRPCInvalidAuthMgmt},
}

// setHeader fills the response header of any auth response.
func (a *Auth) setHeader(m proto.Message) {
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName("header")
	if fd == nil {
		return
	}
	var h *pb.ResponseHeader
	fillHeader(a.b, &h, a.b.Store().Rev())
	r.Set(fd, protoreflect.ValueOfMessage(h.ProtoReflect()))
}

// write replicates an auth request and returns its response.
func (a *Auth) write(ctx context.Context, req *pb.InternalRaftRequest) (proto.Message, error) {
	res, err := a.kv.propose(ctx, req)
	if err != nil {
		return nil, authError(err)
	}
	a.setHeader(res.Response)
	return res.Response, nil
}

// read answers from the local auth state once it reflects every write
// committed before the call.
func (a *Auth) read(ctx context.Context, req *pb.InternalRaftRequest) (proto.Message, error) {
	if err := a.kv.barrier(ctx); err != nil {
		return nil, err
	}
	resp, err := a.s.Read(req)
	if err != nil {
		return nil, authError(err)
	}
	a.setHeader(resp)
	return resp, nil
}

func call[R proto.Message](resp proto.Message, err error) (R, error) {
	if err != nil {
		var zero R
		return zero, err
	}
	return resp.(R), nil
}

// AuthEnable turns authentication on; the user root with the role root
// must exist.
func (a *Auth) AuthEnable(ctx context.Context, r *pb.AuthEnableRequest) (*pb.AuthEnableResponse, error) {
	return call[*pb.AuthEnableResponse](a.write(ctx, &pb.InternalRaftRequest{AuthEnable: r}))
}

// AuthDisable turns authentication off.
func (a *Auth) AuthDisable(ctx context.Context, r *pb.AuthDisableRequest) (*pb.AuthDisableResponse, error) {
	return call[*pb.AuthDisableResponse](a.write(ctx, &pb.InternalRaftRequest{AuthDisable: r}))
}

// AuthStatus reports whether auth is on and the auth revision.
func (a *Auth) AuthStatus(ctx context.Context, r *pb.AuthStatusRequest) (*pb.AuthStatusResponse, error) {
	return call[*pb.AuthStatusResponse](a.read(ctx, &pb.InternalRaftRequest{AuthStatus: r}))
}

// Authenticate checks a user's password here (bcrypt is too slow for the
// applier) and replicates the issue of a token, so that every member knows
// a simple token. It reads the auth state after a read barrier, as etcd
// does: a member that has not yet applied an AuthEnable, a user or a
// password change committed before the call would answer from its old
// state.
//
// An auth change applied between the password check and the token (the
// password changed, the user deleted) makes it check again, as etcd does:
// the token issued is not handed out, and expires unused.
func (a *Auth) Authenticate(ctx context.Context, r *pb.AuthenticateRequest) (*pb.AuthenticateResponse, error) {
	if err := a.kv.barrier(ctx); err != nil {
		return nil, err
	}
	for {
		if !a.s.Enabled() {
			return nil, rpctypes.ErrGRPCAuthNotEnabled
		}
		checkedAt := a.s.Revision()
		if err := a.s.CheckPassword(r.Name, r.Password); err != nil {
			return nil, authError(err)
		}
		tok, err := a.s.NewSimpleToken()
		if err != nil {
			return nil, err
		}
		resp, err := call[*pb.AuthenticateResponse](a.write(ctx, &pb.InternalRaftRequest{
			Authenticate: &pb.InternalAuthenticateRequest{Name: r.Name, SimpleToken: tok},
		}))
		if err != nil || a.s.Revision() == checkedAt {
			return resp, err
		}
	}
}

// UserAdd adds a user; its password is hashed before it is replicated.
func (a *Auth) UserAdd(ctx context.Context, r *pb.AuthUserAddRequest) (*pb.AuthUserAddResponse, error) {
	if r.Name == "" {
		return nil, rpctypes.ErrGRPCUserEmpty
	}
	// As etcd: the password is hashed here, and a hash the client sent
	// instead is ignored (a user with a password gets the hash of Password).
	q := &pb.AuthUserAddRequest{Name: r.Name, Options: r.Options}
	if r.Options == nil || !r.Options.NoPassword {
		h, err := a.s.HashPassword(r.Password)
		if err != nil {
			return nil, err
		}
		q.HashedPassword = h
	}
	return call[*pb.AuthUserAddResponse](a.write(ctx, &pb.InternalRaftRequest{AuthUserAdd: q}))
}

// UserGet returns a user's roles.
func (a *Auth) UserGet(ctx context.Context, r *pb.AuthUserGetRequest) (*pb.AuthUserGetResponse, error) {
	return call[*pb.AuthUserGetResponse](a.read(ctx, &pb.InternalRaftRequest{AuthUserGet: r}))
}

// UserList lists the users.
func (a *Auth) UserList(ctx context.Context, r *pb.AuthUserListRequest) (*pb.AuthUserListResponse, error) {
	return call[*pb.AuthUserListResponse](a.read(ctx, &pb.InternalRaftRequest{AuthUserList: r}))
}

// UserDelete deletes a user (not root while auth is on).
func (a *Auth) UserDelete(ctx context.Context, r *pb.AuthUserDeleteRequest) (*pb.AuthUserDeleteResponse, error) {
	return call[*pb.AuthUserDeleteResponse](a.write(ctx, &pb.InternalRaftRequest{AuthUserDelete: r}))
}

// UserChangePassword sets a user's password, hashed before it is
// replicated.
func (a *Auth) UserChangePassword(ctx context.Context, r *pb.AuthUserChangePasswordRequest) (*pb.AuthUserChangePasswordResponse, error) {
	// As etcd: Password, when given, wins over a hash the client sent.
	q := &pb.AuthUserChangePasswordRequest{Name: r.Name, HashedPassword: r.HashedPassword}
	if r.Password != "" {
		h, err := a.s.HashPassword(r.Password)
		if err != nil {
			return nil, err
		}
		q.HashedPassword = h
	}
	return call[*pb.AuthUserChangePasswordResponse](a.write(ctx, &pb.InternalRaftRequest{AuthUserChangePassword: q}))
}

// UserGrantRole grants a role to a user.
func (a *Auth) UserGrantRole(ctx context.Context, r *pb.AuthUserGrantRoleRequest) (*pb.AuthUserGrantRoleResponse, error) {
	return call[*pb.AuthUserGrantRoleResponse](a.write(ctx, &pb.InternalRaftRequest{AuthUserGrantRole: r}))
}

// UserRevokeRole revokes a role from a user.
func (a *Auth) UserRevokeRole(ctx context.Context, r *pb.AuthUserRevokeRoleRequest) (*pb.AuthUserRevokeRoleResponse, error) {
	return call[*pb.AuthUserRevokeRoleResponse](a.write(ctx, &pb.InternalRaftRequest{AuthUserRevokeRole: r}))
}

// RoleAdd adds a role.
func (a *Auth) RoleAdd(ctx context.Context, r *pb.AuthRoleAddRequest) (*pb.AuthRoleAddResponse, error) {
	if r.Name == "" {
		return nil, rpctypes.ErrGRPCRoleEmpty
	}
	return call[*pb.AuthRoleAddResponse](a.write(ctx, &pb.InternalRaftRequest{AuthRoleAdd: r}))
}

// RoleGet returns a role's permissions.
func (a *Auth) RoleGet(ctx context.Context, r *pb.AuthRoleGetRequest) (*pb.AuthRoleGetResponse, error) {
	return call[*pb.AuthRoleGetResponse](a.read(ctx, &pb.InternalRaftRequest{AuthRoleGet: r}))
}

// RoleList lists the roles.
func (a *Auth) RoleList(ctx context.Context, r *pb.AuthRoleListRequest) (*pb.AuthRoleListResponse, error) {
	return call[*pb.AuthRoleListResponse](a.read(ctx, &pb.InternalRaftRequest{AuthRoleList: r}))
}

// RoleDelete deletes a role and revokes it from every user.
func (a *Auth) RoleDelete(ctx context.Context, r *pb.AuthRoleDeleteRequest) (*pb.AuthRoleDeleteResponse, error) {
	return call[*pb.AuthRoleDeleteResponse](a.write(ctx, &pb.InternalRaftRequest{AuthRoleDelete: r}))
}

// RoleGrantPermission grants (or changes) a key-range permission.
func (a *Auth) RoleGrantPermission(ctx context.Context, r *pb.AuthRoleGrantPermissionRequest) (*pb.AuthRoleGrantPermissionResponse, error) {
	if r.Perm == nil {
		return nil, rpctypes.ErrGRPCPermissionNotGiven
	}
	return call[*pb.AuthRoleGrantPermissionResponse](a.write(ctx, &pb.InternalRaftRequest{AuthRoleGrantPermission: r}))
}

// RoleRevokePermission revokes a key-range permission.
func (a *Auth) RoleRevokePermission(ctx context.Context, r *pb.AuthRoleRevokePermissionRequest) (*pb.AuthRoleRevokePermissionResponse, error) {
	return call[*pb.AuthRoleRevokePermissionResponse](a.write(ctx, &pb.InternalRaftRequest{AuthRoleRevokePermission: r}))
}
