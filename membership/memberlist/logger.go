package memberlist

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// LoggerURLPath is the path a strata logger's client URLs carry in the
// member list: the marker that tells a logger from an ordinary learner.
//
// etcd's member record (membershippb.Attributes) has only a name and client
// URLs, so the mark has to live in one of them. The name is the operator's
// (etcdctl member add NAME) and is shown as given. A client URL with this
// path is still a URL to the logger's own API (`strata logger status
// --endpoint` and logger.Dial accept it; gRPC ignores the path), is printed
// as is by `etcdctl member list`, and is not a URL an etcd member
// advertises (etcd refuses client URLs with a path). etcd's clients never
// dial it on their own: clientv3's endpoint sync skips learners.
const LoggerURLPath = "/strata-logger"

// MarkLoggerURL returns u with the logger's marker path (LoggerURLPath).
func MarkLoggerURL(u string) (string, error) {
	p, err := url.Parse(u)
	if err != nil || p.Host == "" {
		return "", fmt.Errorf("logger client URL %q: want scheme://host:port", u)
	}
	if p.Path != "" && p.Path != "/" && p.Path != LoggerURLPath {
		return "", fmt.Errorf("logger client URL %q: want no path", u)
	}
	p.Path, p.RawQuery, p.Fragment = LoggerURLPath, "", ""
	return p.String(), nil
}

// IsLogger says whether m is a strata logger: a member whose published
// client URLs carry the marker path (LoggerURLPath). A logger that has not
// published its attributes yet is not recognised.
func IsLogger(m *pb.Member) bool {
	if m == nil {
		return false
	}
	return slices.ContainsFunc(m.ClientURLs, func(u string) bool {
		p, err := url.Parse(u)
		return err == nil && strings.TrimSuffix(p.Path, "/") == LoggerURLPath
	})
}
