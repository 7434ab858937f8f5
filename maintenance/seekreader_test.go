package maintenance

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/strata-kv/strata/engine"
	"github.com/strata-kv/strata/engine/engines"
)

// TestSeekReaderGetsAsGet: on every engine, seekReader's Get answers what
// the view's Get answers, for keys present and absent, in any order, and
// its values stay valid after the next read.
func TestSeekReaderGetsAsGet(t *testing.T) {
	for _, name := range engines.Names() {
		t.Run(name, func(t *testing.T) {
			eng, err := engines.Open(name, t.TempDir(), engines.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer eng.Close()
			b := eng.NewBatch()
			for i := 0; i < 1000; i += 2 {
				if err := b.Set([]byte(fmt.Sprintf("k%04d", i)), []byte(fmt.Sprintf("v%d", i))); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.Commit(1); err != nil {
				t.Fatal(err)
			}
			view, err := eng.NewExportView()
			if err != nil {
				t.Fatal(err)
			}
			defer view.Close()
			sr := &seekReader{Reader: view.Reader()}
			var kept [][]byte
			for _, i := range []int{998, 0, 501, 500, 2, 1001, -1, 999, 4, 3} {
				key := []byte(fmt.Sprintf("k%04d", i))
				want, wantErr := view.Reader().Get(key)
				got, err := sr.Get(key)
				if !bytes.Equal(got, want) || !errors.Is(err, wantErr) {
					t.Errorf("Get(%s) = %q, %v; the view's Get: %q, %v", key, got, err, want, wantErr)
				}
				if wantErr != nil && !errors.Is(err, engine.ErrNotFound) {
					t.Errorf("Get(%s) error %v, want ErrNotFound", key, err)
				}
				kept = append(kept, got)
			}
			if string(kept[0]) != "v998" || string(kept[1]) != "v0" {
				t.Errorf("values read earlier changed: %q", kept)
			}
			if err := sr.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
