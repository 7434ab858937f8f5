package etcddb

import (
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/strata-kv/strata/mvcc"
)

// BenchmarkWrite builds the snapshot of 100,000 versions of 1 KiB random
// values, read from memory: the cost of Write without the engine reads.
func BenchmarkWrite(b *testing.B) {
	const n = 100000
	vs := make([]mvcc.KeyChange, n)
	for i := range vs {
		key := []byte(fmt.Sprintf("user%016d", (i*2654435761)%(1<<40)))
		val := make([]byte, 1024)
		for j := range val {
			val[j] = byte(rand.Uint32())
		}
		vs[i] = mvcc.KeyChange{Main: int64(i + 2), Key: key, KV: &mvccpb.KeyValue{Key: key, Value: val, CreateRevision: int64(i + 2), ModRevision: int64(i + 2), Version: 1}}
	}
	dir := b.TempDir()
	for b.Loop() {
		if _, err := Write(io.Discard, dir, sampleContents(), func(fn func(mvcc.KeyChange) error) error {
			for _, v := range vs {
				if err := fn(v); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}
