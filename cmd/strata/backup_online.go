package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/strata-kv/strata/backup"
	"github.com/strata-kv/strata/tlsconfig"
)

// onlineFlags reach a running member's client URL for `strata backup
// create --endpoints`, under etcdctl's names: its TLS and, with auth on,
// root's name and password.
type onlineFlags struct {
	endpoints      string
	user, password string
	cacert         string
	cert, key      string
	timeout        time.Duration
}

func (f *onlineFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.endpoints, "endpoints", "", "A running member's client URL (http(s)://host:port): it takes the version. With several, the client picks one.")
	fs.StringVar(&f.user, "user", "", "With auth on: root's name, or name:password.")
	fs.StringVar(&f.password, "password", "", "With auth on: the password, if --user has none.")
	fs.StringVar(&f.cacert, "cacert", "", "Verify the member's certificate against this CA bundle (default: the system's).")
	fs.StringVar(&f.cert, "cert", "", "The client certificate to present (--client-cert-auth).")
	fs.StringVar(&f.key, "key", "", "The client certificate's key.")
	fs.DurationVar(&f.timeout, "command-timeout", 30*time.Minute, "How long the version may take.")
}

// create asks the member for a version of kind (empty: as its policy
// says) into target (empty: its own).
func (f *onlineFlags) create(ctx context.Context, target string, kind backup.Kind) (*backup.CreateResponse, error) {
	cfg := clientv3.Config{Endpoints: splitURLs(f.endpoints), DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if f.cacert != "" || f.cert != "" || strings.HasPrefix(f.endpoints, "https://") {
		tc, err := tlsconfig.Info{CertFile: f.cert, KeyFile: f.key, TrustedCAFile: f.cacert}.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("--cacert/--cert/--key: %w", err)
		}
		cfg.TLS = tc
	}
	if f.user != "" {
		name, password, ok := strings.Cut(f.user, ":")
		if !ok {
			password = f.password
		}
		if password == "" {
			return nil, errors.New("--user needs a password: --user name:password or --password")
		}
		cfg.Username, cfg.Password = name, password
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", f.endpoints, err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	resp, err := backup.CreateRemote(ctx, cli.ActiveConnection(), &backup.CreateRequest{Target: target, Kind: kind})
	if err != nil {
		return nil, fmt.Errorf("member at %s: %w", f.endpoints, err)
	}
	return resp, nil
}
