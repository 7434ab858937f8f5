package datadir

import (
	"errors"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func TestMemberIDIgnoresURLOrder(t *testing.T) {
	a := MemberID([]string{"http://b:2380", "http://a:2380"}, "tok")
	b := MemberID([]string{"http://a:2380", "http://b:2380"}, "tok")
	if a != b {
		t.Fatalf("IDs %x and %x differ for the same URLs in another order", a, b)
	}
	if MemberID([]string{"http://a:2380"}, "tok") == MemberID([]string{"http://a:2380"}, "other") {
		t.Fatal("the cluster token does not change the member ID")
	}
}

func TestBootstrapID(t *testing.T) {
	cluster := map[string][]string{"a": {"http://a:2380"}, "b": {"http://b:2380"}}
	for _, tc := range []struct {
		name    string
		wantErr string
	}{
		{name: "a"},
		{name: "b"},
		{name: "c", wantErr: `--initial-cluster has no member named "c" (--name)`},
	} {
		id, err := BootstrapID(tc.name, cluster, "tok")
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("%s: error %v, want %q", tc.name, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if id.MemberID != MemberID(cluster[tc.name], "tok") || id.ClusterID != ClusterID(map[string]uint64{"a": MemberID(cluster["a"], "tok"), "b": MemberID(cluster["b"], "tok")}) {
			t.Fatalf("%s: identity %+v does not follow from --initial-cluster", tc.name, id)
		}
	}
}

// A power cut before WriteID leaves no identity, one after it returns the
// whole one: the file and its rename are synced (invariant 1; without the
// directory sync the identity is lost), and the directories MkdirAllSynced
// made survive (invariant 2).
func TestIdentitySurvivesPowerCut(t *testing.T) {
	want := ID{Name: "a", MemberID: 1, ClusterID: 2}
	fs := vfs.NewCrashableMem()
	if err := MkdirAllSynced(fs, "/data/member"); err != nil {
		t.Fatal(err)
	}
	before := fs.CrashClone(vfs.CrashCloneCfg{})
	if err := WriteID(fs, "/data/member", want); err != nil {
		t.Fatal(err)
	}
	after := fs.CrashClone(vfs.CrashCloneCfg{})
	for _, tc := range []struct {
		name   string
		fs     vfs.FS
		wantOK bool
	}{
		{"cut before WriteID", before, false},
		{"cut after WriteID", after, true},
	} {
		id, ok, err := ReadID(tc.fs, "/data/member")
		if err != nil || ok != tc.wantOK || (ok && id != want) {
			t.Fatalf("%s: ReadID = %+v, %v, %v; want ok=%v and %+v", tc.name, id, ok, err, tc.wantOK, want)
		}
	}
}

// TestEngineChoice: the engine is recorded when the identity is created,
// a restart with the same engine (or, for an identity that predates the
// choice, with Pebble) is accepted, and another engine is refused with an
// error naming both.
func TestEngineChoice(t *testing.T) {
	bootstrap := func() (ID, error) { return ID{Name: "a", MemberID: 1, ClusterID: 2}, nil }
	tests := []struct {
		name     string
		existing *ID    // identity already in the directory; nil: none
		first    string // engine of the first start (when existing is nil)
		restart  string
		wantErr  string
	}{
		{name: "default then default", first: "", restart: ""},
		{name: "default then pebble", first: "", restart: "pebble"},
		{name: "bbolt then bbolt", first: "bbolt", restart: "bbolt"},
		{name: "bbolt then pebble", first: "bbolt", restart: "pebble",
			wantErr: `was bootstrapped with the "bbolt" engine and cannot be opened with --engine pebble (start with --engine bbolt)`},
		{name: "pebble then bbolt", first: "pebble", restart: "bbolt",
			wantErr: `was bootstrapped with the "pebble" engine and cannot be opened with --engine bbolt (start with --engine pebble)`},
		{name: "old identity then pebble", existing: &ID{Name: "a", MemberID: 1, ClusterID: 2}, restart: "pebble"},
		{name: "old identity then bbolt", existing: &ID{Name: "a", MemberID: 1, ClusterID: 2}, restart: "bbolt",
			wantErr: `was bootstrapped with the "pebble" engine`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			if err := MkdirAllSynced(fs, "data"); err != nil {
				t.Fatal(err)
			}
			if tc.existing != nil {
				if err := WriteID(fs, "data", *tc.existing); err != nil {
					t.Fatal(err)
				}
			} else {
				id, err := LoadOrCreateID(fs, "data", tc.first, bootstrap)
				if err != nil {
					t.Fatal(err)
				}
				want := tc.first
				if want == "" {
					want = DefaultEngine
				}
				if id.Engine != want || id.MemberID != 1 {
					t.Fatalf("created identity %+v, want engine %q", id, want)
				}
			}
			id, err := LoadOrCreateID(fs, "data", tc.restart, func() (ID, error) {
				t.Fatal("restart created a new identity")
				return ID{}, nil
			})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("restart: %v", err)
				}
				if id.MemberID != 1 || id.ClusterID != 2 {
					t.Fatalf("restart read %+v", id)
				}
				return
			}
			if !errors.Is(err, ErrEngineMismatch) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("restart error %v, want ErrEngineMismatch with %q", err, tc.wantErr)
			}
		})
	}
}
