package auth

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"go.etcd.io/etcd/api/v3/authpb"
	"google.golang.org/protobuf/proto"

	pebbleengine "github.com/strata-kv/strata/engine/pebble"
)

// FuzzLoad feeds arbitrary bytes as the persisted auth records: Load must
// return an error or a usable state, never panic.
func FuzzLoad(f *testing.F) {
	user, _ := proto.Marshal(&authpb.User{Name: []byte("u"), Roles: []string{"r"}})
	role, _ := proto.Marshal(&authpb.Role{Name: []byte("r"), KeyPermission: []*authpb.Permission{{Key: []byte("a"), RangeEnd: []byte{0}}}})
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 3}, user, role)
	f.Add([]byte{}, []byte{0xff}, []byte{0x0a, 0xff})
	e, err := pebbleengine.Open("engine", pebbleengine.Options{FS: vfs.NewMem()})
	if err != nil {
		f.Fatal(err)
	}
	defer e.Close()
	var index uint64
	f.Fuzz(func(t *testing.T, state, user, role []byte) {
		b := e.NewBatch()
		defer b.Close()
		for k, v := range map[string][]byte{keyEnabled: state, prefixUser + "u": user, prefixRole + "r": role} {
			if err := b.Set([]byte(k), v); err != nil {
				t.Fatal(err)
			}
		}
		index++
		if err := b.Commit(index); err != nil {
			t.Fatal(err)
		}
		s := New(Options{})
		if err := s.Load(e); err != nil {
			return
		}
		info := &Info{Username: "u", Revision: s.Revision()}
		_ = s.IsRangePermitted(info, []byte("a"), []byte{0})
		_ = s.IsAdminPermitted(info)
	})
}
