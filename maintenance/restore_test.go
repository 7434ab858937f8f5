package maintenance

import (
	"slices"
	"testing"

	"github.com/strata-kv/strata/apply"
	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/mvcc"
)

// keySink records the keys a restore writes.
type keySink struct{ keys []string }

func (s *keySink) Add(key, _ []byte) error {
	s.keys = append(s.keys, string(key))
	return nil
}

// TestRestoreFilterDropsClusterState: a restore from engine records (a
// strata backup version, a point-in-time restore, the older backup file)
// leaves out every record of the old cluster's own state: raft's conf
// state, the member list, the removed member IDs, the refused membership
// changes and the alarms, as etcd's restore trims the membership and
// members_removed. The removed IDs and refusals were kept (found by
// review): a member of the restored cluster whose ID the old cluster had
// removed (replaced the etcd way, then restored with the original
// --initial-cluster: the same ID again) was refused at bootstrap by every
// applier while raft took it, and stopped itself as removed.
func TestRestoreFilterDropsClusterState(t *testing.T) {
	sink := &keySink{}
	f := restoreFilter{w: sink}
	data := "mcsome-key"
	for _, name := range apply.ClusterStateMeta {
		if err := f.Add(mvcc.MetaKey(name), []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{data, string(engine.AppliedIndexKey)} {
		if err := f.Add([]byte(key), []byte("12345678")); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{data, string(engine.AppliedIndexKey)}; !slices.Equal(sink.keys, want) {
		t.Fatalf("restore wrote %q, want %q", sink.keys, want)
	}
}
