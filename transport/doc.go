// Package transport carries raft messages and snapshots between the members
// of a strata cluster, over a gRPC service of strata's own served on the peer
// URLs. It borrows the ideas of etcd's rafthttp (a
// long-lived stream per peer, pipelining, a separate snapshot path) in a few
// hundred lines. The wire format is in FORMAT.md.
//
// # Use
//
//	t := transport.New(transport.Config{LocalID: 1, ClusterID: cid, Handler: node, Snapshotter: snaps,
//		Outgoing: node.Outgoing()})      // sends what the node hands over there
//	t.Register(peerGRPCServer)            // before peerGRPCServer.Serve
//	t.AddPeer(2, []string{"http://10.0.0.2:2380"})
//	...
//	t.Send(msgs)                          // from any goroutine; never blocks
//	...
//	t.Stop()
//
// # Streams
//
// For every peer, a writer goroutine keeps one message stream open to it (so
// between two members there are two streams, one per direction). Send puts
// messages in the peer's bounded queue; the writer takes everything queued
// when the stream is ready and sends it as one frame (batching), without
// waiting for any answer (pipelining: the receiver acknowledges nothing;
// raft's own responses are the acknowledgements). A full queue is the back
// pressure: its messages are dropped and raft is told the peer is
// unreachable, so it slows to probing and retransmits. While the stream is
// down the writer reconnects with exponential backoff (50 ms to 1 s) and
// drops what is queued meanwhile, so a returning peer receives fresh
// messages, not a backlog. The receiving member sends an empty keepalive
// frame every second on each stream; a sender that hears nothing for 5 s
// takes the peer for hung or partitioned and reconnects, and so does one
// whose frame is still not written after 5 s (the peer stopped reading and
// its flow-control window stayed full, keepalives or not). Each outgoing
// stream has one receiving goroutine; the writer never receives, since gRPC
// hands the status that ends a stream to one RecvMsg only.
//
// A MsgSnap does not enter the queue: a goroutine opens a snapshot stream on
// a connection of its own and sends the message, then Snapshotter.Open's
// bytes in 1 MiB chunks. It closes that data (an engine view, batch files)
// as soon as it is sent, then waits for the receiver to store it
// (Snapshotter.Receive) and step the MsgSnap; it then reports
// raft.SnapshotFinish, or raft.SnapshotFailure on any error. A snapshot of
// any size therefore never delays a heartbeat. A transfer that stalls fails
// on both sides: the sender gives up when a chunk is still not written
// after 5 s (the receiver stopped reading), so the data it holds is
// released and raft retries later, and the receiver when it waits 5 s for
// the next chunk (the sender stopped sending), so Receive fails and drops
// what it staged. Only a stalled chunk counts, never the transfer's length.
//
// Every stream starts with a hello naming the cluster and both members; the
// receiver refuses a stream from another cluster (ErrClusterIDMismatch) or
// meant for another member, and the sender checks the answer the same way.
// ActiveSince(peer) is when the current outgoing stream's handshake
// succeeded.
//
// A process that is a member of several clusters (a logger,
// docs/logger.md) serves them all on one peer URL through a Mux, which
// reads each stream's hello and hands the stream to the Transport of the
// cluster it names.
//
// # Why a hand-written service and codec
//
// The service has two methods and one message type (frame.go) whose only
// complex field is a raftpb.Message, already a generated protobuf message.
// Generating code would add a .proto, two protoc plugins and ~400 generated
// lines that CI cannot regenerate; instead a grpc.ServiceDesc names the two
// streams and a 100-line codec encodes frames with protowire, in the
// protobuf encoding, so the format is still described by an ordinary .proto
// (FORMAT.md) and readable by any protobuf tool. The codec is registered
// under its own content subtype ("strata-peer"), so the etcd services that
// share the gRPC server keep the default codec. The decoder is fuzzed
// (FuzzFrame).
//
// # Concurrency
//
// All methods of Transport are safe for concurrent use. The Handler is never
// called from inside Send, so it may wait for the goroutine that calls Send
// (the node's does). Process is called concurrently for different peers and
// in order for one peer's stream; a MsgSnap comes on a stream of its own, so
// it is not ordered with the peer's other messages (raft does not need it
// to be). Stop waits for every Handler call in progress.
package transport
