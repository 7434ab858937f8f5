package memberlist

import (
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

func TestMarkLoggerURL(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
		wantErr        bool
	}{
		{name: "plain", in: "http://127.0.0.1:2479", want: "http://127.0.0.1:2479/strata-logger"},
		{name: "root path", in: "https://l1:2479/", want: "https://l1:2479/strata-logger"},
		{name: "already marked", in: "http://l1:2479/strata-logger", want: "http://l1:2479/strata-logger"},
		{name: "other path", in: "http://l1:2479/v3", wantErr: true},
		{name: "no host", in: "l1:2479", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := MarkLoggerURL(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("MarkLoggerURL(%q) = %q, %v; want %q (error %v)", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestIsLogger(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *pb.Member
		want bool
	}{
		{name: "nil", m: nil},
		{name: "unstarted learner", m: &pb.Member{IsLearner: true}},
		{name: "strata member", m: &pb.Member{Name: "m1", ClientURLs: []string{"http://127.0.0.1:2379"}}},
		{name: "learner", m: &pb.Member{Name: "m4", IsLearner: true, ClientURLs: []string{"http://127.0.0.1:2379"}}},
		{name: "logger", m: &pb.Member{Name: "L1", IsLearner: true, ClientURLs: []string{"http://127.0.0.1:2479/strata-logger"}}, want: true},
		{name: "logger, second URL", m: &pb.Member{Name: "L1", IsLearner: true,
			ClientURLs: []string{"http://a:1", "https://l1:2479/strata-logger/"}}, want: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsLogger(tc.m); got != tc.want {
				t.Fatalf("IsLogger(%v) = %v, want %v", tc.m, got, tc.want)
			}
		})
	}
}
