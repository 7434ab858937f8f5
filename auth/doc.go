// Package auth is strata's authentication and authorization state: users
// (with bcrypt-hashed passwords, or none), roles with key-range permissions,
// the enabled flag, and the auth revision, with etcd's rules and errors. It
// also issues and checks tokens (etcd's "simple" tokens with a TTL, or
// signed JWTs) and answers the permission questions the gRPC layer and the
// applier ask.
//
// # How state changes
//
// Every change (auth enable/disable, user and role management, and
// Authenticate, which registers a simple token on every member) is a
// replicated request: server/ proposes an InternalRaftRequest whose Auth*
// field is set, and the applier calls Store.Apply with the mvcc write batch
// of the entry. Apply decides the outcome from the in-memory state (the same
// on every member, since it is only ever changed by applied entries), updates
// it, and writes the changed records into the same engine batch, so that the
// engine's applied index and the auth state never disagree (docs/design.md,
// durability rule 2). The in-memory state changes before the batch commits: the entry is
// already committed in raft, and a failed engine commit stops the member.
//
// Passwords are hashed before proposing (Store.HashPassword, cost
// --bcrypt-cost), so that the log never holds a clear password and every
// member stores the same hash.
//
// # Layout in the engine
//
// Under the prefix "a" (mvcc keeps "m"; engine/pebble keeps 0x00 0x00):
//
//	ae          enabled flag (1 byte) and auth revision (8 bytes, big-endian)
//	au<name>    a user, authpb.User (password hash, roles sorted, options)
//	ar<name>    a role, authpb.Role (permissions sorted by key)
//
// Load reads them back at start-up and after a raft snapshot install.
//
// # The auth revision
//
// The revision increases with every change of users, roles, permissions or
// the enabled flag. A request is checked against the revision it is made
// at: the current one for a simple token (as in etcd: an auth change leaves
// the tokens of other users valid), the one it was issued at for a JWT,
// whose request fails with ErrAuthOldRevision once the store moved on, and
// whose clients authenticate again (clientv3 does so by itself). Writes
// carry that revision in their raft header and are checked again when
// applied, so a permission revoked between the check and the apply is
// honoured, as in etcd.
//
// # Permissions
//
// A role grants READ, WRITE or READWRITE on a key (range_end empty), a
// range [key, range_end), or everything from key on (range_end "\x00"). A
// request is permitted if the union of its user's ranges of the right kind
// covers the whole range it touches. The user "root" with the role "root"
// may do anything, including administration (user and role management,
// compaction, membership and maintenance).
//
// Concurrency: Store is safe for use from any goroutine; Apply runs only
// on the applier goroutine.
package auth
