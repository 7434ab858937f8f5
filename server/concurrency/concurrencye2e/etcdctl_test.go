package concurrencye2e

import (
	"strings"
	"syscall"
	"testing"
)

// TestEtcdctlLock: one etcdctl lock holds the lock, a second one waits
// behind it and runs its command only once the first has exited, whether
// the first unlocks on SIGTERM or is killed and its lease expires.
func TestEtcdctlLock(t *testing.T) {
	p, cli := start(t, "strata")
	for _, tc := range []struct {
		name string
		// release ends the holder; ttl is the holder's session TTL.
		release func(t *testing.T, holder *ctl)
		ttl     string
	}{
		{name: "holder unlocks on SIGTERM", ttl: "10", release: func(t *testing.T, holder *ctl) {
			if err := holder.signal(t, syscall.SIGTERM); err != nil {
				t.Errorf("holder exited with %v; stderr %q", err, holder.errb.String())
			}
		}},
		{name: "holder killed, its lease expires", ttl: "2", release: func(t *testing.T, holder *ctl) {
			_ = holder.signal(t, syscall.SIGKILL)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "lock-" + strings.ReplaceAll(tc.name, " ", "-")
			holder := startCtl(t, p, "lock", "--ttl", tc.ttl, name)
			holder.waitOutput(t, name+"/") // the key, printed once held
			// "--" ends etcdctl's flags, so that -c reaches sh.
			waiter := startCtl(t, p, "lock", name, "--", "sh", "-c", "echo got $ETCD_LOCK_KEY")
			eventually(t, "the waiter's key to queue behind the holder's", func() bool {
				if waiter.exited() {
					t.Fatalf("waiter exited: %v; stdout %q, stderr %q", waiter.err, waiter.out.String(), waiter.errb.String())
				}
				return len(keysUnder(t, cli, name+"/")) == 2
			})
			keys := keysUnder(t, cli, name+"/")
			if !strings.HasPrefix(holder.out.String(), keys[0]+"\n") {
				t.Fatalf("holder printed %q, but the first key is %s", holder.out.String(), keys[0])
			}
			if waiter.exited() {
				t.Fatalf("waiter ran while the lock was held: stdout %q, stderr %q", waiter.out.String(), waiter.errb.String())
			}
			tc.release(t, holder)
			if err := waiter.wait(t); err != nil {
				t.Fatalf("waiter exited with %v; stderr %q", err, waiter.errb.String())
			}
			if got, want := waiter.out.String(), "got "+keys[1]+"\n"; got != want {
				t.Errorf("waiter printed %q, want %q", got, want)
			}
			if left := keysUnder(t, cli, name+"/"); len(left) != 0 {
				t.Errorf("keys left after both released: %v", left)
			}
		})
	}
}

// TestEtcdctlElect: the first campaigner leads, a second waits, an
// observer sees both proclamations in order, and the second leads once
// the first resigns on SIGTERM.
func TestEtcdctlElect(t *testing.T) {
	p, cli := start(t, "strata")
	first := startCtl(t, p, "elect", "job", "one")
	first.waitOutput(t, "one\n")
	observer := startCtl(t, p, "elect", "-l", "job")
	observer.waitOutput(t, "one\n")
	second := startCtl(t, p, "elect", "job", "two")
	eventually(t, "the second campaigner's key", func() bool { return len(keysUnder(t, cli, "job/")) == 2 })
	if second.exited() || strings.Contains(second.out.String(), "two") {
		t.Fatalf("second campaigner elected while the first leads: stdout %q, stderr %q", second.out.String(), second.errb.String())
	}
	if err := first.signal(t, syscall.SIGTERM); err != nil {
		t.Errorf("first campaigner exited with %v; stderr %q", err, first.errb.String())
	}
	second.waitOutput(t, "two\n")
	observer.waitOutput(t, "two\n")
	keys := keysUnder(t, cli, "job/")
	if len(keys) != 1 || !strings.HasPrefix(second.out.String(), keys[0]+"\n") {
		t.Errorf("keys %v after the first resigned; second printed %q", keys, second.out.String())
	}
	if got := observer.out.String(); strings.Count(got, "one\n") != 1 || strings.Index(got, "one\n") > strings.Index(got, "two\n") {
		t.Errorf("observer printed %q, want the key and one, then the key and two", got)
	}
	if err := second.signal(t, syscall.SIGTERM); err != nil {
		t.Errorf("second campaigner exited with %v", err)
	}
	if err := observer.signal(t, syscall.SIGTERM); err != nil {
		t.Errorf("observer exited with %v; stderr %q", err, observer.errb.String())
	}
	if left := keysUnder(t, cli, "job/"); len(left) != 0 {
		t.Errorf("keys left after both resigned: %v", left)
	}
}
