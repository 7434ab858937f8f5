package mvcc

import (
	"encoding/binary"
	"fmt"
)

// Lease records: what package lease persists of each lease, in the same
// batch as the requests that change it (a wire format: see doc.go).
//
//	mg<id>  ->  ttl(8) remainingTTL(8)
//
// The key space is separate from ml (the lease -> key index) so that the
// lessor's start-up scan reads one record per lease and never a key.
const prefixLeaseRecord = "mg"

// LeaseRecord is the persistent state of one lease.
type LeaseRecord struct {
	// ID is the lease's ID.
	ID int64
	// TTL is the granted time to live in seconds (after the minimum TTL
	// was applied).
	TTL int64
	// RemainingTTL is the remaining time to live in seconds at the last
	// checkpoint, 0 if none: a new leader counts expiry from it instead of
	// the full TTL (etcd's lease checkpointing).
	RemainingTTL int64
}

func leaseRecordKey(id int64) []byte {
	return binary.BigEndian.AppendUint64([]byte(prefixLeaseRecord), uint64(id))
}

func (l LeaseRecord) encode() []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(l.TTL))
	return binary.BigEndian.AppendUint64(b, uint64(l.RemainingTTL))
}

// decodeLeaseRecord decodes the record stored under key k with value v.
func decodeLeaseRecord(k, v []byte) (LeaseRecord, error) {
	if len(k) != len(prefixLeaseRecord)+8 {
		return LeaseRecord{}, fmt.Errorf("%w: lease record key has %d bytes", errCorrupt, len(k))
	}
	if len(v) != 16 {
		return LeaseRecord{}, fmt.Errorf("%w: lease record has %d bytes", errCorrupt, len(v))
	}
	return LeaseRecord{
		ID:           int64(binary.BigEndian.Uint64(k[len(prefixLeaseRecord):])),
		TTL:          int64(binary.BigEndian.Uint64(v)),
		RemainingTTL: int64(binary.BigEndian.Uint64(v[8:])),
	}, nil
}

// Leases returns every lease record, in the order of the IDs' bytes. It
// reads only the lease records: its cost grows with the number of leases,
// not of keys.
func (s *Store) Leases() ([]LeaseRecord, error) { return ReadLeases(s.e) }

// PutLease writes a lease record in the batch (a grant or a checkpoint).
// It takes no revision: leases are not keys.
func (w *WriteBatch) PutLease(rec LeaseRecord) error {
	if err := w.usable(); err != nil {
		return err
	}
	if err := w.b.Set(leaseRecordKey(rec.ID), rec.encode()); err != nil {
		return w.fail(fmt.Errorf("write lease %x: %w", rec.ID, err))
	}
	return nil
}

// RevokeLease deletes lease id's record and every key attached to it, all
// the keys in one revision (one write transaction, as etcd's revoke), and
// returns the revision after it: the new one if keys were deleted, else
// the current one.
func (w *WriteBatch) RevokeLease(id int64) (rev int64, deleted int, err error) {
	if err := w.usable(); err != nil {
		return 0, 0, err
	}
	keys, err := leaseKeys(w.r, id)
	if err != nil {
		return 0, 0, w.fail(err)
	}
	v := w.view()
	for _, k := range keys {
		cur, err := v.current(k)
		if err != nil {
			return 0, 0, w.fail(fmt.Errorf("revoke lease %x: %w", id, err))
		}
		if cur == nil || cur.kv.Lease != id {
			// An index entry without its key cannot be written by put or
			// del; drop it rather than delete a key of another lease.
			if err := w.b.Delete(leaseKey(id, k)); err != nil {
				return 0, 0, w.fail(fmt.Errorf("revoke lease %x: %w", id, err))
			}
			continue
		}
		if err := w.del(cur); err != nil {
			return 0, 0, w.fail(fmt.Errorf("revoke lease %x: %w", id, err))
		}
		deleted++
	}
	if err := w.b.Delete(leaseRecordKey(id)); err != nil {
		return 0, 0, w.fail(fmt.Errorf("revoke lease %x: %w", id, err))
	}
	w.endRequest()
	return w.st.rev, deleted, nil
}
