// Package concurrency serves etcd's v3lock and v3election gRPC services:
// distributed locks and leader elections that clients use without running
// etcd's client-side recipes (clientv3/concurrency) themselves.
//
// # The recipe
//
// Both services are the recipe of clientv3/concurrency run on the server,
// on the same keys, so that a lock taken through the Lock service excludes
// one taken by etcdctl lock or concurrency.Mutex, and likewise for
// elections:
//
//  1. A participant owns the key "<name>/<lease ID in hex>", attached to
//     its lease, created by a Txn that also reads the prefix's owner (the
//     key with the lowest create revision). A second call with the same
//     lease finds the key already there and reuses it.
//  2. If its key is not the owner, it waits for the deletion of the key
//     created just before its own (the newest key of the prefix whose
//     create revision is lower), then looks again, until no older key is
//     left. Each waiter watches one key, so a release wakes one waiter,
//     not the whole queue.
//  3. Releasing (Unlock, Resign) deletes the key; so does the expiry or
//     revocation of its lease, which is how a crashed holder lets go.
//
// A Lock that fails while it waits, or a Campaign canceled while it waits,
// deletes its key, so that it does not hold up the waiters behind it (as
// etcd's recipe does).
//
// # Why in-process, not through a client
//
// etcd runs the recipe with a clientv3 client connected to the server
// through an in-process gRPC adapter. Here the services call the member's
// own KV and Lease service implementations and its watch hub directly
// (Backend): no loopback connection, no client TLS or credentials to
// configure, no client-side retries that could repeat a write, and the
// caller's context (deadline, the caller's identity) reaches the KV
// service unchanged. In-process calls pass no gRPC interceptor, so the
// services ask Backend.Authorizer before each KV request they make for a
// caller: with auth on, a caller locks, campaigns and observes only where
// it may read and write, as in etcd.
//
// # Generated code
//
// v3electionpb and v3lockpb are generated from the .proto files next to
// them by gen.sh (go generate), which names the tool versions; the output
// is committed and CI does not regenerate it.
//
// Concurrency: every handler may run on many goroutines at once.
package concurrency

//go:generate sh gen.sh
