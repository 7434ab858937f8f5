package mvcc

import (
	"bytes"
	"math"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

func TestAppendKVMatchesMarshal(t *testing.T) {
	for _, tc := range []struct {
		name string
		kv   *mvccpb.KeyValue
	}{
		{"empty", &mvccpb.KeyValue{}},
		{"tombstone", &mvccpb.KeyValue{Key: []byte("k")}},
		{"new key", &mvccpb.KeyValue{Key: []byte("k"), Value: []byte("v"), CreateRevision: 7, ModRevision: 7, Version: 1}},
		{"empty value", &mvccpb.KeyValue{Key: []byte("k"), CreateRevision: 2, ModRevision: 9, Version: 3}},
		{"lease", &mvccpb.KeyValue{Key: []byte("k"), Value: []byte("v"), CreateRevision: 1, ModRevision: 1, Version: 1, Lease: 0x1234567890}},
		{"negative", &mvccpb.KeyValue{Key: []byte("k"), CreateRevision: -1, ModRevision: math.MinInt64, Version: -5, Lease: -1}},
		{"max", &mvccpb.KeyValue{Key: bytes.Repeat([]byte{0xff}, 300), Value: bytes.Repeat([]byte{0}, 1<<16), CreateRevision: math.MaxInt64,
			ModRevision: math.MaxInt64, Version: math.MaxInt64, Lease: math.MaxInt64}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkAppendKV(t, tc.kv)
		})
	}
}

// FuzzAppendKV holds appendKV to proto.Marshal for any field values.
func FuzzAppendKV(f *testing.F) {
	f.Add([]byte("k"), []byte("v"), int64(1), int64(2), int64(3), int64(0))
	f.Add([]byte{}, []byte{}, int64(-1), int64(0), int64(math.MaxInt64), int64(math.MinInt64))
	f.Fuzz(func(t *testing.T, key, value []byte, create, mod, version, lease int64) {
		checkAppendKV(t, &mvccpb.KeyValue{Key: key, Value: value, CreateRevision: create, ModRevision: mod, Version: version, Lease: lease})
	})
}

func checkAppendKV(t *testing.T, kv *mvccpb.KeyValue) {
	t.Helper()
	want, err := proto.Marshal(kv)
	if err != nil {
		t.Fatal(err)
	}
	prefix := []byte("prefix")
	got := appendKV(append([]byte(nil), prefix...), kv)
	if !bytes.Equal(got[:len(prefix)], prefix) || !bytes.Equal(got[len(prefix):], want) {
		t.Fatalf("appendKV = %x, proto.Marshal = %x", got[len(prefix):], want)
	}
	if n := kvSize(kv); n != len(want) {
		t.Fatalf("kvSize = %d, proto.Marshal wrote %d bytes", n, len(want))
	}
}
