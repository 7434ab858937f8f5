package snapshot

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"testing"
)

func encodeBackup(t testing.TB, applied uint64, records []kv) []byte {
	t.Helper()
	var buf bytes.Buffer
	n, err := WriteBackup(&buf, applied, func(fn func(k, v []byte) error) error {
		for _, r := range records {
			if err := fn([]byte(r.k), []byte(r.v)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteBackup reported %d bytes, wrote %d", n, buf.Len())
	}
	return buf.Bytes()
}

// A backup has etcdctl's shape (size mod 512 = 32, a sha256 trailer) and
// decodes back to its records.
func TestBackupRoundTrip(t *testing.T) {
	big := string(bytes.Repeat([]byte("v"), 3000))
	for _, tc := range []struct {
		name    string
		records []kv
	}{
		{name: "empty"},
		{name: "one", records: []kv{{"a", "1"}}},
		{name: "crosses blocks", records: []kv{{"a", big}, {"b", big}, {"c", ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := encodeBackup(t, 42, tc.records)
			if len(raw)%BackupAlign != sha256.Size {
				t.Fatalf("%d bytes: not a multiple of %d plus 32", len(raw), BackupAlign)
			}
			if sum := sha256.Sum256(raw[:len(raw)-32]); !bytes.Equal(sum[:], raw[len(raw)-32:]) {
				t.Fatal("trailer is not the sha256 of the body")
			}
			var sink sliceSink
			applied, n, err := ReadBackup(bytes.NewReader(raw), int64(len(raw)), &sink)
			if err != nil {
				t.Fatal(err)
			}
			if applied != 42 || n != uint64(len(tc.records)) || len(sink.got) != len(tc.records) {
				t.Fatalf("read applied %d, %d records (%d sunk); want 42, %d", applied, n, len(sink.got), len(tc.records))
			}
			for i := range tc.records {
				if sink.got[i] != tc.records[i] {
					t.Errorf("record %d = %v, want %v", i, sink.got[i], tc.records[i])
				}
			}
		})
	}
}

// Damage is refused before any record reaches the sink.
func TestBackupDamage(t *testing.T) {
	raw := encodeBackup(t, 7, []kv{{"a", "1"}, {"b", "2"}})
	for _, tc := range []struct {
		name   string
		damage func([]byte) []byte
		want   error
	}{
		{name: "flipped body byte", damage: func(b []byte) []byte { b[20] ^= 1; return b }, want: ErrBackupChecksum},
		{name: "flipped digest byte", damage: func(b []byte) []byte { b[len(b)-1] ^= 1; return b }, want: ErrBackupChecksum},
		{name: "truncated", damage: func(b []byte) []byte { return b[:len(b)-1] }, want: ErrCorrupt},
		{name: "digest missing", damage: func(b []byte) []byte { return b[:len(b)-32] }, want: ErrCorrupt},
		{name: "empty", damage: func(b []byte) []byte { return nil }, want: ErrCorrupt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.damage(bytes.Clone(raw))
			var sink sliceSink
			_, _, err := ReadBackup(bytes.NewReader(b), int64(len(b)), &sink)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
			if len(sink.got) != 0 {
				t.Fatalf("%d records reached the sink", len(sink.got))
			}
		})
	}
}

// A padded body with a valid digest but a broken stream inside is refused
// by the stream decoder.
func TestBackupValidDigestBadStream(t *testing.T) {
	body := make([]byte, BackupAlign)
	copy(body, "STRATASN\x02")
	sum := sha256.Sum256(body)
	raw := append(body, sum[:]...)
	if _, _, err := ReadBackup(bytes.NewReader(raw), int64(len(raw)), &sliceSink{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("err %v, want ErrCorrupt", err)
	}
}

// FuzzReadBackup: no input makes ReadBackup panic or hang; whatever it
// accepts carries a matching digest.
func FuzzReadBackup(f *testing.F) {
	f.Add(encodeBackup(f, 1, []kv{{"a", "1"}}))
	f.Add(encodeBackup(f, 0, nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, err := ReadBackup(bytes.NewReader(b), int64(len(b)), &sliceSink{})
		if err == nil {
			if sum := sha256.Sum256(b[:len(b)-32]); !bytes.Equal(sum[:], b[len(b)-32:]) {
				t.Fatal("accepted a backup whose digest does not match")
			}
		}
	})
}
