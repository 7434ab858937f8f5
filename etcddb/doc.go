// Package etcddb is etcd's backend database file: the bbolt file behind a
// member's member/snap/db and behind `etcdctl snapshot save`. strata writes
// its state in this layout, so that etcd's tools read strata's snapshots
// (`etcdctl snapshot status`, `etcdutl snapshot restore`) and an etcd cluster
// can be restored from one; and it reads the layout, so that a strata data
// directory can be built from an etcd snapshot or data directory
// (maintenance.Restore). The format is etcd's; this package writes and reads
// it with go.etcd.io/bbolt, etcd's own engine, and none of etcd's server code.
//
// # The layout (etcd 3.7, storage version 3.7.0)
//
// One bbolt bucket per kind of state, every value in etcd's encoding:
//
//	key             revision -> mvccpb.KeyValue. The revision is 17 bytes:
//	                main (8, big-endian), '_', sub (8, big-endian); a
//	                deletion's has an 18th byte 't' and its value holds only
//	                the key. Every version etcd keeps, in revision order.
//	meta            consistent_index, term: 8 bytes big-endian;
//	                confState: raft's ConfState as JSON;
//	                scheduledCompactRev, finishedCompactRev: a 17-byte
//	                revision (main = the compact revision, sub 0);
//	                storageVersion: "3.7.0"
//	lease           lease ID (8 bytes big-endian) -> leasepb.Lease
//	                {ID=1, TTL=2, RemainingTTL=3}
//	alarm           etcdserverpb.AlarmMember -> empty
//	cluster         clusterVersion: "3.7.0"
//	members         member ID in hex -> JSON {"id", "peerURLs", "isLearner",
//	                "name", "clientURLs"} (membership.Member's encoding)
//	members_removed (empty: strata keeps no removed-member list)
//	auth            authEnabled: one byte, 1 or 0; authRevision: 8 bytes
//	                big-endian
//	authUsers       user name -> authpb.User
//	authRoles       role name -> authpb.Role
//
// A snapshot file is the database's bytes followed by their SHA-256 (32
// bytes), which is what etcd's Maintenance.Snapshot streams: etcdutl finds
// the digest because a bbolt file's size is a multiple of its page size, so
// the whole file's size modulo 512 is 32, and refuses a file whose digest
// does not match. A member's own member/snap/db has no digest.
//
// # What maps onto what
//
// strata's MVCC keeps the same versions etcd keeps (mvcc.ForEachVersion),
// with the same revisions, so the key bucket is a rewrite of strata's
// revision index and history, and an etcd key bucket read back gives strata
// the same versions (mvcc.WriteBatch.SetKeyState). Leases, users, roles and
// alarms are the same records under other encodings. The consistent index
// and term are the applied index and the term of the member that wrote the
// file; etcdutl replaces them, and the member list, when it restores.
package etcddb
