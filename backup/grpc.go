package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
)

// The backup service a member serves on its client URLs, beside etcd's,
// so that it has their TLS and their auth (only root may call it once
// auth is on: server/auth.go lists CreateMethod). It is written by hand,
// as transport's peer service is, and its messages are JSON (CodecName):
// one unary method needs no generated code.
const (
	// ServiceName is the gRPC service's name.
	ServiceName = "strata.backup.v1.Backup"
	// CreateMethod is the full name of the method that takes a version.
	CreateMethod = "/" + ServiceName + "/Create"
	// CodecName is the gRPC content subtype of the service's messages: a
	// client calls with grpc.CallContentSubtype(CodecName).
	CodecName = "strata-json"
)

// CreateRequest asks a member for a version of its engine.
type CreateRequest struct {
	// Target is the URL of the target (file:// on the member's host, or
	// s3://); empty: the member's own --backup-target. The member reaches
	// it with its own --s3-* settings and credentials: none travel in the
	// request (docs/backup.md, "Taking a version of a running member").
	Target string `json:"target,omitempty"`
	// Kind asks for a files or a log version; empty: as the member's
	// policy says (--backup-log-ratio, --backup-full-every).
	Kind Kind `json:"kind,omitempty"`
}

// CreateResponse is the summary of the version written.
type CreateResponse struct {
	// Target is the URL of the target written.
	Target string `json:"target"`
	// Version, RaftIndex, RaftTerm, Revision, CompactRevision, MemberID,
	// NewFiles, NewBytes and Created are the manifest's (FORMAT.md).
	Version         uint64    `json:"version"`
	Kind            Kind      `json:"kind,omitempty"`
	Base            uint64    `json:"base,omitempty"`
	Created         time.Time `json:"created"`
	MemberID        ID        `json:"member_id"`
	RaftIndex       uint64    `json:"raft_index"`
	RaftTerm        uint64    `json:"raft_term"`
	Revision        int64     `json:"revision"`
	CompactRevision int64     `json:"compact_revision"`
	// Files and Size are the number and bytes of the version's files (of
	// its log objects, for a log version); EngineBytes, for a log version,
	// is what a files version of the same state would have held.
	Files       int    `json:"files"`
	Size        int64  `json:"size"`
	EngineBytes int64  `json:"engine_bytes,omitempty"`
	NewFiles    uint64 `json:"new_files"`
	NewBytes    uint64 `json:"new_bytes"`
	// Duration is how long the member took.
	Duration time.Duration `json:"duration_ns"`
}

// backupServer is the handler type gRPC checks Register's argument
// against.
type backupServer interface {
	create(ctx context.Context, req *CreateRequest) (*CreateResponse, error)
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*backupServer)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Create",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			req := new(CreateRequest)
			if err := dec(req); err != nil {
				return nil, err
			}
			call := func(ctx context.Context, req any) (any, error) {
				return srv.(backupServer).create(ctx, req.(*CreateRequest))
			}
			if icpt == nil {
				return call(ctx, req)
			}
			return icpt(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: CreateMethod}, call)
		},
	}},
	Metadata: "backup/grpc.go",
}

// Register serves s's backup service on a member's client gRPC server.
func (s *Service) Register(g *grpc.Server) { g.RegisterService(&serviceDesc, s) }

// create serves CreateMethod.
func (s *Service) create(ctx context.Context, req *CreateRequest) (*CreateResponse, error) {
	start := time.Now()
	m, err := s.CreateKind(ctx, req.Target, req.Kind)
	if err != nil {
		code := codes.Internal
		switch {
		case errors.Is(err, ErrNoTarget), errors.Is(err, ErrOtherFS), errors.Is(err, ErrNoLogVersion):
			code = codes.FailedPrecondition
		case errors.Is(err, ErrClosed):
			code = codes.Unavailable
		case ctx.Err() != nil:
			code = status.FromContextError(ctx.Err()).Code()
		}
		return nil, status.Error(code, err.Error())
	}
	target := req.Target
	if target == "" {
		target = s.cfg.Target
	}
	resp := &CreateResponse{
		Target: target, Version: m.Version, Kind: m.Kind, Created: m.Created, MemberID: m.MemberID,
		RaftIndex: m.RaftIndex, RaftTerm: m.RaftTerm, Revision: m.Revision, CompactRevision: m.CompactRevision,
		Files: len(m.Files), Size: m.Size(), NewFiles: m.NewFiles, NewBytes: m.NewBytes, Duration: time.Since(start),
	}
	if m.IsLog() {
		resp.Base, resp.Files, resp.Size, resp.EngineBytes = m.Base, len(m.Log), m.LogSize(), m.EngineBytes
	}
	return resp, nil
}

// CreateRemote asks the member at the other end of cc (a client
// connection to its client URL, carrying its TLS and, with auth on, a
// root token) for a version, and returns its summary.
func CreateRemote(ctx context.Context, cc grpc.ClientConnInterface, req *CreateRequest) (*CreateResponse, error) {
	resp := new(CreateResponse)
	if err := cc.Invoke(ctx, CreateMethod, req, resp, grpc.CallContentSubtype(CodecName)); err != nil {
		return nil, err
	}
	return resp, nil
}

// jsonCodec carries the service's messages as JSON. It is registered
// under CodecName, so etcd's services on the same server keep the
// default (protobuf) codec.
type jsonCodec struct{}

func init() { encoding.RegisterCodec(jsonCodec{}) }

// Marshal implements encoding.Codec.
func (jsonCodec) Marshal(v any) ([]byte, error) {
	switch v.(type) {
	case *CreateRequest, *CreateResponse:
		return json.Marshal(v)
	}
	return nil, fmt.Errorf("backup codec: cannot marshal %T", v)
}

// Unmarshal implements encoding.Codec.
func (jsonCodec) Unmarshal(data []byte, v any) error {
	switch v.(type) {
	case *CreateRequest, *CreateResponse:
		return json.Unmarshal(data, v)
	}
	return fmt.Errorf("backup codec: cannot unmarshal into %T", v)
}

// Name implements encoding.Codec.
func (jsonCodec) Name() string { return CodecName }
