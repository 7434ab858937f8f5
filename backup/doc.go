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
// sections 2.3 and 3.5). Such a files version is complete on its own:
// restoring one needs no chain of deltas, and deleting an old version only
// frees the files no kept version names. A log version (below) needs one
// files version and the log after it, never a chain.
//
// # Log versions
//
// Between two versions Pebble's compactions rewrite tables far beyond what
// changed (docs/bench/backup.md: 22-84 MB of tables for a 2.1 MB change),
// so a files version after a small change costs far more than the change.
// The raft log since the last version is about the change itself. A
// version of a running member is therefore a log version when its Policy
// allows it and the member's raft log still holds every entry the target
// lacks: it names a files version, its base, and the archived log objects
// from the base's index + 1 to its own index (the same objects
// point-in-time restore reads), and uploads only the entries the target
// lacks. Restoring it downloads the base and replays the log; Policy
// bounds that replay (LogRatio: the log at most that fraction of the
// base's bytes; FullEvery: a files version every N versions). A log
// version is never based on another log version, so a restore reads one
// set of files and one run of log. Its index, revision and conf state are
// still read from a checkpoint taken at that moment (flushed and
// hard-linked, not uploaded), so its manifest says exactly what a files
// version of the same moment would, and a restore checks that the replay
// reached that revision. When the member's log no longer holds the entries
// (truncated after a snapshot, or replaced by log compaction's batches,
// which the archive cannot carry) the version is a files version.
//
// # Engines
//
// Every engine (--engine) is backed up the same way: its Checkpoint is a
// directory of files, and a version uploads the ones the target lacks.
// Pebble's tables, and appendlog's and hybridlog's sealed data files, never
// change, so a version after a small change costs the new files; bbolt
// rewrites its one file in place, so each of its files versions costs the
// whole file. A files version of an engine other than Pebble names it in
// its manifest (FORMAT.md, "Engines"), and a restore reads the files with
// that engine and builds the new data directory on any.
//
// The target layout, the manifest and its checksum are in FORMAT.md, the
// only place they are described; the invariants the writer keeps are
// numbered there and on Backuper.
//
// # Using it
//
//	t, err := backup.OpenTarget(ctx, "s3://bucket/strata", backup.TargetOptions{})
//	b := backup.New(backup.Config{Engine: eng, Target: t, ID: id, Term: log.Term, StagingDir: dir})
//	m, err := b.Create(ctx)                    // a new version (files or log, as Config.Policy says)
//	m, err = b.CreateKind(ctx, backup.KindLog) // a log version, or ErrNoLogVersion saying why not
//	err = b.Run(ctx, time.Hour, backup.Retention{KeepLast: 24}) // continuously
//	list, err := backup.List(ctx, t)           // every version, oldest first
//	rep, err := backup.Verify(ctx, t, m.Version) // every file (and a log version's base and log objects) against its hash
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
// A running member opens one Service (OpenService), which hands its raft
// log to its Backupers (log versions) and: it stages checkpoints
// in a directory on the engine's file system (so that Pebble hard-links
// the tables), runs the continuous mode on the leader only (Run), serves
// the gRPC method CreateMethod on the member's client URLs (Register;
// CreateRemote is its client), feeds the metrics (NewCollector over
// Stats) and is closed before the engine (Close).
//
// CreateOffline backs up the data directory of a stopped member: it opens
// the engine itself and reads the term of the applied entry from the raft
// log without changing either. Its versions are files versions.
//
// # Concurrency
//
// A Backuper's Create calls are serialised by the Backuper; Create may run
// alongside the applier (the checkpoint is consistent by itself). One
// target has one writer at a time: Create and Prune must not run at the
// same time against the same target from different processes, since prune
// could delete a file (or log object) that a concurrent Create found
// present and did not upload. Readers (List, Verify, Restore) may run at
// any time: they see only whole manifests and, while no prune runs, every
// file and log object those name, and a log version's base.
package backup
