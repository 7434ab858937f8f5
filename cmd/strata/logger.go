package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"go.etcd.io/raft/v3/raftpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/datadir"
	lg "github.com/strata-kv/strata/logger"
	"github.com/strata-kv/strata/tlsconfig"
)

const loggerUsage = `usage:
  strata logger --data-dir DIR --listen-peer-urls URLS --advertise-peer-urls URLS --listen-client-urls URLS
                                  run a logger: one raft learner for every cluster joined in DIR
  strata logger join --data-dir DIR --name NAME --advertise-peer-urls URLS --endpoints URLS [--cluster-id ID]
                                  record a cluster in DIR (the running logger serves it within a second)
  strata logger leave --data-dir DIR --cluster-id ID
                                  delete a cluster from DIR, the logger stopped (after etcdctl member remove)
  strata logger status  --endpoint URL [--cluster ID] [--json]
                                  first and last index held, commit, bytes, lag, gaps, truncation, per cluster
  strata logger recover --endpoint URL --cluster ID --first N --last M
                                  print the committed entries [N, M] as JSON, one per line
                                  (index, term, type, data in base64, as strata inspect log --entries)
  strata logger truncate --endpoint URL --cluster ID --member ID --index N
                                  member ID (a voter) asks to drop the entries <= N; the logger trims at the
                                  lowest index more than half of the voters asked for, never before

A logger keeps the raft logs of strata clusters as a learner that never votes and never applies
(docs/logger.md). Add it to a cluster first, then join:

  etcdctl --endpoints http://m1:2379 member add L1 --learner --peer-urls=http://logger1:2480
  strata logger join --data-dir /var/lib/strata-logger --name L1 \
      --advertise-peer-urls http://logger1:2480 --endpoints http://m1:2379

The logger publishes its name and client URLs (with the path /strata-logger, its mark) in each cluster's
member list; etcdctl member list shows it as a learner, and member promote of it is refused. Its client URLs
also serve GET /metrics (per cluster, strata_logger_*) and GET /health (etcd's JSON).

With --log-compaction (and --log-compaction-batch N, --history latest, as members take them) the logger
rewrites each cluster's committed log as compacted batches, one record per key state per batch; Recover
then streams those batches for the compacted range (strata restore --logger replays them).

https URLs take etcd's TLS flags as a member does: --cert-file, --key-file, --trusted-ca-file,
--client-cert-auth for the client URLs, their --peer-* twins for the peer URLs, --auto-tls and --peer-auto-tls
(certificates generated in <data-dir>/fixtures), --cipher-suites, --tls-min-version and --tls-max-version.
The subcommands that dial (join, status, recover, truncate) take etcdctl's --cacert, --cert and --key for
https endpoints.

IDs are hexadecimal, as etcdctl prints them.`

// runLogger is `strata logger`: run a logger, or one of its subcommands.
func runLogger(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "join":
			return runLoggerJoin(args[1:], stdout, stderr)
		case "leave":
			return runLoggerLeave(args[1:], stdout, stderr)
		case "status":
			return runLoggerStatus(args[1:], stdout, stderr)
		case "recover":
			return runLoggerRecover(args[1:], stdout, stderr)
		case "truncate":
			return runLoggerTruncate(args[1:], stdout, stderr)
		case "help":
			fmt.Fprintln(stdout, loggerUsage)
			return 0
		}
	}
	return runLoggerServe(args, stderr)
}

// loggerFlagSet returns a flag set whose --help prints the logger's usage
// before the flags.
func loggerFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, loggerUsage)
		fmt.Fprintf(stderr, "\nflags of %s:\n", name)
		fs.PrintDefaults()
	}
	return fs
}

// parseLoggerFlags parses args; -1 means go on, else the exit code.
func parseLoggerFlags(fs *flag.FlagSet, args []string, stderr io.Writer) int {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q (flags start with --)\n", fs.Name(), fs.Args())
		return 2
	}
	return -1
}

func runLoggerServe(args []string, stderr io.Writer) int {
	fs := loggerFlagSet("strata logger", stderr)
	dataDir := fs.String("data-dir", "", "Path to the logger's data directory: a LOCK and one directory per cluster joined. Required.")
	listenPeer := fs.String("listen-peer-urls", "http://127.0.0.1:2480", "List of URLs to listen on for peer traffic, of every cluster (streams are routed by the cluster ID they name).")
	advertisePeer := fs.String("advertise-peer-urls", "http://127.0.0.1:2480", "List of the logger's peer URLs as the clusters know them (etcdctl member add --peer-urls).")
	listenClient := fs.String("listen-client-urls", "http://127.0.0.1:2479", "List of URLs to listen on for the logger API (strata logger status|recover).")
	advertiseClient := fs.String("advertise-client-urls", "", "List of the logger's client URLs to publish in each cluster's member list, where they appear with the path /strata-logger (the mark of a logger). Default: --listen-client-urls.")
	logLevel := fs.String("log-level", "info", "Configures log level. Only supports debug, info, warn, error, panic, or fatal.")
	var compaction logCompactionFlags
	compaction.register(fs)
	var security tlsFlags // etcd's, as a member takes them
	security.register(fs)
	if code := parseLoggerFlags(fs, args, stderr); code >= 0 {
		return code
	}
	if *dataDir == "" {
		fmt.Fprintln(stderr, "strata logger: --data-dir is required")
		return 2
	}
	lc, err := compaction.config()
	if err != nil {
		fmt.Fprintf(stderr, "strata logger: %v\n", err)
		return 2
	}
	zl, err := newLogger(*logLevel, "zap", "default", "json", nil)
	if err != nil {
		fmt.Fprintf(stderr, "strata logger: %v\n", err)
		return 2
	}
	defer func() { _ = zl.Sync() }()
	clientSide, peerSide := security.sides()
	tlsCfg, err := security.config(clientSide, peerSide, *dataDir, splitURLs(*listenClient), splitURLs(*listenPeer), zl)
	if err != nil {
		fmt.Fprintf(stderr, "strata logger: %v\n", err)
		return 2
	}
	l, err := lg.Open(lg.Config{
		LogCompaction:       lc,
		TLS:                 tlsCfg,
		SegmentSize:         lc.SegmentSize,
		DataDir:             *dataDir,
		ListenPeerURLs:      splitURLs(*listenPeer),
		AdvertisePeerURLs:   splitURLs(*advertisePeer),
		ListenClientURLs:    splitURLs(*listenClient),
		Logger:              zl,
		AdvertiseClientURLs: splitURLs(*advertiseClient),
	})
	if err != nil {
		fmt.Fprintf(stderr, "strata logger: %v\n", err)
		return 1
	}
	if err := l.Start(context.Background()); err != nil {
		_ = l.Close()
		fmt.Fprintf(stderr, "strata logger: %v\n", err)
		return 1
	}
	zl.Info("ready to serve the logger API", zap.Strings("listen-client-urls", splitURLs(*listenClient)))
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	select {
	case sig := <-sigc:
		zl.Info("stopping on signal", zap.String("signal", sig.String()))
		if err := l.Close(); err != nil {
			zl.Error("stop", zap.Error(err))
			return 1
		}
		return 0
	case err := <-l.Failed():
		_ = l.Close()
		fmt.Fprintf(stderr, "strata logger: fatal: %v\n", err)
		return 1
	}
}

func runLoggerJoin(args []string, stdout, stderr io.Writer) int {
	fs := loggerFlagSet("strata logger join", stderr)
	dataDir := fs.String("data-dir", "", "The logger's data directory. Required.")
	name := fs.String("name", "", "The name the logger was added under (etcdctl member add NAME --learner).")
	advertisePeer := fs.String("advertise-peer-urls", "http://127.0.0.1:2480", "The logger's peer URLs, as given to etcdctl member add --peer-urls: they find the logger in the member list.")
	endpoints := fs.String("endpoints", "", "Client URLs of the cluster's members, tried in turn. Required.")
	timeout := fs.Duration("dial-timeout", 5*time.Second, "How long to wait for each endpoint's answer.")
	clusterHex := fs.String("cluster-id", "", "The cluster ID (hex) the operator means to join: endpoints of another cluster are refused. Default: whichever they answer for.")
	initialCluster := fs.String("initial-cluster", "", "With --initial-cluster-token: the cluster's --initial-cluster as its members bootstrapped with it; the two name the cluster ID to join, as --cluster-id does.")
	token := fs.String("initial-cluster-token", "", "With --initial-cluster: the cluster's --initial-cluster-token.")
	var dial loggerDialTLSFlags
	dial.register(fs)
	if code := parseLoggerFlags(fs, args, stderr); code >= 0 {
		return code
	}
	joinTLS, err := dial.config()
	if err != nil {
		fmt.Fprintf(stderr, "strata logger join: %v\n", err)
		return 2
	}
	if *dataDir == "" || *endpoints == "" {
		fmt.Fprintln(stderr, "strata logger join: --data-dir and --endpoints are required")
		return 2
	}
	var cid uint64
	if *clusterHex != "" {
		var err error
		if cid, err = parseHexID("cluster-id", *clusterHex); err != nil {
			fmt.Fprintf(stderr, "strata logger join: %v\n", err)
			return 2
		}
	}
	var fromToken uint64 // the cluster ID --initial-cluster and --initial-cluster-token name
	if *initialCluster != "" || *token != "" {
		if *initialCluster == "" || *token == "" {
			fmt.Fprintln(stderr, "strata logger join: --initial-cluster and --initial-cluster-token go together")
			return 2
		}
		if fromToken, err = bootstrapClusterID(*initialCluster, *token); err != nil {
			fmt.Fprintf(stderr, "strata logger join: %v\n", err)
			return 2
		}
		if cid != 0 && cid != fromToken {
			fmt.Fprintf(stderr, "strata logger join: --cluster-id %x is not cluster %x, which --initial-cluster and --initial-cluster-token name\n", cid, fromToken)
			return 2
		}
		cid = fromToken
	}
	rec, err := lg.Join(context.Background(), lg.JoinConfig{
		DataDir: *dataDir, Name: *name, Endpoints: splitURLs(*endpoints),
		AdvertisePeerURLs: splitURLs(*advertisePeer), Timeout: *timeout, ClusterID: cid, TLS: joinTLS,
	})
	if err != nil {
		if fromToken != 0 && errors.Is(err, lg.ErrWrongCluster) {
			err = fmt.Errorf("%w (cluster %x is the one --initial-cluster with --initial-cluster-token %q bootstraps: a wrong token or initial cluster)", err, fromToken, *token)
		}
		fmt.Fprintf(stderr, "strata logger join: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "joined cluster %x as learner %x (%d other members); the logger serves it within a second\n",
		rec.ClusterID, rec.MemberID, len(rec.Peers))
	return 0
}

func runLoggerLeave(args []string, stdout, stderr io.Writer) int {
	fs := loggerFlagSet("strata logger leave", stderr)
	dataDir := fs.String("data-dir", "", "The logger's data directory. Required; the logger must be stopped.")
	clusterHex := fs.String("cluster-id", "", "The cluster ID (hex) to delete from the data directory, its log included. Required.")
	if code := parseLoggerFlags(fs, args, stderr); code >= 0 {
		return code
	}
	if *dataDir == "" || *clusterHex == "" {
		fmt.Fprintln(stderr, "strata logger leave: --data-dir and --cluster-id are required")
		return 2
	}
	cid, err := parseHexID("cluster-id", *clusterHex)
	if err != nil {
		fmt.Fprintf(stderr, "strata logger leave: %v\n", err)
		return 2
	}
	if err := lg.Leave(nil, *dataDir, cid); err != nil {
		fmt.Fprintf(stderr, "strata logger leave: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "left cluster %x: its log is deleted from %s\n", cid, *dataDir)
	return 0
}

func parseHexID(what, s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("--%s %q: want a hexadecimal ID", what, s)
	}
	return id, nil
}

func runLoggerStatus(args []string, stdout, stderr io.Writer) int {
	fs := loggerFlagSet("strata logger status", stderr)
	endpoint := fs.String("endpoint", "http://127.0.0.1:2479", "The logger's client URL.")
	clusterHex := fs.String("cluster", "", "A cluster ID (hex); default every cluster the logger serves.")
	asJSON := fs.Bool("json", false, "Print JSON instead of a table.")
	var dial loggerDialTLSFlags
	dial.register(fs)
	if code := parseLoggerFlags(fs, args, stderr); code >= 0 {
		return code
	}
	var cid uint64
	if *clusterHex != "" {
		var err error
		if cid, err = parseHexID("cluster", *clusterHex); err != nil {
			fmt.Fprintf(stderr, "strata logger status: %v\n", err)
			return 2
		}
	}
	c, err := dial.dialLogger(*endpoint)
	if err != nil {
		fmt.Fprintf(stderr, "strata logger status: %v\n", err)
		return 1
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sts, err := c.Status(ctx, cid)
	if err != nil {
		fmt.Fprintf(stderr, "strata logger status: %v\n", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, st := range sts {
			_ = enc.Encode(statusJSON(st))
		}
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tMEMBER\tFIRST\tLAST\tCOMMIT\tBYTES\tLEADER COMMIT\tLAG\tGAP\tTRUNCATION\tCOMPACTED")
	for _, st := range sts {
		gap := "none"
		if n := len(st.Gaps); n > 0 {
			gap = fmt.Sprintf("up to %d (%d recorded)", st.Gaps[n-1].SnapshotIndex, n)
		}
		trunc := "none asked"
		if len(st.Truncations) > 0 {
			trunc = fmt.Sprintf("up to %d (%d of the voters asked)", st.TruncationPoint, len(st.Truncations))
		}
		compacted := st.Compaction
		if st.CompactedBatches > 0 {
			compacted = fmt.Sprintf("%d-%d: %d entries in %d batches, %d records, %d bytes (%s)", st.CompactedFirst, st.CompactedLast,
				st.CompactedEntries, st.CompactedBatches, st.CompactedRecords, st.CompactedBytes, st.Compaction)
		}
		fmt.Fprintf(tw, "%x\t%x\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", st.ClusterID, st.MemberID, st.FirstIndex, st.LastIndex,
			st.CommitIndex, st.Bytes, st.LeaderCommit, st.Lag, gap, trunc, compacted)
	}
	_ = tw.Flush()
	return 0
}

// clusterStatusJSON is `strata logger status --json`'s line per cluster.
type clusterStatusJSON struct {
	ClusterID    string   `json:"cluster_id"`
	MemberID     string   `json:"member_id"`
	FirstIndex   uint64   `json:"first_index"`
	LastIndex    uint64   `json:"last_index"`
	CommitIndex  uint64   `json:"commit_index"`
	Bytes        uint64   `json:"bytes"`
	LeaderCommit uint64   `json:"leader_commit"`
	Lag          uint64   `json:"lag"`
	Leader       string   `json:"leader"`
	Gaps         []lg.Gap `json:"gaps"`
	// Truncations are the voters' requests; TruncationPoint what they
	// let go.
	Truncations     []lg.Truncation `json:"truncations"`
	TruncationPoint uint64          `json:"truncation_point"`
	// Log compaction: the entries the compacted batches stand for, how
	// many batches, their bytes and records; "off", "on" or "stopped: why".
	Compaction       string `json:"compaction"`
	CompactedFirst   uint64 `json:"compacted_first,omitempty"`
	CompactedLast    uint64 `json:"compacted_last,omitempty"`
	CompactedBatches uint64 `json:"compacted_batches"`
	CompactedBytes   uint64 `json:"compacted_bytes"`
	CompactedEntries uint64 `json:"compacted_entries"`
	CompactedRecords uint64 `json:"compacted_records"`
}

func statusJSON(st *lg.ClusterStatus) clusterStatusJSON {
	return clusterStatusJSON{
		ClusterID: fmt.Sprintf("%x", st.ClusterID), MemberID: fmt.Sprintf("%x", st.MemberID),
		FirstIndex: st.FirstIndex, LastIndex: st.LastIndex, CommitIndex: st.CommitIndex, Bytes: st.Bytes,
		LeaderCommit: st.LeaderCommit, Lag: st.Lag, Leader: fmt.Sprintf("%x", st.Leader), Gaps: st.Gaps,
		Truncations: st.Truncations, TruncationPoint: st.TruncationPoint,
		Compaction: st.Compaction, CompactedFirst: st.CompactedFirst, CompactedLast: st.CompactedLast,
		CompactedBatches: st.CompactedBatches, CompactedBytes: st.CompactedBytes,
		CompactedEntries: st.CompactedEntries, CompactedRecords: st.CompactedRecords,
	}
}

func runLoggerRecover(args []string, stdout, stderr io.Writer) int {
	fs := loggerFlagSet("strata logger recover", stderr)
	endpoint := fs.String("endpoint", "http://127.0.0.1:2479", "The logger's client URL.")
	clusterHex := fs.String("cluster", "", "The cluster ID (hex). Required.")
	first := fs.Uint64("first", 0, "The first index of the closed interval to print. Required.")
	last := fs.Uint64("last", 0, "The last index of the closed interval to print. Required.")
	var dial loggerDialTLSFlags
	dial.register(fs)
	if code := parseLoggerFlags(fs, args, stderr); code >= 0 {
		return code
	}
	cid, err := parseHexID("cluster", *clusterHex)
	if err != nil {
		fmt.Fprintf(stderr, "strata logger recover: %v\n", err)
		return 2
	}
	c, err := dial.dialLogger(*endpoint)
	if err != nil {
		fmt.Fprintf(stderr, "strata logger recover: %v\n", err)
		return 1
	}
	defer c.Close()
	enc := json.NewEncoder(stdout)
	err = c.Recover(context.Background(), cid, *first, *last, func(ents []*raftpb.Entry) error {
		for _, e := range ents {
			// One line per entry, in the shape of strata inspect log
			// --entries' entries.
			if err := enc.Encode(exportedEntry{Index: e.GetIndex(), Term: e.GetTerm(), Type: int32(e.GetType()), Data: e.GetData()}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "strata logger recover: %v\n", err)
		return 1
	}
	return 0
}

func runLoggerTruncate(args []string, stdout, stderr io.Writer) int {
	fs := loggerFlagSet("strata logger truncate", stderr)
	endpoint := fs.String("endpoint", "http://127.0.0.1:2479", "The logger's client URL.")
	clusterHex := fs.String("cluster", "", "The cluster ID (hex). Required.")
	memberHex := fs.String("member", "", "The member (hex ID, a voter of the cluster) on whose behalf to ask. Required.")
	index := fs.Uint64("index", 0, "Drop the entries up to and including this index, once more than half of the voters asked. Required.")
	var dial loggerDialTLSFlags
	dial.register(fs)
	if code := parseLoggerFlags(fs, args, stderr); code >= 0 {
		return code
	}
	cid, err := parseHexID("cluster", *clusterHex)
	var mid uint64
	if err == nil {
		mid, err = parseHexID("member", *memberHex)
	}
	if err != nil {
		fmt.Fprintf(stderr, "strata logger truncate: %v\n", err)
		return 2
	}
	c, err := dial.dialLogger(*endpoint)
	if err != nil {
		fmt.Fprintf(stderr, "strata logger truncate: %v\n", err)
		return 1
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.Truncate(ctx, cid, mid, *index)
	if err != nil {
		fmt.Fprintf(stderr, "strata logger truncate: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "recorded; the truncation point is %d (%d of the voters asked)\n", resp.TruncationPoint, len(resp.Truncations))
	return 0
}

// bootstrapClusterID is the cluster ID the members of initialCluster
// (etcd's name=peerURL,...) take at bootstrap with token
// (datadir.BootstrapID).
func bootstrapClusterID(initialCluster, token string) (uint64, error) {
	cluster, err := parseInitialCluster(initialCluster)
	if err != nil {
		return 0, err
	}
	var anyName string
	for name := range cluster {
		anyName = name // the cluster ID is every member's alike
		break
	}
	id, err := datadir.BootstrapID(anyName, cluster, token)
	if err != nil {
		return 0, err
	}
	return id.ClusterID, nil
}

// loggerDialTLSFlags are etcdctl's --cacert, --cert and --key, for dialling
// https URLs of a logger (or, for join, of the cluster's members).
type loggerDialTLSFlags struct{ cacert, cert, key string }

func (d *loggerDialTLSFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.cacert, "cacert", "", "Verify certificates of TLS-enabled secure servers using this CA bundle (https URLs; default the system's CAs).")
	fs.StringVar(&d.cert, "cert", "", "Identify secure client using this TLS certificate file (for a server with --client-cert-auth).")
	fs.StringVar(&d.key, "key", "", "Identify secure client using this TLS key file.")
}

// config is the TLS configuration to dial with; nil if no flag is set.
func (d *loggerDialTLSFlags) config() (*tls.Config, error) {
	if d.cacert == "" && d.cert == "" && d.key == "" {
		return nil, nil
	}
	if (d.cert == "") != (d.key == "") {
		return nil, errors.New("--cert and --key go together")
	}
	return tlsconfig.Info{TrustedCAFile: d.cacert, ClientCertFile: d.cert, ClientKeyFile: d.key}.ClientConfig()
}

// dialLogger dials endpoint with the TLS flags.
func (d *loggerDialTLSFlags) dialLogger(endpoint string) (*lg.Client, error) {
	cfg, err := d.config()
	if err != nil {
		return nil, err
	}
	return lg.DialTLS(endpoint, cfg)
}
