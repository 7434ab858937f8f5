package membership

import (
	"context"
	"fmt"
	"maps"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/logger"
)

// LoggerStatus asks the logger at endpoint (its published client URL) for
// its status of cluster clusterID.
type LoggerStatus func(ctx context.Context, endpoint string, clusterID uint64) (*logger.ClusterStatus, error)

// HeldReceiver is told how far each logger holds the log
// (node.Node.LoggersHeld).
type HeldReceiver interface {
	LoggersHeld(held map[uint64]uint64)
}

// LoggerWatchConfig is a LoggerWatch's collaborators.
type LoggerWatchConfig struct {
	ClusterID uint64
	Members   Members
	Node      HeldReceiver
	// Interval is how often the loggers are asked. 0: 1 s.
	Interval time.Duration
	// Status asks one logger. nil: the logger API (logger.Dial), with one
	// connection per endpoint kept between rounds.
	Status LoggerStatus
	Logger *zap.Logger
}

// LoggerWatch tells a member's node, every Interval, the committed index
// each strata logger of the cluster holds, as the logger answers Status at
// its published client URL: how far a follower must keep its log under
// --logger-retention (node's retention rule 2). Only the leader knows a
// learner's Match; a follower asks the logger itself.
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
}

// NewLoggerWatch returns a watch; Run starts it.
func NewLoggerWatch(cfg LoggerWatchConfig) *LoggerWatch {
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	w := &LoggerWatch{cfg: cfg, clients: map[string]*logger.Client{}, held: map[uint64]uint64{}}
	if w.cfg.Status == nil {
		w.cfg.Status = w.dialStatus
	}
	return w
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

// round asks every logger of the member list once and tells the node.
func (w *LoggerWatch) round(ctx context.Context) {
	loggers := map[uint64]*pb.Member{}
	for _, m := range w.cfg.Members.Members() {
		if logger.IsLoggerMember(m) {
			loggers[m.ID] = m
		}
	}
	maps.DeleteFunc(w.held, func(id uint64, _ uint64) bool { return loggers[id] == nil })
	for id, m := range loggers {
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
			break
		}
	}
	w.cfg.Node.LoggersHeld(w.held)
}

// dialStatus is the default LoggerStatus: the logger API over a connection
// kept per endpoint.
func (w *LoggerWatch) dialStatus(ctx context.Context, endpoint string, clusterID uint64) (*logger.ClusterStatus, error) {
	c, ok := w.clients[endpoint]
	if !ok {
		var err error
		if c, err = logger.Dial(endpoint); err != nil {
			return nil, err
		}
		w.clients[endpoint] = c
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
