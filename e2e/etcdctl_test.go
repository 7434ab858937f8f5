package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/internal/testutil"
)

// ctlCase is one etcdctl command and what the user must see.
type ctlCase struct {
	name  string
	args  []string
	stdin string
	// wantCode is the exit code; wantStdout, if not empty, is the whole of
	// stdout; wantStderr, if not empty, is a substring of stderr.
	wantCode   int
	wantStdout string
	wantStderr string
	// check, if set, makes further assertions on the result.
	check func(t *testing.T, p *testutil.Process, res testutil.Result)
}

// ctlCases run in order on a fresh server; the revisions in comments are
// the store's revision after each write.
func ctlCases() []ctlCase {
	return []ctlCase{
		{name: "put a", args: []string{"put", "a", "1"}, wantStdout: "OK\n"},         // 2
		{name: "put b", args: []string{"put", "b", "2"}, wantStdout: "OK\n"},         // 3
		{name: "put foo/x", args: []string{"put", "foo/x", "3"}, wantStdout: "OK\n"}, // 4
		{name: "put foo/y", args: []string{"put", "foo/y", "4"}, wantStdout: "OK\n"}, // 5
		{name: "get a", args: []string{"get", "a"}, wantStdout: "a\n1\n"},
		{name: "get missing key", args: []string{"get", "nokey"}, wantStdout: ""},
		{name: "get --prefix", args: []string{"get", "--prefix", "foo/"}, wantStdout: "foo/x\n3\nfoo/y\n4\n"},
		{name: "get --from-key", args: []string{"get", "--from-key", "b"}, wantStdout: "b\n2\nfoo/x\n3\nfoo/y\n4\n"},
		{name: "get range [a, foo/y)", args: []string{"get", "a", "foo/y"}, wantStdout: "a\n1\nb\n2\nfoo/x\n3\n"},
		{name: "get --limit", args: []string{"get", "--prefix", "", "--limit", "2"}, wantStdout: "a\n1\nb\n2\n"},
		{name: "put a again", args: []string{"put", "a", "11"}, wantStdout: "OK\n"}, // 6
		{name: "get --rev old", args: []string{"get", "a", "--rev", "2"}, wantStdout: "a\n1\n"},
		{name: "get --rev before the key existed", args: []string{"get", "a", "--rev", "1"}, wantStdout: ""},
		{name: "get --rev future", args: []string{"get", "a", "--rev", "100"},
			wantCode: 1, wantStderr: "etcdserver: mvcc: required revision is a future revision"},
		{name: "get --sort-by MODIFY --order DESCEND", args: []string{"get", "--prefix", "", "--sort-by=MODIFY", "--order=DESCEND"},
			wantStdout: "a\n11\nfoo/y\n4\nfoo/x\n3\nb\n2\n"},
		{name: "get --sort-by VALUE --order ASCEND", args: []string{"get", "--prefix", "", "--sort-by=VALUE", "--order=ASCEND"},
			wantStdout: "a\n11\nb\n2\nfoo/x\n3\nfoo/y\n4\n"},
		{name: "get --sort-by KEY --order DESCEND --limit", args: []string{"get", "--prefix", "", "--sort-by=KEY", "--order=DESCEND", "--limit=2"},
			wantStdout: "foo/y\n4\nfoo/x\n3\n"},
		{name: "get --keys-only", args: []string{"get", "--prefix", "", "--keys-only"}, wantStdout: "a\n\nb\n\nfoo/x\n\nfoo/y\n\n"},
		{name: "get --print-value-only", args: []string{"get", "--prefix", "", "--print-value-only"}, wantStdout: "11\n2\n3\n4\n"},
		{name: "get --count-only", args: []string{"get", "--prefix", "", "--count-only", "-w", "fields"},
			check: func(t *testing.T, _ *testutil.Process, res testutil.Result) {
				for _, want := range []string{`"Count" : 4`, `"Revision" : 6`, `"More" : false`} {
					if !strings.Contains(res.Stdout, want) {
						t.Errorf("stdout lacks %s:\n%s", want, res.Stdout)
					}
				}
			}},
		{name: "get -w json", args: []string{"get", "a", "-w", "json"}, check: checkGetJSON},
		{name: "get -w protobuf", args: []string{"get", "a", "-w", "protobuf"}, check: checkGetProtobuf},
		{name: "get --limit -w json says more", args: []string{"get", "--prefix", "", "--limit", "1", "-w", "json"},
			check: func(t *testing.T, _ *testutil.Process, res testutil.Result) {
				var got struct {
					Kvs   []json.RawMessage `json:"kvs"`
					More  bool              `json:"more"`
					Count int64             `json:"count"`
				}
				if err := json.Unmarshal([]byte(res.Stdout), &got); err != nil {
					t.Fatalf("stdout is not JSON: %v\n%s", err, res.Stdout)
				}
				if len(got.Kvs) != 1 || !got.More || got.Count != 4 {
					t.Errorf("got %d kvs, more=%v, count=%d; want 1 kv, more=true, count=4", len(got.Kvs), got.More, got.Count)
				}
			}},
		{name: "del --prev-kv", args: []string{"del", "--prev-kv", "a"}, wantStdout: "1\na\n11\n"}, // 7
		{name: "del --prefix", args: []string{"del", "--prefix", "foo/"}, wantStdout: "2\n"},       // 8
		{name: "del of a missing key", args: []string{"del", "nokey"}, wantStdout: "0\n"},
		{name: "get after deletes", args: []string{"get", "--prefix", ""}, wantStdout: "b\n2\n"},
		{name: "txn -i takes the success branch", args: []string{"txn", "-i"}, // 9
			stdin:      "value(\"b\") = \"2\"\n\nput b 3\nget b\n\nput c 9\n\n",
			wantStdout: "compares:\nsuccess requests (get, put, del):\nfailure requests (get, put, del):\nSUCCESS\n\nOK\n\nb\n3\n"},
		{name: "txn -i takes the failure branch", args: []string{"txn", "-i"}, // 10
			stdin:      "mod(\"b\") < \"9\"\nversion(\"b\") = \"2\"\n\nput b 4\n\nput c 9\nget c\n\n",
			wantStdout: "compares:\nsuccess requests (get, put, del):\nfailure requests (get, put, del):\nFAILURE\n\nOK\n\nc\n9\n"},
		{name: "txn from stdin without -i", args: []string{"txn"}, // 11
			stdin:      "create(\"c\") > \"0\"\n\ndel c\n\n\n",
			wantStdout: "SUCCESS\n\n1\n"},
		{name: "compaction", args: []string{"compaction", "3"}, wantStdout: "compacted revision 3\n"},
		{name: "compaction --physical", args: []string{"compaction", "--physical", "5"}, wantStdout: "compacted revision 5\n"},
		{name: "get below the compaction", args: []string{"get", "b", "--rev", "4"},
			wantCode: 1, wantStderr: "etcdserver: mvcc: required revision has been compacted"},
		{name: "get at the compaction", args: []string{"get", "b", "--rev", "5"}, wantStdout: "b\n2\n"},
		{name: "compaction again below it", args: []string{"compaction", "4"},
			wantCode: 1, wantStderr: "etcdserver: mvcc: required revision has been compacted"},
		{name: "endpoint status", args: []string{"endpoint", "status"}, check: checkEndpointStatusTable},
		{name: "endpoint status -w json", args: []string{"endpoint", "status", "-w", "json"}, check: checkEndpointStatusJSON},
		{name: "endpoint health", args: []string{"endpoint", "health"},
			check: func(t *testing.T, p *testutil.Process, res testutil.Result) {
				re := regexp.MustCompile(`^` + regexp.QuoteMeta(p.Endpoint()) + ` is healthy: successfully committed proposal: took = \S+\n$`)
				if !re.MatchString(res.Stdout) {
					t.Errorf("stdout does not match %s:\n%q", re, res.Stdout)
				}
			}},
		{name: "member list", args: []string{"member", "list"},
			check: func(t *testing.T, p *testutil.Process, res testutil.Result) {
				re := regexp.MustCompile(`^[0-9a-f]+, started, ` + p.Name() + `, ` + regexp.QuoteMeta(p.PeerURL()) + `, ` +
					regexp.QuoteMeta(p.Endpoint()) + `, false\n$`)
				if !re.MatchString(res.Stdout) {
					t.Errorf("stdout does not match %s:\n%q", re, res.Stdout)
				}
			}},
	}
}

// checkGetJSON checks `get a -w json` after a was put twice (revisions 2
// and 6): etcdctl prints the RangeResponse with base64 keys and values.
func checkGetJSON(t *testing.T, _ *testutil.Process, res testutil.Result) {
	var got struct {
		Header struct {
			ClusterID uint64 `json:"cluster_id"`
			MemberID  uint64 `json:"member_id"`
			Revision  int64  `json:"revision"`
			RaftTerm  uint64 `json:"raft_term"`
		} `json:"header"`
		Kvs []struct {
			Key            []byte `json:"key"`
			Value          []byte `json:"value"`
			CreateRevision int64  `json:"create_revision"`
			ModRevision    int64  `json:"mod_revision"`
			Version        int64  `json:"version"`
		} `json:"kvs"`
		Count int64 `json:"count"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &got); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, res.Stdout)
	}
	if got.Header.ClusterID == 0 || got.Header.MemberID == 0 || got.Header.RaftTerm == 0 || got.Header.Revision != 6 {
		t.Errorf("header = %+v; want non-zero cluster_id, member_id, raft_term and revision 6", got.Header)
	}
	if got.Count != 1 || len(got.Kvs) != 1 {
		t.Fatalf("count=%d with %d kvs; want 1 and 1:\n%s", got.Count, len(got.Kvs), res.Stdout)
	}
	kv := got.Kvs[0]
	if string(kv.Key) != "a" || string(kv.Value) != "11" || kv.CreateRevision != 2 || kv.ModRevision != 6 || kv.Version != 2 {
		t.Errorf("kv = {key %q value %q create %d mod %d version %d}; want {a 11 2 6 2}",
			kv.Key, kv.Value, kv.CreateRevision, kv.ModRevision, kv.Version)
	}
}

// checkEndpointStatusTable checks the simple format's columns that do not
// depend on the implementation: endpoint, member ID, leader, learner, term
// and index fields being numbers.
func checkEndpointStatusTable(t *testing.T, p *testutil.Process, res testutil.Result) {
	fields := strings.Split(strings.TrimSuffix(res.Stdout, "\n"), ", ")
	// ENDPOINT, ID, VERSION, STORAGE VERSION, DB SIZE, IN USE, PERCENTAGE
	// NOT IN USE, QUOTA, IS LEADER, IS LEARNER, RAFT TERM, RAFT INDEX,
	// RAFT APPLIED INDEX, ERRORS, DOWNGRADE TARGET VERSION, DOWNGRADE ENABLED
	if len(fields) < 13 || strings.Count(res.Stdout, "\n") != 1 {
		t.Fatalf("want one line of at least 13 comma-separated fields, got:\n%q", res.Stdout)
	}
	if fields[0] != p.Endpoint() {
		t.Errorf("endpoint = %q, want %q", fields[0], p.Endpoint())
	}
	if !regexp.MustCompile(`^[0-9a-f]+$`).MatchString(fields[1]) {
		t.Errorf("member ID = %q, want hex", fields[1])
	}
	if fields[8] != "true" || fields[9] != "false" {
		t.Errorf("is leader, is learner = %s, %s; want true, false", fields[8], fields[9])
	}
	for _, i := range []int{10, 11, 12} {
		if !regexp.MustCompile(`^[1-9][0-9]*$`).MatchString(fields[i]) {
			t.Errorf("field %d (raft term/index) = %q, want a positive number", i, fields[i])
		}
	}
}

// checkEndpointStatusJSON checks the status a client sees: this member is
// the leader, the header revision is the store's, and raft indexes agree.
func checkEndpointStatusJSON(t *testing.T, p *testutil.Process, res testutil.Result) {
	var got []struct {
		Endpoint string
		Status   struct {
			Header struct {
				MemberID uint64 `json:"member_id"`
				Revision int64  `json:"revision"`
			} `json:"header"`
			Version          string `json:"version"`
			Leader           uint64 `json:"leader"`
			RaftIndex        uint64 `json:"raftIndex"`
			RaftTerm         uint64 `json:"raftTerm"`
			RaftAppliedIndex uint64 `json:"raftAppliedIndex"`
		}
	}
	if err := json.Unmarshal([]byte(res.Stdout), &got); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, res.Stdout)
	}
	if len(got) != 1 {
		t.Fatalf("want one endpoint, got %d:\n%s", len(got), res.Stdout)
	}
	s := got[0].Status
	if got[0].Endpoint != p.Endpoint() {
		t.Errorf("endpoint = %q, want %q", got[0].Endpoint, p.Endpoint())
	}
	if s.Header.MemberID == 0 || s.Leader != s.Header.MemberID {
		t.Errorf("leader = %x, member = %x; want the single member to lead", s.Leader, s.Header.MemberID)
	}
	if s.Header.Revision != 11 {
		t.Errorf("header revision = %d, want 11", s.Header.Revision)
	}
	if s.Version == "" || s.RaftTerm == 0 || s.RaftIndex == 0 || s.RaftAppliedIndex == 0 || s.RaftAppliedIndex > s.RaftIndex {
		t.Errorf("status = %+v; want a version, non-zero term and indexes, applied <= index", s)
	}
}

// TestEtcdctl runs etcdctl commands in order against strata and checks what
// the user sees. It runs against etcd too, which proves the expectations.
func TestEtcdctl(t *testing.T) {
	t.Parallel()
	for _, f := range flavors {
		t.Run(string(f), func(t *testing.T) {
			t.Parallel()
			p := start(t, f)
			for _, c := range ctlCases() {
				args := append([]string{"--endpoints=" + p.Endpoint(), "--command-timeout=10s"}, c.args...)
				res := testutil.RunToExit(t, 20*time.Second, c.stdin, nil, bins.Etcdctl, args...)
				desc := fmt.Sprintf("%s: etcdctl %s", c.name, strings.Join(c.args, " "))
				if res.Code != c.wantCode {
					t.Errorf("%s: exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", desc, res.Code, c.wantCode, res.Stdout, res.Stderr)
					continue
				}
				if c.wantStdout != "" || (c.check == nil && c.wantStderr == "") {
					if res.Stdout != c.wantStdout {
						t.Errorf("%s: stdout differs (- want, + got):\n%s", desc, lineDiff(c.wantStdout, res.Stdout))
					}
				}
				if c.wantStderr != "" && !strings.Contains(res.Stderr, c.wantStderr) {
					t.Errorf("%s: stderr lacks %q:\n%s", desc, c.wantStderr, res.Stderr)
				}
				if c.check != nil {
					t.Run(c.name, func(t *testing.T) { c.check(t, p, res) })
				}
			}
		})
	}
}

// checkGetProtobuf: `etcdctl get a -w protobuf` prints the RangeResponse's
// bytes as the server sent them. They must be etcd's encoding of etcd's
// message (the bytes etcd's own marshalling gives back, field for field:
// no field etcd leaves out, none it writes missing), holding a at the
// revisions the cases before wrote (issue 14 item 7: a header whose bytes
// differed from etcd's).
func checkGetProtobuf(t *testing.T, _ *testutil.Process, res testutil.Result) {
	raw := []byte(res.Stdout)
	var r pb.RangeResponse
	if err := proto.Unmarshal(raw, &r); err != nil {
		t.Fatalf("decode the RangeResponse: %v (%x)", err, raw)
	}
	again, err := proto.MarshalOptions{Deterministic: true}.Marshal(&r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, raw) {
		t.Errorf("the response's bytes are not etcd's encoding of it:\n got %x\nwant %x", raw, again)
	}
	h := r.GetHeader()
	if h.GetClusterId() == 0 || h.GetMemberId() == 0 || h.GetRaftTerm() == 0 || h.GetRevision() != 6 {
		t.Errorf("header %+v; want cluster and member IDs, a raft term and revision 6", h)
	}
	if len(r.GetKvs()) != 1 || r.GetCount() != 1 || r.GetMore() {
		t.Fatalf("response %+v; want the one key a", &r)
	}
	kv := r.GetKvs()[0]
	if string(kv.GetKey()) != "a" || string(kv.GetValue()) != "11" || kv.GetCreateRevision() != 2 || kv.GetModRevision() != 6 || kv.GetVersion() != 2 || kv.GetLease() != 0 {
		t.Errorf("kv %+v; want a=11 created at 2, modified at 6, version 2", kv)
	}
}
