package main

import (
	"context"
	"errors"
	"flag"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/strata-kv/strata/discovery"
	"github.com/strata-kv/strata/member"
)

// discoveryFlags are etcd's v3 discovery flags (--discovery-token,
// --discovery-endpoints and the client's --discovery-*): with a token and
// endpoints, the member finds its initial cluster in the discovery
// service (package discovery) instead of --initial-cluster.
type discoveryFlags struct {
	token, endpoints                string
	dialTimeout, requestTimeout     time.Duration
	keepAliveTime, keepAliveTimeout time.Duration
	insecureTransport, skipVerify   bool
	cert, key, cacert               string
	user, password                  string
}

// errConflictBootstrapFlags is etcd's refusal of --initial-cluster beside
// --discovery-endpoints (embed.ErrConflictBootstrapFlags).
var errConflictBootstrapFlags = errors.New(`multiple discovery or bootstrap flags are set. Choose one of "initial-cluster", "discovery-endpoints" or "discovery-srv"`)

func (d *discoveryFlags) register(fs *flag.FlagSet) {
	const impl = " strata: implemented (package discovery)."
	fs.StringVar(&d.token, "discovery-token", "", "V3 discovery: discovery token for the etcd cluster to be bootstrapped. strata: implemented: with --discovery-endpoints, the member registers under the token and bootstraps the cluster of the first members to register (the token is then the cluster token); not with --initial-cluster.")
	fs.StringVar(&d.endpoints, "discovery-endpoints", "", "V3 discovery: List of gRPC endpoints of the discovery service."+impl)
	fs.DurationVar(&d.dialTimeout, "discovery-dial-timeout", 2*time.Second, "V3 discovery: dial timeout for client connections."+impl)
	fs.DurationVar(&d.requestTimeout, "discovery-request-timeout", 5*time.Second, "V3 discovery: timeout for discovery requests (excluding dial timeout)."+impl)
	fs.DurationVar(&d.keepAliveTime, "discovery-keepalive-time", 2*time.Second, "V3 discovery: keepalive time for client connections."+impl)
	fs.DurationVar(&d.keepAliveTimeout, "discovery-keepalive-timeout", 6*time.Second, "V3 discovery: keepalive timeout for client connections."+impl)
	fs.BoolVar(&d.insecureTransport, "discovery-insecure-transport", true, "V3 discovery: disable transport security for client connections."+impl)
	fs.BoolVar(&d.skipVerify, "discovery-insecure-skip-tls-verify", false, "V3 discovery: skip server certificate verification (CAUTION: this option should be enabled only for testing purposes)."+impl)
	fs.StringVar(&d.cert, "discovery-cert", "", "V3 discovery: identify secure client using this TLS certificate file."+impl)
	fs.StringVar(&d.key, "discovery-key", "", "V3 discovery: identify secure client using this TLS key file."+impl)
	fs.StringVar(&d.cacert, "discovery-cacert", "", "V3 discovery: verify certificates of TLS-enabled secure servers using this CA bundle."+impl)
	fs.StringVar(&d.user, "discovery-user", "", "V3 discovery: username[:password] for authentication (prompt if password is not supplied)."+impl+" As in etcd, the value is the user name as given: there is no prompt.")
	fs.StringVar(&d.password, "discovery-password", "", "V3 discovery: password for authentication (if this option is used, --user option shouldn't include password)."+impl)
}

// config checks the flags with etcd's rules, in etcd's order and words
// (embed.Config.Validate), and returns the discovery client's
// configuration; ok is false when discovery is off (no token and no
// endpoints). initialCluster is --initial-cluster as given ("" if not).
//
// An explicitly empty --discovery-endpoints= is read as no endpoints
// (etcd reads it as one empty endpoint and refuses it), so that a command
// line listing every flag at its default starts.
func (d *discoveryFlags) config(initialCluster string) (cfg discovery.Config, ok bool, err error) {
	var endpoints []string
	emptyEndpoint := false
	if d.endpoints != "" {
		for _, ep := range strings.Split(d.endpoints, ",") {
			emptyEndpoint = emptyEndpoint || strings.TrimSpace(ep) == ""
			endpoints = append(endpoints, ep)
		}
		// etcd keeps each endpoint once, sorted (flags.UniqueStringsFromFlag).
		slices.Sort(endpoints)
		endpoints = slices.Compact(endpoints)
	}
	if initialCluster != "" && len(endpoints) > 0 {
		return discovery.Config{}, false, errConflictBootstrapFlags
	}
	if (d.token != "") != (len(endpoints) > 0) {
		return discovery.Config{}, false, errors.New("both --discovery-token and --discovery-endpoints must be set")
	}
	if emptyEndpoint {
		return discovery.Config{}, false, errors.New("--discovery-endpoints must not contain empty endpoints")
	}
	if len(endpoints) == 0 {
		return discovery.Config{}, false, nil
	}
	return discovery.Config{
		Token:              d.token,
		Endpoints:          endpoints,
		DialTimeout:        d.dialTimeout,
		RequestTimeout:     d.requestTimeout,
		KeepAliveTime:      d.keepAliveTime,
		KeepAliveTimeout:   d.keepAliveTimeout,
		CertFile:           d.cert,
		KeyFile:            d.key,
		CAFile:             d.cacert,
		InsecureTransport:  d.insecureTransport,
		InsecureSkipVerify: d.skipVerify,
		User:               d.user,
		Password:           d.password,
	}, true, nil
}

// apply turns discovery on in the member's configuration: the token
// becomes the cluster token (as in etcd, so member and cluster IDs match
// etcd's), and the member asks the discovery service for its initial
// cluster when it bootstraps (member.Config.Discover).
func applyDiscovery(cfg *member.Config, dc discovery.Config, logger *zap.Logger) {
	dc.Logger = logger.Named("discovery")
	cfg.InitialClusterToken = dc.Token
	name, peerURLs := cfg.Name, cfg.AdvertisePeerURLs
	cfg.Discover = func() (map[string][]string, error) {
		logger.Info("bootstrapping cluster using v3 discovery", zap.String("discovery-token", dc.Token), zap.Strings("discovery-endpoints", dc.Endpoints))
		// No deadline: etcd waits for the cluster's size to register
		// for as long as it takes; a signal ends the process.
		s, err := discovery.Join(context.Background(), dc, name, peerURLs)
		if err != nil {
			logger.Warn("failed to bootstrap; discovery token was already used", zap.String("discovery-token", dc.Token),
				zap.Strings("discovery-endpoints", dc.Endpoints), zap.Error(err))
			logger.Warn("do not reuse discovery token; generate a new one to bootstrap a cluster")
			return nil, err
		}
		cluster, err := discovery.ParseCluster(s)
		if err != nil {
			return nil, err
		}
		return cluster, nil
	}
}
