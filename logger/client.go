package logger

import (
	"context"
	"errors"
	"fmt"
	"io"

	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/strata-kv/strata/transport"
)

// Client calls the logger API of one logger.
//
// Concurrency: safe from any goroutine.
type Client struct {
	conn *grpc.ClientConn
}

// Dial returns a client of the logger at endpoint (its client URL, like
// http://127.0.0.1:2479). It connects lazily, on the first call.
func Dial(endpoint string) (*Client, error) {
	addr, err := transport.HostPort(endpoint)
	if err != nil {
		return nil, fmt.Errorf("logger endpoint: %w", err)
	}
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
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
// OutOfRange, NotFound).
func (c *Client) Recover(ctx context.Context, clusterID, first, last uint64, fn func([]*raftpb.Entry) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.conn.NewStream(ctx, &apiDesc.Streams[0], recoverMethod)
	if err != nil {
		return err
	}
	if err := s.SendMsg(&RecoverRequest{ClusterID: clusterID, First: first, Last: last}); err != nil {
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
			if next != last+1 {
				return fmt.Errorf("recover [%d, %d]: stream ended at %d", first, last, next)
			}
			return nil
		}
		if err != nil {
			return err
		}
		for _, e := range resp.Entries {
			if e.GetIndex() != next {
				return fmt.Errorf("recover [%d, %d]: got entry %d, want %d", first, last, e.GetIndex(), next)
			}
			next++
		}
		if err := fn(resp.Entries); err != nil {
			return err
		}
	}
}
