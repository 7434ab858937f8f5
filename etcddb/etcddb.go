package etcddb

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/coreos/go-semver/semver"
	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/authpb"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/auth"
	"github.com/strata-kv/strata/mvcc"
)

// Bucket names and meta keys: etcd's, a wire format (see doc.go).
var (
	bucketKey            = []byte("key")
	bucketMeta           = []byte("meta")
	bucketLease          = []byte("lease")
	bucketAlarm          = []byte("alarm")
	bucketCluster        = []byte("cluster")
	bucketMembers        = []byte("members")
	bucketMembersRemoved = []byte("members_removed")
	bucketAuth           = []byte("auth")
	bucketAuthUsers      = []byte("authUsers")
	bucketAuthRoles      = []byte("authRoles")

	metaConsistentIndex = []byte("consistent_index")
	metaTerm            = []byte("term")
	metaConfState       = []byte("confState")
	metaScheduled       = []byte("scheduledCompactRev")
	metaFinished        = []byte("finishedCompactRev")
	metaStorageVersion  = []byte("storageVersion")
	clusterVersionKey   = []byte("clusterVersion")
	authEnabledKey      = []byte("authEnabled")
	authRevisionKey     = []byte("authRevision")
)

// StorageVersion is the storage schema version strata writes, and the
// newest it reads: etcd 3.7's.
var StorageVersion = semver.Version{Major: 3, Minor: 7}

// ErrChecksum marks a snapshot file whose SHA-256 trailer does not match its
// bytes.
var ErrChecksum = errors.New("etcd snapshot sha256 mismatch")

// Contents is the state in an etcd database besides the key versions.
type Contents struct {
	// ConsistentIndex and Term are the raft index the state machine had
	// applied, and a term at or after it.
	ConsistentIndex, Term uint64
	// ConfState is raft's membership at ConsistentIndex; nil if unknown.
	ConfState *raftpb.ConfState
	// Revisions are the current and the compact revision.
	Revisions mvcc.RevisionState
	Leases    []mvcc.LeaseRecord
	Auth      auth.State
	Members   []*pb.Member
	// Removed holds the IDs of the members removed from the cluster
	// (members_removed).
	Removed []uint64
	Alarms  []*pb.AlarmMember
}

// versionsPerTx and bytesPerTx bound the key versions written in one bbolt
// transaction, which holds its dirty pages in memory until it commits: a
// few large transactions rather than many small ones, as each commit
// rewrites the bucket's rightmost branch pages and allocates its pages anew.
const (
	versionsPerTx = 10000
	bytesPerTx    = 16 << 20
)

// Write writes an etcd snapshot file of c and of the key versions that
// versions passes to its callback (in revision order) to w: the bbolt
// database, built in a temporary file in dir and removed afterwards, then
// the database's SHA-256. It returns the bytes written.
func Write(w io.Writer, dir string, c Contents, versions func(fn func(mvcc.KeyChange) error) error) (int64, error) {
	f, err := os.CreateTemp(dir, "etcd-snapshot-*.db")
	if err != nil {
		return 0, fmt.Errorf("etcd snapshot: temporary database: %w", err)
	}
	path := f.Name()
	f.Close()
	defer os.Remove(path)
	size, err := build(path, c, versions)
	if err != nil {
		return 0, fmt.Errorf("etcd snapshot: %w", err)
	}
	db, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("etcd snapshot: %w", err)
	}
	defer db.Close()
	// Only the database's pages are sent, as etcd's tx.WriteTo sends them:
	// a file bbolt grew ahead of its pages would otherwise carry its
	// unused tail into the snapshot.
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), io.NewSectionReader(db, 0, size))
	if err != nil {
		return n, fmt.Errorf("etcd snapshot: send database: %w", err)
	}
	if n != size {
		return n, fmt.Errorf("etcd snapshot: send database: read %d of its %d bytes", n, size)
	}
	m, err := w.Write(h.Sum(nil))
	return n + int64(m), err
}

// encodedTx is one bbolt transaction's worth of key bucket rows, encoded
// into buffers of at least arenaChunk bytes that rows slice: bbolt keeps
// the slices Put is given until the transaction commits, so a buffer is
// never reused, and a full one is left for a new one rather than grown
// (growing would copy every row encoded so far).
type encodedTx struct {
	buf   []byte
	rows  [][2][]byte // key, value
	bytes int         // the rows' encoded size
}

// arenaChunk is the size of an encodedTx's buffers.
const arenaChunk = 1 << 20

// build writes the database at path and returns its size: the bytes of
// its pages, which the file may exceed.
//
// The key versions are read and encoded on one goroutine while the
// previous transaction's are written on another: reading them is engine
// lookups, writing them bbolt's page work, and neither waits for the other.
func build(path string, c Contents, versions func(fn func(mvcc.KeyChange) error) error) (int64, error) {
	// The file is a temporary copy that is read back through the page
	// cache and removed: a crash loses nothing, so bbolt need not sync
	// each transaction nor each time the file grows, and the database is
	// not synced at all (the client syncs the snapshot it receives, as
	// etcdctl does).
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true, NoGrowSync: true, NoFreelistSync: true})
	if err != nil {
		return 0, fmt.Errorf("create database: %w", err)
	}
	defer db.Close()
	if err := db.Update(func(tx *bolt.Tx) error { return writeState(tx, c) }); err != nil {
		return 0, err
	}
	txs := make(chan *encodedTx, 1)
	stop := make(chan struct{})
	readErr := make(chan error, 1)
	go func() {
		defer close(txs)
		cur := &encodedTx{}
		send := func() bool {
			select {
			case txs <- cur:
				cur = &encodedTx{}
				return true
			case <-stop:
				return false
			}
		}
		errStopped := errors.New("stopped")
		err := versions(func(v mvcc.KeyChange) error {
			if err := cur.add(v); err != nil {
				return err
			}
			if len(cur.rows) == versionsPerTx || cur.bytes >= bytesPerTx {
				if !send() {
					return errStopped
				}
			}
			return nil
		})
		if err == nil && len(cur.rows) > 0 && !send() {
			err = errStopped
		}
		readErr <- err
	}()
	writeErr := func() error {
		for t := range txs {
			if err := db.Update(func(tx *bolt.Tx) error {
				b := tx.Bucket(bucketKey)
				// Versions come in revision order, the bucket's key
				// order: full pages are the densest file and never split
				// again.
				b.FillPercent = 1
				for _, r := range t.rows {
					if err := b.Put(r[0], r[1]); err != nil {
						return fmt.Errorf("write revision %x: %w", r[0], err)
					}
				}
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	}()
	if writeErr != nil {
		close(stop)
		// The reader stops at its next version (with errStopped, which
		// is not reported: the write's error is the cause). It is waited
		// for because it reads the caller's engine view, which the caller
		// closes once Write returns.
		for range txs {
		}
		<-readErr
		return 0, writeErr
	}
	if err := <-readErr; err != nil {
		return 0, err
	}
	var size int64
	if err := db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil }); err != nil {
		return 0, fmt.Errorf("database size: %w", err)
	}
	if err := db.Close(); err != nil {
		return 0, fmt.Errorf("close database: %w", err)
	}
	return size, nil
}

// add appends v's key bucket row to t.
func (t *encodedTx) add(v mvcc.KeyChange) error {
	kv := v.KV
	if kv == nil {
		kv = &mvccpb.KeyValue{Key: v.Key}
	}
	size := 18 + proto.Size(kv)
	if cap(t.buf)-len(t.buf) < size {
		t.buf = make([]byte, 0, max(arenaChunk, size))
	}
	start := len(t.buf)
	t.buf = appendRev(t.buf, v.Main, v.Sub, v.KV == nil)
	mid := len(t.buf)
	var err error
	t.buf, err = proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(t.buf, kv)
	if err != nil {
		return fmt.Errorf("encode revision %d.%d: %w", v.Main, v.Sub, err)
	}
	t.rows = append(t.rows, [2][]byte{t.buf[start:mid:mid], t.buf[mid:len(t.buf):len(t.buf)]})
	t.bytes += len(t.buf) - start
	return nil
}

// revBytes is etcd's encoding of a revision as a key bucket key.
func revBytes(main, sub int64, tombstone bool) []byte {
	return appendRev(make([]byte, 0, 18), main, sub, tombstone)
}

// appendRev appends etcd's encoding of a revision as a key bucket key: main
// (8 bytes, big-endian), '_', sub (8 bytes), and 't' for a deletion.
func appendRev(b []byte, main, sub int64, tombstone bool) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(main))
	b = append(b, '_')
	b = binary.BigEndian.AppendUint64(b, uint64(sub))
	if tombstone {
		b = append(b, 't')
	}
	return b
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

// confStateJSON is raft's ConfState as etcd stores it (its JSON names).
type confStateJSON struct {
	Voters         []uint64 `json:"voters,omitempty"`
	Learners       []uint64 `json:"learners,omitempty"`
	VotersOutgoing []uint64 `json:"voters_outgoing,omitempty"`
	LearnersNext   []uint64 `json:"learners_next,omitempty"`
	AutoLeave      bool     `json:"auto_leave"`
}

// memberJSON is etcd's membership.Member as it stores it.
type memberJSON struct {
	ID         uint64   `json:"id"`
	PeerURLs   []string `json:"peerURLs"`
	IsLearner  bool     `json:"isLearner,omitempty"`
	Name       string   `json:"name,omitempty"`
	ClientURLs []string `json:"clientURLs,omitempty"`
}

// writeState writes everything but the key versions.
func writeState(tx *bolt.Tx, c Contents) error {
	buckets := map[string]*bolt.Bucket{}
	for _, name := range [][]byte{bucketKey, bucketMeta, bucketLease, bucketAlarm, bucketCluster,
		bucketMembers, bucketMembersRemoved, bucketAuth, bucketAuthUsers, bucketAuthRoles} {
		b, err := tx.CreateBucketIfNotExists(name)
		if err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
		buckets[string(name)] = b
	}
	put := func(bucket, key, value []byte) error {
		if err := buckets[string(bucket)].Put(key, value); err != nil {
			return fmt.Errorf("write %s/%q: %w", bucket, key, err)
		}
		return nil
	}
	type kv struct{ bucket, key, value []byte }
	rows := []kv{
		{bucketMeta, metaConsistentIndex, u64(c.ConsistentIndex)},
		{bucketMeta, metaTerm, u64(c.Term)},
		{bucketMeta, metaStorageVersion, []byte(StorageVersion.String())},
		{bucketCluster, clusterVersionKey, []byte(StorageVersion.String())},
		{bucketAuth, authRevisionKey, u64(c.Auth.Revision)},
	}
	enabled := []byte{0}
	if c.Auth.Enabled {
		enabled[0] = 1
	}
	rows = append(rows, kv{bucketAuth, authEnabledKey, enabled})
	if cs := c.ConfState; cs != nil {
		raw, err := json.Marshal(confStateJSON{Voters: cs.GetVoters(), Learners: cs.GetLearners(),
			VotersOutgoing: cs.GetVotersOutgoing(), LearnersNext: cs.GetLearnersNext(), AutoLeave: cs.GetAutoLeave()})
		if err != nil {
			return fmt.Errorf("encode conf state: %w", err)
		}
		rows = append(rows, kv{bucketMeta, metaConfState, raw})
	}
	if rev := c.Revisions.CompactRev; rev > 0 {
		rows = append(rows, kv{bucketMeta, metaScheduled, revBytes(rev, 0, false)},
			kv{bucketMeta, metaFinished, revBytes(rev, 0, false)})
	}
	for _, l := range c.Leases {
		rows = append(rows, kv{bucketLease, u64(uint64(l.ID)), encodeLease(l)})
	}
	for _, m := range c.Members {
		raw, err := json.Marshal(memberJSON{ID: m.ID, PeerURLs: m.PeerURLs, IsLearner: m.IsLearner, Name: m.Name, ClientURLs: m.ClientURLs})
		if err != nil {
			return fmt.Errorf("encode member %x: %w", m.ID, err)
		}
		rows = append(rows, kv{bucketMembers, []byte(strconv.FormatUint(m.ID, 16)), raw})
	}
	for _, id := range c.Removed {
		rows = append(rows, kv{bucketMembersRemoved, []byte(strconv.FormatUint(id, 16)), []byte("removed")})
	}
	for _, a := range c.Alarms {
		raw, err := proto.Marshal(a)
		if err != nil {
			return fmt.Errorf("encode alarm: %w", err)
		}
		rows = append(rows, kv{bucketAlarm, raw, nil})
	}
	for _, u := range c.Auth.Users {
		raw, err := proto.Marshal(u)
		if err != nil {
			return fmt.Errorf("encode user %q: %w", u.Name, err)
		}
		rows = append(rows, kv{bucketAuthUsers, u.Name, raw})
	}
	for _, ro := range c.Auth.Roles {
		raw, err := proto.Marshal(ro)
		if err != nil {
			return fmt.Errorf("encode role %q: %w", ro.Name, err)
		}
		rows = append(rows, kv{bucketAuthRoles, ro.Name, raw})
	}
	for _, r := range rows {
		value := r.value
		if value == nil {
			value = []byte{}
		}
		if err := put(r.bucket, r.key, value); err != nil {
			return err
		}
	}
	return nil
}

// encodeLease is etcd's leasepb.Lease, written field by field: the message
// lives in etcd's server module, which strata does not depend on.
func encodeLease(l mvcc.LeaseRecord) []byte {
	var b []byte
	for _, f := range []struct {
		num protowire.Number
		v   int64
	}{{1, l.ID}, {2, l.TTL}, {3, l.RemainingTTL}} {
		if f.v != 0 {
			b = protowire.AppendTag(b, f.num, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(f.v))
		}
	}
	return b
}

func decodeLease(b []byte) (mvcc.LeaseRecord, error) {
	var l mvcc.LeaseRecord
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return l, protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.VarintType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return l, protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return l, protowire.ParseError(n)
		}
		b = b[n:]
		switch num {
		case 1:
			l.ID = int64(v)
		case 2:
			l.TTL = int64(v)
		case 3:
			l.RemainingTTL = int64(v)
		}
	}
	return l, nil
}

// Read reads the etcd database at path: a snapshot file (its SHA-256
// trailer is checked first, and nothing is read from a file whose digest
// does not match) or a member's member/snap/db. It passes every key version
// to fn, in revision order, and returns the rest of the state. A file that
// is not a bbolt database, a bbolt database without etcd's key and meta
// buckets, and a storage version newer than StorageVersion are refused.
func Read(path string, fn func(mvcc.KeyChange) error) (_ Contents, err error) {
	if err := checkDigest(path); err != nil {
		return Contents{}, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return Contents{}, fmt.Errorf("read etcd database: %w", err)
	}
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return Contents{}, fmt.Errorf("read etcd database %s: not a bbolt database: %w", path, err)
	}
	defer db.Close()
	// bbolt trusts its pages and panics on a damaged one; a file read from
	// elsewhere is input, so a panic is reported as its corruption.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("read etcd database %s: corrupt bbolt database: %v", path, r)
		}
	}()
	var c Contents
	err = db.View(func(tx *bolt.Tx) error {
		if tx.Size() > st.Size() {
			return fmt.Errorf("truncated: the database's pages need %d bytes, the file holds %d", tx.Size(), st.Size())
		}
		if tx.Bucket(bucketKey) == nil || tx.Bucket(bucketMeta) == nil {
			return errors.New("no 'key' and 'meta' buckets: a bbolt file, but not etcd's")
		}
		var err error
		if c, err = readState(tx); err != nil {
			return err
		}
		return readVersions(tx.Bucket(bucketKey), &c, fn)
	})
	if err != nil {
		return Contents{}, fmt.Errorf("read etcd database %s: %w", path, err)
	}
	return c, nil
}

// checkDigest checks the SHA-256 trailer of a snapshot file, if it has one
// (its size modulo 512 is 32, as etcdutl decides).
func checkDigest(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("read etcd snapshot: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("read etcd snapshot: %w", err)
	}
	size := st.Size()
	if size%512 != sha256.Size || size < 512+sha256.Size {
		return nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, size-sha256.Size)); err != nil {
		return fmt.Errorf("read etcd snapshot %s: %w", path, err)
	}
	want := make([]byte, sha256.Size)
	if _, err := f.ReadAt(want, size-sha256.Size); err != nil {
		return fmt.Errorf("read etcd snapshot %s: %w", path, err)
	}
	if !bytes.Equal(h.Sum(nil), want) {
		return fmt.Errorf("read etcd snapshot %s: %w", path, ErrChecksum)
	}
	return nil
}

func readState(tx *bolt.Tx) (Contents, error) {
	var c Contents
	meta := tx.Bucket(bucketMeta)
	if v := meta.Get(metaStorageVersion); v != nil {
		sv, err := semver.NewVersion(string(v))
		if err != nil {
			return c, fmt.Errorf("storage version %q: %w", v, err)
		}
		if (semver.Version{Major: sv.Major, Minor: sv.Minor}).Compare(StorageVersion) > 0 {
			return c, fmt.Errorf("storage version %s is newer than %s, the newest strata reads", sv, StorageVersion)
		}
	}
	if v := meta.Get(metaConsistentIndex); len(v) == 8 {
		c.ConsistentIndex = binary.BigEndian.Uint64(v)
	}
	if v := meta.Get(metaTerm); len(v) == 8 {
		c.Term = binary.BigEndian.Uint64(v)
	}
	if v := meta.Get(metaConfState); v != nil {
		var cs confStateJSON
		if err := json.Unmarshal(v, &cs); err != nil {
			return c, fmt.Errorf("decode conf state: %w", err)
		}
		c.ConfState = &raftpb.ConfState{Voters: cs.Voters, Learners: cs.Learners, VotersOutgoing: cs.VotersOutgoing,
			LearnersNext: cs.LearnersNext, AutoLeave: proto.Bool(cs.AutoLeave)}
	}
	c.Revisions.CompactRev = -1
	if v := meta.Get(metaFinished); v != nil {
		if len(v) < 17 {
			return c, fmt.Errorf("finished compact revision of %d bytes", len(v))
		}
		c.Revisions.CompactRev = int64(binary.BigEndian.Uint64(v))
	}
	if b := tx.Bucket(bucketLease); b != nil {
		if err := b.ForEach(func(k, v []byte) error {
			l, err := decodeLease(v)
			if err != nil {
				return fmt.Errorf("decode lease %x: %w", k, err)
			}
			c.Leases = append(c.Leases, l)
			return nil
		}); err != nil {
			return c, err
		}
	}
	if b := tx.Bucket(bucketMembers); b != nil {
		if err := b.ForEach(func(k, v []byte) error {
			var m memberJSON
			if err := json.Unmarshal(v, &m); err != nil {
				return fmt.Errorf("decode member %s: %w", k, err)
			}
			c.Members = append(c.Members, &pb.Member{ID: m.ID, Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner})
			return nil
		}); err != nil {
			return c, err
		}
	}
	if b := tx.Bucket(bucketMembersRemoved); b != nil {
		if err := b.ForEach(func(k, _ []byte) error {
			id, err := strconv.ParseUint(string(k), 16, 64)
			if err != nil {
				return fmt.Errorf("decode removed member %q: %w", k, err)
			}
			c.Removed = append(c.Removed, id)
			return nil
		}); err != nil {
			return c, err
		}
	}
	slices.Sort(c.Removed) // bbolt orders the hex keys by their text
	if b := tx.Bucket(bucketAlarm); b != nil {
		if err := b.ForEach(func(k, _ []byte) error {
			a := &pb.AlarmMember{}
			if err := proto.Unmarshal(k, a); err != nil {
				return fmt.Errorf("decode alarm: %w", err)
			}
			c.Alarms = append(c.Alarms, a)
			return nil
		}); err != nil {
			return c, err
		}
	}
	if b := tx.Bucket(bucketAuth); b != nil {
		c.Auth.Enabled = bytes.Equal(b.Get(authEnabledKey), []byte{1})
		if v := b.Get(authRevisionKey); len(v) == 8 {
			c.Auth.Revision = binary.BigEndian.Uint64(v)
		}
	}
	if b := tx.Bucket(bucketAuthUsers); b != nil {
		if err := b.ForEach(func(k, v []byte) error {
			u := &authpb.User{}
			if err := proto.Unmarshal(v, u); err != nil {
				return fmt.Errorf("decode user %q: %w", k, err)
			}
			c.Auth.Users = append(c.Auth.Users, u)
			return nil
		}); err != nil {
			return c, err
		}
	}
	if b := tx.Bucket(bucketAuthRoles); b != nil {
		if err := b.ForEach(func(k, v []byte) error {
			ro := &authpb.Role{}
			if err := proto.Unmarshal(v, ro); err != nil {
				return fmt.Errorf("decode role %q: %w", k, err)
			}
			c.Auth.Roles = append(c.Auth.Roles, ro)
			return nil
		}); err != nil {
			return c, err
		}
	}
	return c, nil
}

// readVersions passes the key bucket's versions to fn and sets the
// current revision: the newest version's, or the compact revision if that
// is higher (a compaction may have removed the newest, a deletion).
func readVersions(b *bolt.Bucket, c *Contents, fn func(mvcc.KeyChange) error) error {
	c.Revisions.Rev = max(1, c.Revisions.CompactRev)
	return b.ForEach(func(k, v []byte) error {
		if len(k) != 17 && len(k) != 18 || k[8] != '_' {
			return fmt.Errorf("key bucket: malformed revision %x", k)
		}
		main, sub := int64(binary.BigEndian.Uint64(k)), int64(binary.BigEndian.Uint64(k[9:]))
		if main < 0 || sub < 0 {
			return fmt.Errorf("key bucket: negative revision %x", k)
		}
		kv := &mvccpb.KeyValue{}
		if err := proto.Unmarshal(v, kv); err != nil {
			return fmt.Errorf("key bucket: revision %d.%d: %w", main, sub, err)
		}
		c.Revisions.Rev = max(c.Revisions.Rev, main)
		if len(kv.Key) == 0 {
			// etcdutl's --bump-revision marker: an empty value at the
			// revision to resume from, which names no key.
			return nil
		}
		ch := mvcc.KeyChange{Main: main, Sub: sub, Key: kv.Key}
		if len(k) == 17 {
			ch.KV = kv
		} else if k[17] != 't' {
			return fmt.Errorf("key bucket: revision %d.%d has mark %q", main, sub, k[17])
		}
		return fn(ch)
	})
}
