package backup

import (
	"context"
	"errors"
	"github.com/cockroachdb/pebble/v2/vfs"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func newService(t *testing.T, m *member, opts Options) *Service {
	t.Helper()
	s, err := OpenService(ServiceConfig{Options: opts, Engine: m.eng, ID: testID, StagingDir: filepath.Join(t.TempDir(), "staging"),
		Term: func(uint64) (uint64, error) { return 7, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// waitFor polls cond every millisecond for at most 20 seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 20 s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestServiceStaging: OpenService removes the checkpoints a crash left in
// the staging directory, and nothing else.
func TestServiceStaging(t *testing.T) {
	m := newMember(t)
	staging := filepath.Join(t.TempDir(), "backup.tmp")
	left := filepath.Join(staging, stagingPrefix+"123", "engine")
	if err := os.MkdirAll(left, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(left, "000001.sst"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(staging, "keep-me")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenService(ServiceConfig{Engine: m.eng, StagingDir: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(left)); !os.IsNotExist(err) {
		t.Errorf("crashed checkpoint still there: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another file removed: %v", err)
	}
}

// TestServiceBadConfig: what OpenService refuses without reaching a
// target.
func TestServiceBadConfig(t *testing.T) {
	m := newMember(t)
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{name: "interval without target", opts: Options{Interval: time.Second}},
		{name: "negative interval", opts: Options{Target: "file:///x", Interval: -time.Second}},
		{name: "unknown scheme", opts: Options{Target: "ftp://host/x"}},
		{name: "log interval without interval", opts: Options{Target: "file:///x", LogInterval: time.Second}},
		{name: "negative log interval", opts: Options{Target: "file:///x", Interval: time.Second, LogInterval: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := OpenService(ServiceConfig{Options: tc.opts, Engine: m.eng, StagingDir: t.TempDir()}); err == nil {
				t.Errorf("OpenService(%+v) succeeded", tc.opts)
			}
		})
	}
}

// TestServiceCreate: a version into the member's own target and into
// another; Stats counts both; the refusals.
func TestServiceCreate(t *testing.T) {
	m := newMember(t)
	m.put("a", 10, 100)
	own, other := fileTarget(t), fileTarget(t)
	s := newService(t, m, Options{Target: own.String()})
	ctx := context.Background()
	for _, url := range []string{"", own.String(), other.String()} {
		if _, err := s.Create(ctx, url); err != nil {
			t.Fatalf("Create(%q): %v", url, err)
		}
	}
	for target, want := range map[*FileTarget]int{own: 2, other: 1} {
		list, err := List(ctx, target)
		if err != nil || len(list) != want {
			t.Errorf("%s holds %d versions (%v), want %d", target, len(list), err, want)
		}
	}
	if st := s.Stats(); st.Versions != 3 || st.Failures != 0 || st.Durations.Count != 3 || st.LastSuccess.IsZero() {
		t.Errorf("stats %+v, want 3 versions", st)
	}
	if _, err := s.Create(ctx, "ftp://x/y"); err == nil {
		t.Error("Create into ftp:// succeeded")
	}
	none := newService(t, m, Options{})
	if _, err := none.Create(ctx, ""); !errors.Is(err, ErrNoTarget) {
		t.Errorf("Create without a target = %v, want ErrNoTarget", err)
	}
}

// TestServiceVersionIndex: VersionIndex is 0 while the member's own target
// holds no version, then the newest version's raft index, read again only
// after the refresh period; without a target of its own it is
// ErrNoTarget.
func TestServiceVersionIndex(t *testing.T) {
	m := newMember(t)
	m.put("a", 10, 100)
	own := fileTarget(t)
	s := newService(t, m, Options{Target: own.String()})
	ctx := context.Background()
	if got, err := s.VersionIndex(ctx); err != nil || got != 0 {
		t.Fatalf("VersionIndex with no version = %d, %v; want 0", got, err)
	}
	v, err := s.Create(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if v.RaftIndex == 0 {
		t.Fatalf("version %+v has no raft index", v)
	}
	if got, err := s.VersionIndex(ctx); err != nil || got != 0 {
		t.Errorf("VersionIndex within the refresh period = %d, %v; want the 0 read before", got, err)
	}
	s.indexRefresh = 0
	if got, err := s.VersionIndex(ctx); err != nil || got != v.RaftIndex {
		t.Errorf("VersionIndex = %d, %v; want the version's %d", got, err, v.RaftIndex)
	}
	m.put("b", 10, 100)
	v2, err := s.Create(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.VersionIndex(ctx); err != nil || got != v2.RaftIndex || v2.RaftIndex <= v.RaftIndex {
		t.Errorf("VersionIndex = %d, %v; want the newer version's %d (the first was at %d)", got, err, v2.RaftIndex, v.RaftIndex)
	}
	none := newService(t, m, Options{})
	if _, err := none.VersionIndex(ctx); !errors.Is(err, ErrNoTarget) {
		t.Errorf("VersionIndex without a target = %v, want ErrNoTarget", err)
	}
}

// TestServiceRunLeaderOnly: the continuous mode takes versions only while
// the member leads, and prunes after each.
func TestServiceRunLeaderOnly(t *testing.T) {
	m := newMember(t)
	m.put("a", 10, 100)
	target := fileTarget(t)
	raft := &switchableLeader{}
	s, err := OpenService(ServiceConfig{
		Options: Options{Target: target.String(), Interval: time.Millisecond, Keep: Retention{KeepLast: 1}},
		Engine:  m.eng, ID: testID, StagingDir: t.TempDir(), Raft: raft, MemberID: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	waitFor(t, "three ticks as a follower", func() bool { return raft.asked.Load() >= 3 })
	if st := s.Stats(); st.Versions != 0 || st.Failures != 0 {
		t.Fatalf("a follower took versions: %+v", st)
	}
	raft.leader.Store(true)
	waitFor(t, "three versions as the leader", func() bool { return s.Stats().Versions >= 3 })
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	list, err := List(context.Background(), target)
	if err != nil || len(list) == 0 || len(list) > 2 {
		t.Errorf("after keep-last 1: %d versions (%v)", len(list), err)
	}
}

// blockingTarget is a file target whose Put waits for its context.
type blockingTarget struct {
	*FileTarget
	entered chan struct{}
	// returned is set when a Put has returned, its context cancelled.
	returned atomic.Bool
}

func (b *blockingTarget) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	select {
	case b.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	b.returned.Store(true)
	return ctx.Err()
}

// TestServiceClose: Close cancels a version under way and waits for it;
// a Create after Close is refused.
func TestServiceClose(t *testing.T) {
	m := newMember(t)
	m.put("a", 10, 100)
	s := newService(t, m, Options{Target: "file:///unused"})
	bt := &blockingTarget{FileTarget: fileTarget(t), entered: make(chan struct{}, 1)}
	s.own = New(s.config(bt, true))
	errc := make(chan error, 1)
	go func() {
		_, err := s.Create(context.Background(), "")
		errc <- err
	}()
	select {
	case <-bt.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the version never reached the target")
	}
	s.Close()
	// The version under way ended inside Close; the goroutine that called
	// Create hands its result over a moment later.
	if !bt.returned.Load() {
		t.Fatal("Close returned before the version under way")
	}
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Create under Close = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Create did not return after Close")
	}
	if _, err := s.Create(context.Background(), ""); !errors.Is(err, ErrClosed) {
		t.Errorf("Create after Close = %v, want ErrClosed", err)
	}
}

// TestServiceGRPC: the Create method over gRPC answers the manifest's
// summary, and a member without a target answers FailedPrecondition.
func TestServiceGRPC(t *testing.T) {
	m := newMember(t)
	m.put("a", 10, 100)
	target := fileTarget(t)
	dial := func(s *Service) *grpc.ClientConn {
		t.Helper()
		g := grpc.NewServer()
		s.Register(g)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = g.Serve(l) }()
		t.Cleanup(g.Stop)
		cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := CreateRemote(ctx, dial(newService(t, m, Options{Target: target.String()})), &CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := ReadManifest(ctx, target, 0)
	if err != nil {
		t.Fatal(err)
	}
	if resp.Target != target.String() || resp.Version != v.Version || resp.RaftIndex != v.RaftIndex || resp.RaftTerm != 7 ||
		resp.Revision != v.Revision || resp.Files != len(v.Files) || resp.Size != v.Size() || resp.NewBytes != v.NewBytes ||
		resp.MemberID != ID(testID.MemberID) || !resp.Created.Equal(v.Created) {
		t.Errorf("response %+v does not summarise manifest %+v", resp, v)
	}
	_, err = CreateRemote(ctx, dial(newService(t, m, Options{})), &CreateRequest{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("no target: %v, want FailedPrecondition", err)
	}
}

// TestCollector: the metrics read a Service's Stats at scrape time.
func TestCollector(t *testing.T) {
	m := newMember(t)
	m.put("a", 10, 100)
	target := fileTarget(t)
	s := newService(t, m, Options{Target: target.String()})
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(s.Stats))
	gather := func() map[string]*dto.Metric {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*dto.Metric{}
		for _, mf := range mfs {
			out[mf.GetName()] = mf.GetMetric()[0]
		}
		return out
	}
	if got := gather()["strata_backup_versions_total"].GetCounter().GetValue(); got != 0 {
		t.Errorf("versions before the first = %v", got)
	}
	for range 2 {
		if _, err := s.Create(context.Background(), ""); err != nil {
			t.Fatal(err)
		}
	}
	st := s.Stats()
	got := gather()
	for name, want := range map[string]float64{
		"strata_backup_versions_total":                 float64(st.Versions),
		"strata_backup_uploaded_bytes_total":           float64(st.BytesUploaded),
		"strata_backup_uploaded_files_total":           float64(st.FilesUploaded),
		"strata_backup_reused_files_total":             float64(st.FilesReused),
		"strata_backup_failures_total":                 0,
		"strata_backup_last_version":                   2,
		"strata_backup_last_success_timestamp_seconds": float64(st.LastSuccess.UnixNano()) / 1e9,
		"strata_backup_last_duration_seconds":          st.LastDuration.Seconds(),
	} {
		mt, ok := got[name]
		if !ok {
			t.Errorf("%s not exported", name)
			continue
		}
		v := mt.GetGauge().GetValue()
		if mt.GetCounter() != nil {
			v = mt.GetCounter().GetValue()
		}
		if v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	if st.FilesReused == 0 || st.BytesUploaded == 0 {
		t.Errorf("two versions of one engine: %+v, want uploads and reused files", st)
	}
	h := got["etcd_debugging_snap_save_total_duration_seconds"].GetHistogram()
	if h.GetSampleCount() != 2 || h.GetSampleSum() <= 0 || len(h.GetBucket()) != len(DurationBuckets) {
		t.Errorf("snap save histogram %v, want 2 samples", h)
	}
}

// vanishingTarget deletes each file right after the first Stat that found
// it, as a prune by another member (an old leader's, at a leader change)
// could between a Create's check and its manifest.
type vanishingTarget struct {
	*FileTarget
	mu   sync.Mutex
	gone map[string]bool
	put  map[string]bool // written through v: not a file found present
}

func (v *vanishingTarget) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	v.mu.Lock()
	if v.put == nil {
		v.put = map[string]bool{}
	}
	v.put[name] = true
	v.mu.Unlock()
	return v.FileTarget.Put(ctx, name, r, size)
}

func (v *vanishingTarget) Stat(ctx context.Context, name string) (Object, error) {
	o, err := v.FileTarget.Stat(ctx, name)
	v.mu.Lock()
	defer v.mu.Unlock()
	if err == nil && strings.HasPrefix(name, filesPrefix) && !v.gone[name] && !v.put[name] {
		v.gone[name] = true
		if err := v.FileTarget.Delete(ctx, name); err != nil {
			return o, err
		}
	}
	return o, err
}

// TestCreateRechecksReusedFiles: a file the target held when Create
// looked, and that vanished before the manifest, is uploaded again, so
// the manifest never names a missing file (Backuper invariant 1) even
// with another writer pruning.
func TestCreateRechecksReusedFiles(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	m.put("a", 20, 100)
	ft := fileTarget(t)
	if _, err := newBackuper(t, m, ft).Create(ctx); err != nil {
		t.Fatal(err)
	}
	vt := &vanishingTarget{FileTarget: ft, gone: map[string]bool{}}
	v2, err := newBackuper(t, m, vt).Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(vt.gone) == 0 {
		t.Fatal("no file was reused: the test shows nothing")
	}
	if rep, err := Verify(ctx, ft, v2.Version); err != nil {
		t.Errorf("version %d names files a concurrent prune deleted: %v (%+v)", v2.Version, err, rep)
	}
}

// prunedTarget loses each file it is given, once, right after the Put
// returns: what a prune by another writer does to a file no manifest
// names yet.
type prunedTarget struct {
	*FileTarget
	mu   sync.Mutex
	gone map[string]bool
}

func (p *prunedTarget) Put(ctx context.Context, name string, r io.Reader, size int64) error {
	if err := p.FileTarget.Put(ctx, name, r, size); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if strings.HasPrefix(name, filesPrefix) && !p.gone[name] {
		p.gone[name] = true
		return p.FileTarget.Delete(ctx, name)
	}
	return nil
}

// TestCreateRechecksUploadedFiles: a file Create uploaded, which no
// manifest names until Create's own, may be deleted by another writer's
// prune meanwhile; it is checked again and uploaded before the manifest.
// Only reused files were checked again, and the version was listed with
// files missing.
func TestCreateRechecksUploadedFiles(t *testing.T) {
	ctx := context.Background()
	m := newMember(t)
	m.put("a", 20, 100)
	ft := fileTarget(t)
	pt := &prunedTarget{FileTarget: ft, gone: map[string]bool{}}
	v, err := newBackuper(t, m, pt).Create(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(pt.gone) == 0 {
		t.Fatal("no file was uploaded: the test shows nothing")
	}
	if rep, err := Verify(ctx, ft, v.Version); err != nil {
		t.Errorf("version %d names files a concurrent prune deleted: %v (%+v)", v.Version, err, rep)
	}
}

// TestSameTarget: spellings of one target are one target.
func TestSameTarget(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{a: "s3://b/p", b: "s3://b/p/", same: true},
		{a: "s3://b/p", b: "s3://b//p", same: true},
		{a: "file:///x/y", b: "file:///x/y/", same: true},
		{a: "s3://b/p", b: "s3://b/q", same: false},
		{a: "s3://b/p", b: "s3://c/p", same: false},
		{a: "s3://b/p", b: "file:///b/p", same: false},
		{a: "s3://b", b: "s3://b/", same: true},
	} {
		if got := sameTarget(tc.a, tc.b); got != tc.same {
			t.Errorf("sameTarget(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}

// TestServiceOtherFS: a member on a file system other than the operating
// system's (the power-cut tests' in-memory one) gets a Service that
// touches no real directory, refuses versions with a clear error, and a
// configured target is refused at open.
func TestServiceOtherFS(t *testing.T) {
	m := newMember(t)
	staging := filepath.Join(t.TempDir(), "data", "backup.tmp")
	s, err := OpenService(ServiceConfig{Engine: m.eng, StagingDir: staging, FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(staging)); !os.IsNotExist(err) {
		t.Errorf("OpenService on an in-memory file system made %s on the real one (%v)", filepath.Dir(staging), err)
	}
	if _, err := s.Create(context.Background(), fileTarget(t).String()); !errors.Is(err, ErrOtherFS) {
		t.Errorf("Create = %v, want ErrOtherFS", err)
	}
	s.Run(context.Background()) // returns at once: nothing configured
	s.Close()
	if _, err := OpenService(ServiceConfig{Options: Options{Target: "file:///x"}, Engine: m.eng, StagingDir: staging, FS: vfs.NewMem()}); !errors.Is(err, ErrOtherFS) {
		t.Errorf("OpenService with a target on an in-memory file system = %v, want ErrOtherFS", err)
	}
}

// switchableLeader is a raft node that says member 1 leads while leader is
// set, and counts the questions.
type switchableLeader struct {
	leader atomic.Bool
	asked  atomic.Int64
}

func (r *switchableLeader) Leader() uint64 {
	r.asked.Add(1)
	if r.leader.Load() {
		return 1
	}
	return 2
}
