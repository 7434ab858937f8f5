package membership

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/logger"
	"github.com/strata-kv/strata/membership/memberlist"
)

// LoggerStatus asks the logger at endpoint (its published client URL) for
// its status of cluster clusterID.
type LoggerStatus func(ctx context.Context, endpoint string, clusterID uint64) (*logger.ClusterStatus, error)

// HeldReceiver is told how far each logger holds the log
// (node.Node.LoggersHeld).
type HeldReceiver interface {
	LoggersHeld(held map[uint64]uint64)
}

// LoggerTruncate asks the logger at endpoint to truncate cluster
// clusterID's log up to index on behalf of member memberID (a voter).
type LoggerTruncate func(ctx context.Context, endpoint string, clusterID, memberID, index uint64) error

// LoggerWatchConfig is a LoggerWatch's collaborators.
type LoggerWatchConfig struct {
	// ClusterID is the cluster's ID, which the loggers are asked about.
	ClusterID uint64
	// MemberID is this member's ID, in whose name it asks for truncation.
	MemberID uint64
	// Members is the applied member list, where the loggers are found.
	Members Members
	// Node, if not nil, is told how far each logger holds the log
	// (--logger-retention).
	Node HeldReceiver
	// Durable, if not nil, is this member's engine durable index: while
	// this member is a voter, each logger is asked to truncate its log up
	// to it whenever it advanced (--logger-truncate; the logger trims at
	// the index more than half of the voters asked for).
	Durable func() uint64
	// Backed, if not nil with Durable, is the raft index of the newest
	// version in the member's backup target (backup.Service.VersionIndex):
	// the truncation index is the lower of it and Durable's, so that the
	// loggers keep the entries a restore from that version replays (0, no
	// version yet: nothing is asked). An error asks nothing that round.
	Backed func(ctx context.Context) (uint64, error)
	// Interval is how often the loggers are asked. 0: 1 s.
	Interval time.Duration
	// Status and Truncate ask one logger. nil: the logger API
	// (logger.Dial), with one connection per endpoint kept between rounds.
	Status   LoggerStatus
	Truncate LoggerTruncate
	// TLS dials loggers' https client URLs (the member's client-side TLS:
	// tlsconfig.Info.ForwardConfig). nil: the system's CAs.
	TLS *tls.Config
	// Logger logs failed requests (at debug: a logger down is expected).
	Logger *zap.Logger
}

// LoggerWatch talks to the cluster's strata loggers at their published
// client URLs every Interval, for this member:
//
//   - with Node (--logger-retention), it tells the node the committed index
//     each logger holds, as the logger answers Status: how far a follower
//     must keep its log (node's retention rule 2). Only the leader knows a
//     learner's Match; a follower asks the logger itself.
//   - with Durable (--logger-truncate), it sends each logger this voter's
//     Truncate request at its engine's durable index, each time that
//     advanced: the entries this member no longer needs from a logger to
//     recover (seed 003's truncate; the logger trims only when more than
//     half of the voters asked). With Backed (a member with a
//     --backup-target) it asks at most at the newest backup version's
//     index: a point-in-time restore from that version needs the log after
//     it.
//
// A logger that does not answer (down, SIGSTOPped, unreachable) keeps the
// last index it answered: the follower keeps its log for it as the leader
// does. One that never answered holds the follower's truncation entirely.
//
// Concurrency: Run is its only goroutine.
type LoggerWatch struct {
	cfg     LoggerWatchConfig
	clients map[string]*logger.Client // by endpoint; Run's
	held    map[uint64]uint64         // by logger member ID; Run's
	asked   map[uint64]uint64         // the index each logger was asked to truncate at; Run's
}

// backedTimeout bounds a round's read of the backup target's newest
// version: longer than a round, as reaching an s3:// target the first time
// can take seconds.
const backedTimeout = 10 * time.Second

// NewLoggerWatch returns a watch; Run starts it.
func NewLoggerWatch(cfg LoggerWatchConfig) *LoggerWatch {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	w := &LoggerWatch{cfg: cfg, clients: map[string]*logger.Client{}, held: map[uint64]uint64{}, asked: map[uint64]uint64{}}
	if w.cfg.Status == nil {
		w.cfg.Status = w.dialStatus
	}
	if w.cfg.Truncate == nil {
		w.cfg.Truncate = w.dialTruncate
	}
	return w
}

// NewMemberLoggerWatch returns the watch a member's --logger-retention
// (retention: tell node how far each logger holds the log) and
// --logger-truncate (truncate: ask the loggers to truncate at durable's
// index) ask for, or nil when neither is on.
func NewMemberLoggerWatch(cfg LoggerWatchConfig, retention bool, node HeldReceiver, truncate bool, durable func() uint64) *LoggerWatch {
	if retention {
		// A follower learns how far each logger holds the log from the
		// logger itself (node's retention rule 2).
		cfg.Node = node
	}
	if truncate {
		cfg.Durable = durable
	}
	if cfg.Node == nil && cfg.Durable == nil {
		return nil
	}
	return NewLoggerWatch(cfg)
}

// Run asks the loggers every Interval until ctx ends.
func (w *LoggerWatch) Run(ctx context.Context) {
	defer func() {
		for _, c := range w.clients {
			c.Close()
		}
	}()
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		w.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// round asks every logger of the member list once and tells the node; and
// sends the truncation requests due.
func (w *LoggerWatch) round(ctx context.Context) {
	loggers := map[uint64]*pb.Member{}
	voter := false
	for _, m := range w.cfg.Members.Members() {
		if memberlist.IsLogger(m) {
			loggers[m.ID] = m
		}
		if m.ID == w.cfg.MemberID && !m.IsLearner {
			voter = true
		}
	}
	gone := func(id uint64, _ uint64) bool { return loggers[id] == nil }
	maps.DeleteFunc(w.held, gone)
	maps.DeleteFunc(w.asked, gone)
	if w.cfg.Node != nil {
		for id, m := range loggers {
			w.askHeld(ctx, id, m)
		}
		w.cfg.Node.LoggersHeld(w.held)
	}
	if w.cfg.Durable == nil || !voter {
		return
	}
	index := w.cfg.Durable()
	if w.cfg.Backed != nil && len(loggers) > 0 {
		bctx, cancel := context.WithTimeout(ctx, backedTimeout)
		backed, err := w.cfg.Backed(bctx)
		cancel()
		if err != nil {
			w.cfg.Logger.Debug("loggers not asked to truncate: the backup target's newest version is unknown", zap.Error(err))
			return
		}
		index = min(index, backed)
	}
	for id, m := range loggers {
		if index <= w.asked[id] {
			continue
		}
		for _, u := range m.ClientURLs {
			tctx, cancel := context.WithTimeout(ctx, w.cfg.Interval)
			err := w.cfg.Truncate(tctx, u, w.cfg.ClusterID, w.cfg.MemberID, index)
			cancel()
			if err != nil {
				w.cfg.Logger.Debug("cannot ask a logger to truncate", zap.String("logger", fmt.Sprintf("%x", id)),
					zap.String("endpoint", u), zap.Uint64("index", index), zap.Error(err))
				continue
			}
			w.asked[id] = index
			break
		}
	}
}

// askHeld asks one logger how far it holds the log committed.
func (w *LoggerWatch) askHeld(ctx context.Context, id uint64, m *pb.Member) {
	for _, u := range m.ClientURLs {
		sctx, cancel := context.WithTimeout(ctx, w.cfg.Interval)
		st, err := w.cfg.Status(sctx, u, w.cfg.ClusterID)
		cancel()
		if err == nil && st.MemberID != id {
			err = fmt.Errorf("it is member %x of cluster %x, not %x", st.MemberID, w.cfg.ClusterID, id)
		}
		if err != nil {
			w.cfg.Logger.Debug("cannot ask a logger how far it holds the log", zap.String("logger", fmt.Sprintf("%x", id)),
				zap.String("endpoint", u), zap.Error(err))
			continue
		}
		w.held[id] = max(w.held[id], st.CommitIndex)
		return
	}
}

// client returns the logger API client of endpoint, dialled once.
func (w *LoggerWatch) client(endpoint string) (*logger.Client, error) {
	if c, ok := w.clients[endpoint]; ok {
		return c, nil
	}
	c, err := logger.DialTLS(endpoint, w.cfg.TLS)
	if err != nil {
		return nil, err
	}
	w.clients[endpoint] = c
	return c, nil
}

// dialTruncate is the default LoggerTruncate: the logger API.
func (w *LoggerWatch) dialTruncate(ctx context.Context, endpoint string, clusterID, memberID, index uint64) error {
	c, err := w.client(endpoint)
	if err != nil {
		return err
	}
	_, err = c.Truncate(ctx, clusterID, memberID, index)
	return err
}

// dialStatus is the default LoggerStatus: the logger API over a connection
// kept per endpoint.
func (w *LoggerWatch) dialStatus(ctx context.Context, endpoint string, clusterID uint64) (*logger.ClusterStatus, error) {
	c, err := w.client(endpoint)
	if err != nil {
		return nil, err
	}
	sts, err := c.Status(ctx, clusterID)
	if err != nil {
		return nil, err
	}
	if len(sts) != 1 {
		return nil, fmt.Errorf("logger %s answered %d statuses for cluster %x", endpoint, len(sts), clusterID)
	}
	return sts[0], nil
}
