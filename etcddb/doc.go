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
//	members_removed member ID in hex -> "removed"
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
//
// # etcd's write-ahead log (member/wal)
//
// etcd commits its bbolt database in batches (every 100 ms or 10,000
// writes by default), so a member/snap/db holds the state only up to its
// meta bucket's consistent_index; what a member acknowledged after that
// is in its WAL. ReadWAL reads the WAL with none of etcd's code, from the
// format etcd 3.x writes (server/storage/wal):
//
//   - The WAL is a directory of files named %016x-%016x.wal: a sequence
//     number, continuous from file to file, and the raft index the file's
//     first entry follows. Files are preallocated (64 MB of zeros) and
//     written from the start; a zero length field is the end of a file's
//     records.
//   - A file is a sequence of frames. A frame is an 8-byte little-endian
//     length field, the record's bytes, and padding to a multiple of 8
//     bytes: the low 56 bits of the field are the record's length; if its
//     top bit is set, the low 3 bits of its top byte are the padding's
//     length.
//   - A record is the protobuf walpb.Record {type = 1 (int64), crc = 2
//     (uint32), data = 3 (bytes)}. Types: 1 metadata (etcdserverpb.Metadata:
//     node and cluster ID), 2 entry (raftpb.Entry), 3 state
//     (raftpb.HardState: term, vote, commit), 4 crc, 5 snapshot
//     (walpb.Snapshot {index = 1, term = 2, conf_state = 3}: a raft
//     snapshot was taken at that index).
//   - CRC chaining: every record but a crc record carries the CRC-32C
//     (Castagnoli) of the data of every record before it and its own,
//     continued from the value of the last crc record (crc32.Update over
//     the data, record after record). Each file starts with a crc record
//     holding the running CRC of the file before it (0 in the first file
//     ever written; a file whose predecessors were purged starts from the
//     value it holds), then a metadata record, and then a state or, in
//     the first file, a snapshot record.
//   - Entries may be written again: a new leader's entries overwrite an
//     uncommitted tail, so an entry at index i discards every entry at i
//     and after read so far. Entries past the last HardState's commit were
//     never acknowledged to a client.
//   - The last record of the last file may be torn (written partially when
//     the member died: not fsynced, so never acknowledged): etcd's files are
//     preallocated, so a torn record has a 512-byte sector of zeros, and
//     etcd reads up to it and repairs the file. ReadWAL stops there too. A
//     record that fails its CRC anywhere else, a record that runs past the
//     end of its file (a truncated file), a gap in the files' sequence or in
//     the entries' indexes is corruption, and ReadWAL refuses the WAL in
//     etcd's words ("wal: crc mismatch", "unexpected EOF", "wal: file not
//     found", "wal: slice bounds out of range").
package etcddb
