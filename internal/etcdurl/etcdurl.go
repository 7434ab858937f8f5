// Package etcdurl holds etcd's rules for the URLs its flags and its
// membership API take (etcd's client/pkg/types.NewURLs): a URL of scheme
// http or https names a host and a port and has no path; unix and unixs
// URLs are taken as they are; no other scheme is. strata applies them
// wherever etcd does (member add, --cors, discovery), so that an operator
// gets the same refusals, in the same words.
package etcdurl

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
)

// Check applies etcd's rules to one URL.
func Check(s string) error {
	_, err := parse(s)
	return err
}

// Normalize checks each URL, after trimming the spaces around it, and
// returns them as etcd records them: re-encoded and sorted.
func Normalize(strs []string) ([]string, error) {
	if len(strs) == 0 {
		return nil, errors.New("no valid URLs given")
	}
	out := make([]string, 0, len(strs))
	for _, s := range strs {
		u, err := parse(strings.TrimSpace(s))
		if err != nil {
			return nil, err
		}
		out = append(out, u.String())
	}
	slices.Sort(out)
	return out, nil
}

func parse(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	switch u.Scheme {
	case "http", "https":
		if _, _, err := net.SplitHostPort(u.Host); err != nil {
			return nil, fmt.Errorf(`URL address does not have the form "host:port": %s`, s)
		}
		if u.Path != "" {
			return nil, fmt.Errorf("URL must not contain a path: %s", s)
		}
	case "unix", "unixs":
	default:
		return nil, fmt.Errorf("URL scheme must be http, https, unix, or unixs: %s", s)
	}
	return u, nil
}
