// Package backup takes incremental backups of a strata member's engine
// files to a target (a directory or an S3-compatible bucket) and restores
// any kept version of them into a new data directory.
//
// # The idea
//
// Pebble is an LSM tree: once written, its table files never change. A
// consistent checkpoint of the engine is a list of files, most of which
// the previous checkpoint already had. So a backup need only upload the
// files the target lacks, named by their content hash, and then one small
// manifest naming every file of the version (seed 004, Gavalas,
// "Incremental Snapshotting in Transactional Dataflow SFaaS Systems",
// sections 2.3 and 3.5). Each version is complete on its own: restoring
// one needs no chain of deltas, and deleting an old version only frees the
// files no kept version names.
//
// The target layout, the manifest and its checksum are in FORMAT.md, the
// only place they are described.
//
// # Using it
//
//	t, err := backup.OpenTarget(ctx, "s3://bucket/strata", backup.TargetOptions{})
//	b := backup.New(backup.Config{Engine: eng, Target: t, ID: id, Term: log.Term, StagingDir: dir})
//	m, err := b.Create(ctx)                    // a new version
//	err = b.Run(ctx, time.Hour, backup.Retention{KeepLast: 24}) // continuously
//	list, err := backup.List(ctx, t)           // every version, oldest first
//	rep, err := backup.Verify(ctx, t, m.Version) // every file against its hash
//	res, err := backup.Restore(ctx, t, backup.RestoreConfig{...}) // a new data dir
//	pr, err := backup.Prune(ctx, t, backup.Retention{KeepLast: 7})
//	pr, err = backup.Prune(ctx, t, backup.Retention{Exponential: true}) // hours, days, weeks
//
// Point-in-time restore (docs/backup.md): the continuous mode archives
// the applied raft log (ArchiveLog) with time samples of the applied index
// (Sampler); RestoreConfig.ToRevision and RestoreConfig.ToTime restore a
// version and replay the archived log up to a revision, or up to the last
// entry a sample shows applied by a wall-clock time.
//
// A running member opens one Service (OpenService): it stages checkpoints
// in a directory on the engine's file system (so that Pebble hard-links
// the tables), runs the continuous mode on the leader only (Run), serves
// the gRPC method CreateMethod on the member's client URLs (Register;
// CreateRemote is its client), feeds the metrics (NewCollector over
// Stats) and is closed before the engine (Close).
//
// CreateOffline backs up the data directory of a stopped member: it opens
// the engine itself and reads the term of the applied entry from the raft
// log without changing either.
//
// # Concurrency
//
// A Backuper's Create calls are serialised by the Backuper; Create may run
// alongside the applier (the checkpoint is consistent by itself). One
// target has one writer at a time: Create and Prune must not run at the
// same time against the same target from different processes, since prune
// could delete a file that a concurrent Create found present and did not
// upload. Readers (List, Verify, Restore) may run at any time: they see
// only whole manifests and, while no prune runs, every file those name.
package backup
