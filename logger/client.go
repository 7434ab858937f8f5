package logger

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/url"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/strata-kv/strata/logcompact"
	"github.com/strata-kv/strata/transport"
)

// Client calls the logger API of one logger.
//
// Concurrency: safe from any goroutine.
type Client struct {
	conn *grpc.ClientConn
}

// Dial returns a client of the logger at endpoint (its client URL, like
// http://127.0.0.1:2479). It connects lazily, on the first call. An https
// endpoint is dialled with TLS, trusting the system's CAs: DialTLS takes
// a CA and a client certificate.
func Dial(endpoint string) (*Client, error) { return DialTLS(endpoint, nil) }

// DialTLS is Dial with the TLS configuration for an https endpoint (the CA
// to trust, the client certificate to present: tlsconfig.Info's
// ClientConfig, as etcdctl's --cacert, --cert and --key); nil: the
// system's CAs, no certificate. An http endpoint is dialled in plaintext
// whatever cfg says.
func DialTLS(endpoint string, cfg *tls.Config) (*Client, error) {
	addr, err := transport.HostPort(endpoint)
	if err != nil {
		return nil, fmt.Errorf("logger endpoint: %w", err)
	}
	creds := insecure.NewCredentials()
	if u, err := url.Parse(endpoint); err == nil && u.Scheme == "https" {
		if cfg == nil {
			cfg = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		creds = credentials.NewTLS(cfg.Clone())
	}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.CallContentSubtype(codecName), grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, fmt.Errorf("dial logger %s: %w", endpoint, err)
	}
	return &Client{conn: conn}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Status returns the status of a cluster, or of every cluster the logger
// serves if clusterID is 0.
func (c *Client) Status(ctx context.Context, clusterID uint64) ([]*ClusterStatus, error) {
	resp := &StatusResponse{}
	if err := c.conn.Invoke(ctx, statusMethod, &StatusRequest{ClusterID: clusterID}, resp); err != nil {
		return nil, err
	}
	return resp.Clusters, nil
}

// Truncate asks the logger, on behalf of member memberID (a voter of the
// cluster), to drop the entries <= index. It returns the truncation point
// after the request (the log is truncated up to it once the logger holds
// it committed) and every voter's request.
func (c *Client) Truncate(ctx context.Context, clusterID, memberID, index uint64) (*TruncateResponse, error) {
	resp := &TruncateResponse{}
	if err := c.conn.Invoke(ctx, truncateMethod, &TruncateRequest{ClusterID: clusterID, MemberID: memberID, Index: index}, resp); err != nil {
		return nil, err
	}
	return resp, nil
}

// Recover calls fn with the committed entries [first, last] of a cluster,
// in index order, batch by batch. An error from fn ends the stream and is
// returned; a refusal is the server's gRPC status (InvalidArgument,
// OutOfRange, NotFound, and FailedPrecondition for a range log compaction
// replaced: RecoverBatches takes those).
func (c *Client) Recover(ctx context.Context, clusterID, first, last uint64, fn func([]*raftpb.Entry) error) error {
	return c.recover(ctx, &RecoverRequest{ClusterID: clusterID, First: first, Last: last}, func(it RecoverItem) error {
		if it.Batch != nil {
			return fmt.Errorf("recover [%d, %d]: the logger sent a compacted batch unasked", first, last)
		}
		return fn(it.Entries)
	})
}

// RecoverItem is one piece of a Recover stream: committed entries, or a
// compacted batch standing for the entries [Batch.FirstIndex,
// Batch.LastIndex] (log compaction; decoded, logcompact.Batch).
type RecoverItem struct {
	Entries []*raftpb.Entry
	Batch   *logcompact.Batch
}

// RecoverBatches is Recover for a client that takes compacted batches
// where log compaction replaced entries (docs/logger.md, "Log
// compaction"): fn gets entries or one batch at a time, in index order,
// each starting right after the one before. The first batch may start
// before first, and the last may end after last: a batch stands for its
// whole range (replaying it on a state at any index inside it gives the
// state at its last index), so a state strictly inside it cannot be had.
func (c *Client) RecoverBatches(ctx context.Context, clusterID, first, last uint64, fn func(RecoverItem) error) error {
	return c.recover(ctx, &RecoverRequest{ClusterID: clusterID, First: first, Last: last, AcceptBatches: true}, fn)
}

func (c *Client) recover(ctx context.Context, req *RecoverRequest, fn func(RecoverItem) error) error {
	first, last := req.First, req.Last
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.conn.NewStream(ctx, &apiDesc.Streams[0], recoverMethod)
	if err != nil {
		return err
	}
	if err := s.SendMsg(req); err != nil {
		return err
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	next := first
	for {
		resp := &RecoverResponse{}
		err := s.RecvMsg(resp)
		if errors.Is(err, io.EOF) {
			if next <= last {
				return fmt.Errorf("recover [%d, %d]: stream ended at %d", first, last, next)
			}
			return nil
		}
		if err != nil {
			return err
		}
		for _, cb := range resp.Batches {
			if next > last || cb.FirstIndex > next || cb.LastIndex < next {
				return fmt.Errorf("recover [%d, %d]: got compacted batch %d-%d, want one holding %d", first, last, cb.FirstIndex, cb.LastIndex, next)
			}
			b, err := logcompact.DecodeBatch(cb)
			if err != nil {
				return fmt.Errorf("recover [%d, %d]: compacted batch %d-%d: %w", first, last, cb.FirstIndex, cb.LastIndex, err)
			}
			next = cb.LastIndex + 1
			if err := fn(RecoverItem{Batch: b}); err != nil {
				return err
			}
		}
		if len(resp.Entries) == 0 {
			continue
		}
		for _, e := range resp.Entries {
			if e.GetIndex() != next || next > last {
				return fmt.Errorf("recover [%d, %d]: got entry %d, want %d", first, last, e.GetIndex(), next)
			}
			next++
		}
		if err := fn(RecoverItem{Entries: resp.Entries}); err != nil {
			return err
		}
	}
}
