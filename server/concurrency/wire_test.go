package concurrency

import (
	"bytes"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/strata-kv/strata/server/concurrency/v3electionpb"
	"github.com/strata-kv/strata/server/concurrency/v3lockpb"
)

// field appends one field in wire format: what etcd's definition says
// each field's number and type are, written by hand so that the test does
// not trust the generated code it checks.
func field(b []byte, num protowire.Number, v any) []byte {
	switch v := v.(type) {
	case int64:
		b = protowire.AppendTag(b, num, protowire.VarintType)
		return protowire.AppendVarint(b, uint64(v))
	case string:
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendString(b, v)
	case []byte: // an embedded message, already encoded
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendBytes(b, v)
	}
	panic("field: unsupported type")
}

func fields(fs ...func([]byte) []byte) []byte {
	var b []byte
	for _, f := range fs {
		b = f(b)
	}
	return b
}

func f(num protowire.Number, v any) func([]byte) []byte {
	return func(b []byte) []byte { return field(b, num, v) }
}

// TestWireFormat checks every message against the field numbers and types
// of etcd's v3election.proto and v3lock.proto.
func TestWireFormat(t *testing.T) {
	hdr := &pb.ResponseHeader{ClusterId: 1, MemberId: 2, Revision: 3, RaftTerm: 4}
	hdrBytes, err := proto.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	kv := &mvccpb.KeyValue{Key: []byte("e/1"), CreateRevision: 5, ModRevision: 6, Version: 2, Value: []byte("v"), Lease: 7}
	kvBytes, err := proto.Marshal(kv)
	if err != nil {
		t.Fatal(err)
	}
	leaderKey := &v3electionpb.LeaderKey{Name: []byte("e"), Key: []byte("e/1"), Rev: 5, Lease: 7}
	leaderBytes := fields(f(1, "e"), f(2, "e/1"), f(3, int64(5)), f(4, int64(7)))
	tests := []struct {
		name string
		msg  proto.Message
		want []byte
	}{
		{"LockRequest", &v3lockpb.LockRequest{Name: []byte("l"), Lease: 9}, fields(f(1, "l"), f(2, int64(9)))},
		{"LockResponse", &v3lockpb.LockResponse{Header: hdr, Key: []byte("l/9")}, fields(f(1, hdrBytes), f(2, "l/9"))},
		{"UnlockRequest", &v3lockpb.UnlockRequest{Key: []byte("l/9")}, fields(f(1, "l/9"))},
		{"UnlockResponse", &v3lockpb.UnlockResponse{Header: hdr}, fields(f(1, hdrBytes))},
		{"CampaignRequest", &v3electionpb.CampaignRequest{Name: []byte("e"), Lease: 7, Value: []byte("v")},
			fields(f(1, "e"), f(2, int64(7)), f(3, "v"))},
		{"CampaignResponse", &v3electionpb.CampaignResponse{Header: hdr, Leader: leaderKey},
			fields(f(1, hdrBytes), f(2, leaderBytes))},
		{"LeaderKey", leaderKey, leaderBytes},
		{"LeaderRequest", &v3electionpb.LeaderRequest{Name: []byte("e")}, fields(f(1, "e"))},
		{"LeaderResponse", &v3electionpb.LeaderResponse{Header: hdr, Kv: kv}, fields(f(1, hdrBytes), f(2, kvBytes))},
		{"ResignRequest", &v3electionpb.ResignRequest{Leader: leaderKey}, fields(f(1, leaderBytes))},
		{"ResignResponse", &v3electionpb.ResignResponse{Header: hdr}, fields(f(1, hdrBytes))},
		{"ProclaimRequest", &v3electionpb.ProclaimRequest{Leader: leaderKey, Value: []byte("w")},
			fields(f(1, leaderBytes), f(2, "w"))},
		{"ProclaimResponse", &v3electionpb.ProclaimResponse{Header: hdr}, fields(f(1, hdrBytes))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := proto.MarshalOptions{Deterministic: true}.Marshal(tc.msg)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, tc.want) {
				t.Errorf("encoding\n got %x\nwant %x", got, tc.want)
			}
			if name := string(tc.msg.ProtoReflect().Descriptor().FullName()); name != "v3lockpb."+tc.name && name != "v3electionpb."+tc.name {
				t.Errorf("full name %s, want etcd's", name)
			}
		})
	}
}

// TestMethodNames checks the gRPC paths clients call: etcd's.
func TestMethodNames(t *testing.T) {
	tests := []struct{ got, want string }{
		{v3lockpb.Lock_Lock_FullMethodName, "/v3lockpb.Lock/Lock"},
		{v3lockpb.Lock_Unlock_FullMethodName, "/v3lockpb.Lock/Unlock"},
		{v3electionpb.Election_Campaign_FullMethodName, "/v3electionpb.Election/Campaign"},
		{v3electionpb.Election_Proclaim_FullMethodName, "/v3electionpb.Election/Proclaim"},
		{v3electionpb.Election_Leader_FullMethodName, "/v3electionpb.Election/Leader"},
		{v3electionpb.Election_Observe_FullMethodName, "/v3electionpb.Election/Observe"},
		{v3electionpb.Election_Resign_FullMethodName, "/v3electionpb.Election/Resign"},
	}
	for _, tc := range tests {
		if tc.got != tc.want {
			t.Errorf("method %s, want %s", tc.got, tc.want)
		}
	}
}

func TestPrefixEnd(t *testing.T) {
	tests := []struct {
		name, pfx string
		want      []byte
	}{
		{"election prefix", "e/", []byte("e0")},
		{"trailing 0xff dropped", "a\xff", []byte("b")},
		{"all 0xff means every key", "\xff\xff", []byte{0}},
		{"empty means every key", "", []byte{0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := prefixEnd(tc.pfx); !bytes.Equal(got, tc.want) {
				t.Errorf("prefixEnd(%q) = %q, want %q", tc.pfx, got, tc.want)
			}
		})
	}
}

func TestOwnKey(t *testing.T) {
	// etcd's recipe: "%s%x" of the prefix and the lease ID.
	if got, want := ownKey("lock/", 0x694d7a1b2c3d4e5f), "lock/694d7a1b2c3d4e5f"; got != want {
		t.Errorf("ownKey = %q, want %q", got, want)
	}
}
