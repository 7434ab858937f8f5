package discovery

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/strata-kv/strata/datadir"
)

// TestKeys: the key layout is etcd's, byte for byte, and the member ID in
// the key is the one --initial-cluster would give the member with the
// token as cluster token.
func TestKeys(t *testing.T) {
	for _, tc := range []struct {
		name, got, want string
	}{
		{name: "size", got: SizeKey("tok"), want: "/_etcd/registry/tok/_config/size"},
		{name: "members", got: MembersPrefix("tok"), want: "/_etcd/registry/tok/members"},
		{name: "member hex unpadded", got: MemberKey("tok", 0x0abc), want: "/_etcd/registry/tok/members/abc"},
		{name: "member max", got: MemberKey("tok", 1<<64-1), want: "/_etcd/registry/tok/members/ffffffffffffffff"},
		{name: "value one URL", got: RegistrationValue("m1", []string{"http://a:2380"}), want: "m1=http://a:2380"},
		{name: "value sorted", got: RegistrationValue("m1", []string{"http://b:2380", "http://a:2380"}), want: "m1=http://a:2380,m1=http://b:2380"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %q, want %q", tc.got, tc.want)
			}
		})
	}
	// etcd's member ID for peer URL http://localhost:2380 and token
	// "etcd-cluster" (membership.NewMember, as in etcd's own tests of
	// the default single-member cluster) is 0x8e9e05c52164694d.
	if id := datadir.MemberID([]string{"http://localhost:2380"}, "etcd-cluster"); id != 0x8e9e05c52164694d {
		t.Errorf("member ID %x, etcd's default member is 8e9e05c52164694d", id)
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        int
		wantErr     bool
	}{
		{name: "three", value: "3", want: 3},
		{name: "one", value: "1", want: 1},
		{name: "zero", value: "0", wantErr: true},
		{name: "negative", value: "-3", wantErr: true},
		{name: "spaces", value: " 3", wantErr: true},
		{name: "word", value: "three", wantErr: true},
		{name: "empty", value: "", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSize([]byte(tc.value))
			if tc.wantErr {
				if !errors.Is(err, ErrBadSizeKey) {
					t.Fatalf("got %d, %v; want ErrBadSizeKey", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// reg is a registration to feed a registry: key suffix, value, revision.
type reg struct {
	id    string
	value string
	rev   int64
}

// TestRegistry: ordering by create revision, what is ignored, the
// cluster-is-full rule and the initial cluster of the first size.
func TestRegistry(t *testing.T) {
	const tok = "tok"
	key := func(id string) string { return MembersPrefix(tok) + "/" + id }
	for _, tc := range []struct {
		name string
		regs []reg
		// ignored counts the registrations add must refuse.
		ignored int
		self    string
		size    int
		full    bool
		want    string
		wantErr error
	}{
		{
			name: "three in order", size: 3, self: "b",
			regs: []reg{{"a", "m1=http://a:1", 5}, {"b", "m2=http://b:1", 6}, {"c", "m3=http://c:1", 7}},
			want: "m1=http://a:1,m2=http://b:1,m3=http://c:1",
		},
		{
			name: "sorted by create revision, not arrival", size: 3, self: "a",
			regs: []reg{{"c", "m3=http://c:1", 9}, {"a", "m1=http://a:1", 5}, {"b", "m2=http://b:1", 7}},
			want: "m1=http://a:1,m2=http://b:1,m3=http://c:1",
		},
		{
			name: "more than size: the first size win", size: 2, self: "b",
			regs: []reg{{"a", "m1=http://a:1", 5}, {"b", "m2=http://b:1", 6}, {"c", "m3=http://c:1", 7}},
			want: "m1=http://a:1,m2=http://b:1",
		},
		{
			name: "full: self not among the first size", size: 3, self: "d", full: true,
			regs: []reg{{"a", "m1=http://a:1", 5}, {"b", "m2=http://b:1", 6}, {"c", "m3=http://c:1", 7}},
		},
		{
			name: "full: self registered too late", size: 2, self: "c", full: true,
			regs: []reg{{"a", "m1=http://a:1", 5}, {"b", "m2=http://b:1", 6}, {"c", "m3=http://c:1", 7}},
		},
		{
			name: "not full: room left", size: 3, self: "d",
			regs: []reg{{"a", "m1=http://a:1", 5}, {"b", "m2=http://b:1", 6}},
			want: "m1=http://a:1,m2=http://b:1",
		},
		{
			name: "not full: empty registry", size: 1, self: "a",
		},
		{
			name: "duplicate key counted once", size: 3, self: "a", ignored: 1,
			regs: []reg{{"a", "m1=http://a:1", 5}, {"a", "m1=http://a:1", 5}, {"b", "m2=http://b:1", 6}},
			want: "m1=http://a:1,m2=http://b:1",
		},
		{
			name: "value without = ignored", size: 3, self: "a", ignored: 1,
			regs: []reg{{"a", "m1=http://a:1", 5}, {"x", "garbage", 6}, {"b", "m2=http://b:1", 7}},
			want: "m1=http://a:1,m2=http://b:1",
		},
		{
			name: "several peer URLs", size: 2, self: "a",
			regs: []reg{{"a", "m1=http://a:1,m1=http://a:2", 5}, {"b", "m2=http://b:1", 6}},
			want: "m1=http://a:1,m1=http://a:2,m2=http://b:1",
		},
		{
			name: "invalid URL", size: 2, self: "a", wantErr: ErrInvalidURL,
			regs: []reg{{"a", "m1=http://a:1", 5}, {"b", "m2=ftp://b:1", 6}},
		},
		{
			name: "duplicate URL", size: 2, self: "a", wantErr: ErrInvalidURL,
			regs: []reg{{"a", "m1=http://a:1", 5}, {"b", "m2=http://a:1", 6}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &registry{token: tok}
			ignored := 0
			for _, g := range tc.regs {
				if err := r.add(key(g.id), g.value, g.rev); err != nil {
					ignored++
				}
			}
			if ignored != tc.ignored {
				t.Errorf("ignored %d registrations, want %d", ignored, tc.ignored)
			}
			if full := r.full(key(tc.self), tc.size); full != tc.full {
				t.Fatalf("full = %v, want %v", full, tc.full)
			}
			if tc.full {
				return
			}
			got, err := r.initialCluster(tc.size)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("got %q, %v; want %v", got, err, tc.wantErr)
				}
				return
			}
			if err != nil && len(tc.regs) > 0 {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("initial cluster %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRegistryRefusesForeignKey(t *testing.T) {
	r := &registry{token: "tok"}
	if err := r.add("/_etcd/registry/other/members/a", "m1=http://a:1", 1); err == nil {
		t.Error("a key of another token was recorded")
	}
}

func TestParseCluster(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string][]string
		wantErr  string
	}{
		{name: "three", in: "m1=http://a:1,m2=http://b:1,m3=https://c:1",
			want: map[string][]string{"m1": {"http://a:1"}, "m2": {"http://b:1"}, "m3": {"https://c:1"}}},
		{name: "two URLs", in: "m1=http://a:1,m1=http://a:2", want: map[string][]string{"m1": {"http://a:1", "http://a:2"}}},
		{name: "unix", in: "m1=unix://sock:1", want: map[string][]string{"m1": {"unix://sock:1"}}},
		{name: "no name", in: "http://a:1", wantErr: "is not name=peerURL"},
		{name: "scheme", in: "m1=ftp://a:1", wantErr: "URL scheme must be http, https, unix, or unixs"},
		{name: "no port", in: "m1=http://a", wantErr: `does not have the form "host:port"`},
		{name: "path", in: "m1=http://a:1/x", wantErr: "URL must not contain a path"},
		{name: "duplicate", in: "m1=http://a:1,m2=http://a:1", wantErr: "has duplicate url http://a:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCluster(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, %v; want %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for n, urls := range tc.want {
				if strings.Join(got[n], ",") != strings.Join(urls, ",") {
					t.Errorf("%s: %v, want %v", n, got[n], urls)
				}
			}
		})
	}
}

func TestEtcdBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 2 * time.Second, 2: 4 * time.Second, 8: 256 * time.Second, 20: 256 * time.Second} {
		if got := etcdBackoff(n); got != want {
			t.Errorf("retry %d: %v, want %v", n, got, want)
		}
	}
}
