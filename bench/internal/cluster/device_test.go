package cluster

import (
	"errors"
	"os"
	"testing"
)

func TestParseSectorsWritten(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		want    int64
		wantErr bool
	}{
		{name: "virtio disk", text: "  131761    33323  6898514    72831   321393    87313 78901664   124195        0    71224   229242    29438        0 74597056    12650   103868    19565\n", want: 78901664},
		{name: "old kernel, 11 fields", text: "1 2 3 4 5 6 7 8 9 10 11\n", want: 7},
		{name: "too short", text: "1 2 3 4 5 6\n", wantErr: true},
		{name: "not a number", text: "1 2 3 4 5 6 x 8\n", wantErr: true},
		{name: "empty", text: "", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSectorsWritten([]byte(tt.text))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("got %d, want %d", got, tt.want)
			}
		})
	}
}

// TestDeviceWrittenBytes checks the counter on the test's temp dir: a file
// written and synced there must show up in the device's count, unless the
// temp dir has no block device (tmpfs), in which case findDevice says so.
func TestDeviceWrittenBytes(t *testing.T) {
	dir := t.TempDir()
	d, err := findDevice(dir)
	if errors.Is(err, errNoDevice) {
		t.Skipf("temp dir has no block device: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	before, err := d.writtenBytes()
	if err != nil {
		t.Fatal(err)
	}
	const size = 1 << 20
	f, err := os.Create(dir + "/f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	after, err := d.writtenBytes() // syncs the file system first
	if err != nil {
		t.Fatal(err)
	}
	if after-before < size {
		t.Errorf("device wrote %d bytes across a synced %d-byte file, want at least that", after-before, size)
	}
}
