// Package e2e tests strata the way its users meet it: the real binary as a
// subprocess on loopback ports, driven with clientv3, raw gRPC and etcdctl,
// and compared answer by answer with the real etcd started with the same
// flags.
//
// TestMain builds strata (from the repository root) and etcd plus etcdctl
// (from tools/) once into a temp dir; the process harness lives in
// internal/testutil. The suites:
//
//   - conformance: one ordered table of KV, Txn, Lease and Compact requests
//     run against a fresh strata and a fresh etcd; responses are compared
//     field by field with cluster_id, member_id and raft_term normalised,
//     errors by gRPC code and message.
//   - etcdctl: the commands a user types, with the output they see.
//   - crash: concurrent writers while the server is SIGKILLed from outside
//     or by a failpoint inside; every acknowledged put must be readable at
//     the revision it was acknowledged with, and the revision never goes
//     backwards.
//   - log compaction under physical compaction (issue 10, finding 1):
//     puts, deletes and txns over 2,000 keys with --log-compaction-batch
//     while a client compacts physically every 300 ms; after each SIGKILL
//     and restart that replays compacted batches, every acknowledged write
//     must be there (deletes absent), on one member and on three (HashKV
//     equal).
//   - bad input: refused requests and refused start-ups, each with a clear
//     error and nothing stored lost.
//   - log damage: a torn tail is truncated at start; a flipped byte in the
//     middle of the log stops start-up with the file and offset named.
//   - backups (backup*_test.go, docs/backup.md): versions of a stopped and
//     of a running member, continuous on the leader, restored and compared
//     with what the live member answered, to a version or to a revision;
//     on file://, on gofakes3 (tools/cmd/s3server) and on MinIO
//     (tools/minio, built on first use; STRATA_E2E_MINIO names a prebuilt
//     binary), with the member, the CLI or MinIO killed -9 mid-upload.
//
// Tests that only make sense against etcd's behaviour run against both
// binaries, so that a failure on etcd means the test is wrong, and a
// failure on strata alone means strata is.
//
// Engines: STRATA_E2E_ENGINE=bbolt (or appendlog, hybridlog) starts every
// strata member, and runs every `strata restore`, on that engine
// (internal/testutil.EngineEnv; default pebble), so the whole suite runs on
// each engine; `make e2e-engines` runs it on the three besides Pebble.
// Tests of what only one engine does skip elsewhere with the reason
// (testutil.RequireEngine: the recovery path of compacted batches, which
// appendlog never reaches);
// TestEveryEngine, TestKeySizeOnEveryEngine and TestBackupEveryEngine name
// their engines themselves. docs/engines.md lists what passed on which engine.
//
//	go test ./e2e/ -run TestConformance -v
package e2e
