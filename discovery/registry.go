package discovery

import (
	"errors"
	"fmt"
	"github.com/strata-kv/strata/internal/etcdurl"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Errors of the discovery protocol, in etcd's words (etcd's
// server/etcdserver/api/v3discovery), so that an operator's log search and
// runbooks find strata's failures as they find etcd's.
var (
	// ErrInvalidURL: a registration names a peer URL etcd would not accept.
	ErrInvalidURL = errors.New("discovery: invalid peer URL")
	// ErrBadSizeKey: the size key is not a positive integer.
	ErrBadSizeKey = errors.New("discovery: size key is bad")
	// ErrSizeNotFound: the operator has not written the size key. Like
	// etcd, strata does not wait for it: the token is not set up.
	ErrSizeNotFound = errors.New("discovery: size key not found")
	// ErrFullCluster: size members other than this one registered first;
	// the token was used for another cluster (or this member's URLs
	// changed), and a new token is needed.
	ErrFullCluster = errors.New("discovery: cluster is full")
)

// registryPrefix is where every token's keys live in the discovery
// service. Wire format: etcd's; do not change.
const registryPrefix = "/_etcd/registry"

// SizeKey is the key the operator writes the cluster's size under:
// /_etcd/registry/<token>/_config/size.
func SizeKey(token string) string { return path.Join(registryPrefix, token, "_config/size") }

// MembersPrefix is the prefix of the token's registrations:
// /_etcd/registry/<token>/members.
func MembersPrefix(token string) string { return path.Join(registryPrefix, token, "members") }

// MemberKey is the key member id registers under:
// /_etcd/registry/<token>/members/<id in lower-case hex, unpadded>, as
// etcd's types.ID prints it.
func MemberKey(token string, id uint64) string {
	return path.Join(MembersPrefix(token), strconv.FormatUint(id, 16))
}

// RegistrationValue is what a member registers: its --initial-cluster
// entries, "name=url" for each peer URL, sorted and joined by commas (etcd's
// types.URLsMap.String of the one-member cluster).
func RegistrationValue(name string, peerURLs []string) string {
	pairs := make([]string, 0, len(peerURLs))
	for _, u := range peerURLs {
		pairs = append(pairs, name+"="+u)
	}
	sort.Strings(pairs)
	return strings.Join(pairs, ",")
}

// parseSize reads the size key's value as etcd does: a positive base-10
// integer, nothing else.
func parseSize(v []byte) (int, error) {
	n, err := strconv.ParseInt(string(v), 10, 0)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%w: %q", ErrBadSizeKey, v)
	}
	return int(n), nil
}

// registration is one member's key in the registry.
type registration struct {
	key, value string
	// createRev orders registrations: the first size to register form the
	// cluster, whatever the order their members started in.
	createRev int64
}

// registry is a token's registrations as one member sees them: the pure
// core of discovery, fed from a range read and then from watch events.
//
// Invariants:
//  1. regs are sorted by createRev (ties keep arrival order).
//  2. No two regs have the same key: a registration seen again (a member
//     that restarted on an empty data directory registers again, keeping
//     its create revision) is not counted twice.
type registry struct {
	token string
	regs  []registration
}

// add records a registration, or says why it ignores it: a key outside the
// token's members, a value that is no "name=url" list (a deletion's empty
// value, garbage), a key already recorded.
func (r *registry) add(key, value string, createRev int64) error {
	key, value = strings.TrimSpace(key), strings.TrimSpace(value)
	if !strings.HasPrefix(key, MembersPrefix(r.token)) {
		return fmt.Errorf("invalid peer registry key %q", key)
	}
	if !strings.ContainsRune(value, '=') {
		return fmt.Errorf("invalid peer info %q returned from discovery service for %s", value, key)
	}
	if slices.ContainsFunc(r.regs, func(g registration) bool { return g.key == key }) {
		return fmt.Errorf("found duplicate peer %s from discovery service", key)
	}
	r.regs = append(r.regs, registration{key: key, value: value, createRev: createRev})
	sort.SliceStable(r.regs, func(i, j int) bool { return r.regs[i].createRev < r.regs[j].createRev })
	return nil
}

// full reports whether the first size registrations leave no place for
// self (a member key): etcd's position check, made both before and after
// registering. A member already among the first size is never refused, so
// a member restarted on an empty data directory rejoins the same cluster.
func (r *registry) full(self string, size int) bool {
	for i, g := range r.regs {
		if g.key == self {
			return false
		}
		if i >= size-1 {
			return true
		}
	}
	return false
}

// initialCluster is the --initial-cluster string of the first size
// registrations, in registration order, or ErrInvalidURL (with the string)
// if etcd would not parse it.
func (r *registry) initialCluster(size int) (string, error) {
	var parts []string
	for i, g := range r.regs {
		if i == size {
			break
		}
		parts = append(parts, g.value)
	}
	s := strings.Join(parts, ",")
	if _, err := ParseCluster(s); err != nil {
		return s, fmt.Errorf("%w: %v", ErrInvalidURL, err)
	}
	return s, nil
}

// ParseCluster reads an --initial-cluster string ("name=url,...") into
// names and their peer URLs with etcd's rules (types.NewURLsMap): every
// URL is http, https, unix or unixs, with host:port and no path, and no URL
// is given twice.
func ParseCluster(s string) (map[string][]string, error) {
	cluster := map[string][]string{}
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		name, u, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" || u == "" {
			return nil, fmt.Errorf("%q is not name=peerURL", item)
		}
		if err := etcdurl.Check(u); err != nil {
			return nil, err
		}
		if seen[u] {
			return nil, fmt.Errorf("cluster %s has duplicate url %s", s, u)
		}
		seen[u] = true
		cluster[name] = append(cluster[name], u)
	}
	return cluster, nil
}
