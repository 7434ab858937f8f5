package main

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestParseConnClients(t *testing.T) {
	tests := []struct {
		in      string
		want    []connClients
		wantErr bool
	}{
		{in: "1/1", want: []connClients{{1, 1}}},
		{in: "1/1, 10/10,100/1000", want: []connClients{{1, 1}, {10, 10}, {100, 1000}}},
		{in: "10", wantErr: true},
		{in: "0/1", wantErr: true},
		{in: "a/b", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseConnClients(tt.in)
		if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseConnClients(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseInt64s(t *testing.T) {
	tests := []struct {
		in      string
		want    []int64
		wantErr bool
	}{
		{in: "10000,1000000", want: []int64{10000, 1000000}},
		{in: "1e4, 1e6", want: []int64{10000, 1000000}},
		{in: "1.5", wantErr: true},
		{in: "0", wantErr: true},
		{in: "x", wantErr: true},
		{in: ",", wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseInt64s(tt.in)
		if (err != nil) != tt.wantErr || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseInt64s(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestFindRepo(t *testing.T) {
	root := t.TempDir()
	sub := filepath.Join(root, "bench", "deep")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	// The bench module's own go.mod on the way up must not be taken for
	// the repository root.
	if err := os.WriteFile(filepath.Join(root, "bench", "go.mod"), []byte("module "+rootModule+"/bench\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("// strata\nmodule "+rootModule+"\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := findRepo(sub)
	if err != nil || got != root {
		t.Errorf("findRepo = %q, %v; want %q", got, err, root)
	}
	if _, err := findRepo(t.TempDir()); err == nil {
		t.Error("findRepo outside any repository succeeded")
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{name: "no subcommand", args: nil},
		{name: "unknown subcommand", args: []string{"frobnicate"}},
		{name: "bad flag value", args: []string{"put", "-put-configs", "x"}},
		{name: "stray argument", args: []string{"put", "extra"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := run(tt.args); err == nil {
				t.Errorf("run(%q) succeeded", tt.args)
			}
		})
	}
}
