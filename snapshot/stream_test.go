package snapshot

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
)

type kv struct{ k, v string }

type sliceSink struct{ got []kv }

func (s *sliceSink) Add(k, v []byte) error {
	s.got = append(s.got, kv{string(k), string(v)})
	return nil
}

func encode(t testing.TB, applied uint64, records []kv) []byte {
	var buf bytes.Buffer
	err := Write(&buf, applied, func(fn func(k, v []byte) error) error {
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
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		records []kv
	}{
		{name: "empty"},
		{name: "one", records: []kv{{"a", "1"}}},
		{name: "empty value", records: []kv{{"a", ""}, {"b", "2"}}},
		{name: "many", records: func() (r []kv) {
			for i := 0; i < 1000; i++ {
				r = append(r, kv{fmt.Sprintf("key%05d", i), string(bytes.Repeat([]byte{byte(i)}, i%300))})
			}
			return r
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := encode(t, 42, tc.records)
			var sink sliceSink
			applied, n, err := Read(bytes.NewReader(data), &sink)
			if err != nil {
				t.Fatal(err)
			}
			if applied != 42 || n != uint64(len(tc.records)) || fmt.Sprint(sink.got) != fmt.Sprint(tc.records) && len(tc.records) > 0 {
				t.Fatalf("got applied %d, %d records %v", applied, n, sink.got)
			}
		})
	}
}

func TestDamageIsDetected(t *testing.T) {
	data := encode(t, 7, []kv{{"a", "1"}, {"b", "22"}, {"c", "333"}})
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{name: "truncated", data: data[:len(data)-3]},
		{name: "flipped value byte", data: flip(data, 17+3)},
		{name: "flipped checksum", data: flip(data, len(data)-1)},
		{name: "bad magic", data: flip(data, 0)},
		{name: "empty", data: nil},
		{name: "out of order", data: encode(t, 7, []kv{{"b", "1"}, {"a", "2"}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Read(bytes.NewReader(tc.data), &sliceSink{})
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Read = %v, want ErrCorrupt", err)
			}
		})
	}
}

func flip(b []byte, i int) []byte {
	c := append([]byte(nil), b...)
	c[i] ^= 0x40
	return c
}

func FuzzRead(f *testing.F) {
	f.Add(encode(f, 3, []kv{{"a", "1"}, {"b", "2"}}))
	f.Add([]byte("STRATASN\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var sink sliceSink
		applied, n, err := Read(bytes.NewReader(data), &sink)
		if err != nil {
			return
		}
		// What decodes must re-encode to the same bytes.
		again := encode(t, applied, sink.got)
		if uint64(len(sink.got)) != n || !bytes.Equal(again, data[:len(again)]) {
			t.Fatalf("decoded stream does not re-encode to its input")
		}
	})
}

// TestSize: Size is the length Write produces, and stops early above its
// limit.
func TestSize(t *testing.T) {
	var records []kv
	for i := 0; i < 300; i++ {
		records = append(records, kv{fmt.Sprintf("key%05d", i), string(bytes.Repeat([]byte{'v'}, i))})
	}
	forEach := func(rs []kv, seen *int) func(fn func(k, v []byte) error) error {
		return func(fn func(k, v []byte) error) error {
			for _, r := range rs {
				*seen++
				if err := fn([]byte(r.k), []byte(r.v)); err != nil {
					return err
				}
			}
			return nil
		}
	}
	for _, tc := range []struct {
		name    string
		records []kv
	}{
		{name: "empty"},
		{name: "one", records: records[:1]},
		{name: "many", records: records},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := int64(len(encode(t, 7, tc.records)))
			var seen int
			got, err := Size(forEach(tc.records, &seen), 1<<40)
			if err != nil || got != want {
				t.Fatalf("Size = %d, %v; Write wrote %d", got, err, want)
			}
			if want < 100 {
				return
			}
			seen = 0
			got, err = Size(forEach(tc.records, &seen), want/2)
			if err != nil || got <= want/2 || seen == len(tc.records) {
				t.Fatalf("Size with limit %d = %d, %v after %d of %d records", want/2, got, err, seen, len(tc.records))
			}
		})
	}
}
