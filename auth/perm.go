package auth

import (
	"bytes"
	"slices"

	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"
)

// interval is a key range [begin, end); end nil means no upper bound.
type interval struct{ begin, end []byte }

// userPerms are a user's merged read and write ranges, sorted and
// disjoint.
type userPerms struct {
	root        bool
	read, write []interval
}

// Read answers a read-only request (UserGet, UserList, RoleGet, RoleList,
// AuthStatus) from the local state, without raft.
func (s *Store) Read(r *pb.InternalRaftRequest) (proto.Message, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	c := &change{s: s}
	return c.apply(r)
}

// IsRangePermitted checks read access to [key, rangeEnd) (rangeEnd empty:
// the key alone; "\x00": every key from key on).
func (s *Store) IsRangePermitted(info *Info, key, rangeEnd []byte) error {
	return s.permitted(info, authpb.Permission_READ, key, rangeEnd)
}

// IsPutPermitted checks write access to key.
func (s *Store) IsPutPermitted(info *Info, key []byte) error {
	return s.permitted(info, authpb.Permission_WRITE, key, nil)
}

// IsDeleteRangePermitted checks write access to [key, rangeEnd).
func (s *Store) IsDeleteRangePermitted(info *Info, key, rangeEnd []byte) error {
	return s.permitted(info, authpb.Permission_WRITE, key, rangeEnd)
}

// IsAdminPermitted checks that info is the root role's: administration
// (user and role management, compaction, membership, maintenance).
func (s *Store) IsAdminPermitted(info *Info) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if !s.enabled {
		return nil
	}
	if info != nil && info.Username != "" && s.users[info.Username] == nil {
		return ErrUserNotFound // etcd's IsAdminPermitted names the missing user
	}
	p, err := s.userPermsLocked(info)
	if err != nil {
		return err
	}
	if !p.root {
		return ErrPermissionDenied
	}
	return nil
}

// IsUserOrAdmin permits an administrator, or user acting on itself (etcd
// lets a user read itself and change its own password).
func (s *Store) IsUserOrAdmin(info *Info, user string) error {
	if info != nil && info.Username == user && s.Enabled() {
		s.mu.RLock()
		defer s.mu.RUnlock()
		_, err := s.userPermsLocked(info)
		return err
	}
	return s.IsAdminPermitted(info)
}

// HasRole reports whether user holds role (a user may read its own roles).
func (s *Store) HasRole(user, role string) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	u := s.users[user]
	return u != nil && slices.Contains(u.Roles, role)
}

// IsOpPermitted checks one operation as IsTxnPermitted does.
func (s *Store) IsOpPermitted(info *Info, op *pb.RequestOp) error { return s.isOpPermitted(info, op) }

// IsTxnPermitted checks every operation of a transaction, nested ones
// included: compares and ranges need read access, puts and deletes write
// access (and read access when they return previous values).
func (s *Store) IsTxnPermitted(info *Info, r *pb.TxnRequest) error {
	for _, c := range r.Compare {
		if err := s.IsRangePermitted(info, c.Key, c.RangeEnd); err != nil {
			return err
		}
	}
	for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
		for _, op := range ops {
			if err := s.isOpPermitted(info, op); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Store) isOpPermitted(info *Info, op *pb.RequestOp) error {
	switch {
	case op.GetRequestRange() != nil:
		r := op.GetRequestRange()
		return s.IsRangePermitted(info, r.Key, r.RangeEnd)
	case op.GetRequestPut() != nil:
		r := op.GetRequestPut()
		if r.PrevKv {
			if err := s.IsRangePermitted(info, r.Key, nil); err != nil {
				return err
			}
		}
		return s.IsPutPermitted(info, r.Key)
	case op.GetRequestDeleteRange() != nil:
		r := op.GetRequestDeleteRange()
		if r.PrevKv {
			if err := s.IsRangePermitted(info, r.Key, r.RangeEnd); err != nil {
				return err
			}
		}
		return s.IsDeleteRangePermitted(info, r.Key, r.RangeEnd)
	case op.GetRequestTxn() != nil:
		return s.IsTxnPermitted(info, op.GetRequestTxn())
	}
	return nil
}

func (s *Store) permitted(info *Info, typ authpb.Permission_Type, key, rangeEnd []byte) error {
	s.mu.RLock()
	if !s.enabled {
		s.mu.RUnlock()
		return nil
	}
	p, err := s.userPermsLocked(info)
	s.mu.RUnlock()
	if err != nil {
		return err
	}
	if p.root {
		return nil
	}
	ranges := p.read
	if typ == authpb.Permission_WRITE {
		ranges = p.write
	}
	if covered(ranges, toInterval(key, rangeEnd)) {
		return nil
	}
	return ErrPermissionDenied
}

// userPermsLocked finds info's user and its merged ranges, checking the
// revision info was established at. REQUIRES: s.mu held (read suffices).
func (s *Store) userPermsLocked(info *Info) (*userPerms, error) {
	if info == nil || info.Username == "" {
		return nil, ErrUserEmpty
	}
	if info.Revision < s.revision {
		return nil, ErrAuthOldRevision
	}
	u := s.users[info.Username]
	if u == nil {
		return nil, ErrPermissionDenied
	}
	return computePerms(u, s.roles), nil
}

// computePerms merges the ranges a user's roles grant. Users have few
// roles and roles few permissions, so this is cheap enough per request.
func computePerms(u *authpb.User, roles map[string]*authpb.Role) *userPerms {
	p := &userPerms{}
	for _, name := range u.Roles {
		if name == RootRole {
			p.root = true
			return p
		}
		ro := roles[name]
		if ro == nil {
			continue
		}
		for _, perm := range ro.KeyPermission {
			iv := toInterval(perm.Key, perm.RangeEnd)
			switch perm.PermType {
			case authpb.Permission_READ:
				p.read = append(p.read, iv)
			case authpb.Permission_WRITE:
				p.write = append(p.write, iv)
			case authpb.Permission_READWRITE:
				p.read = append(p.read, iv)
				p.write = append(p.write, iv)
			}
		}
	}
	p.read, p.write = merge(p.read), merge(p.write)
	return p
}

// toInterval turns etcd's (key, range_end) into a half-open interval.
func toInterval(key, rangeEnd []byte) interval {
	switch {
	case len(rangeEnd) == 0:
		// A single key: [key, key+"\x00").
		return interval{begin: key, end: append(slices.Clip(key), 0)}
	case len(rangeEnd) == 1 && rangeEnd[0] == 0:
		return interval{begin: key}
	default:
		return interval{begin: key, end: rangeEnd}
	}
}

// endLess reports a < b for upper bounds, nil being infinity.
func endLess(a, b []byte) bool {
	if a == nil {
		return false
	}
	if b == nil {
		return true
	}
	return bytes.Compare(a, b) < 0
}

// merge sorts intervals and joins those that overlap or touch.
func merge(ivs []interval) []interval {
	if len(ivs) == 0 {
		return nil
	}
	slices.SortFunc(ivs, func(a, b interval) int { return bytes.Compare(a.begin, b.begin) })
	out := []interval{ivs[0]}
	for _, iv := range ivs[1:] {
		last := &out[len(out)-1]
		if last.end == nil || bytes.Compare(iv.begin, last.end) <= 0 {
			if endLess(last.end, iv.end) {
				last.end = iv.end
			}
			continue
		}
		out = append(out, iv)
	}
	return out
}

// covered reports whether one of the merged intervals holds all of want.
// A range whose end is at or before its key is not a valid permission
// range, and is refused to a user other than root, as etcd's
// checkKeyInterval refuses it (isValidPermissionRange).
func covered(merged []interval, want interval) bool {
	if want.end != nil && bytes.Compare(want.end, want.begin) <= 0 {
		return false
	}
	for _, iv := range merged {
		if bytes.Compare(iv.begin, want.begin) <= 0 && !endLess(iv.end, want.end) {
			return true
		}
	}
	return false
}
