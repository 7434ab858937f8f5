package backup

import (
	"fmt"
	"testing"
	"time"
)

// TestKeepExponential: over version times, the exponential retention
// keeps the newest of every hour for 24 hours, of every day for 7 days and
// of every week (from Monday, UTC) for 4 weeks, and nothing older.
func TestKeepExponential(t *testing.T) {
	// Wednesday 2026-11-25 12:30 UTC.
	now := time.Date(2026, 11, 25, 12, 30, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	at := func(month time.Month, day, hour, min int) time.Time {
		return time.Date(2026, month, day, hour, min, 0, 0, time.UTC)
	}
	for _, tc := range []struct {
		name    string
		created []time.Time
		want    []bool
	}{
		{"none", nil, []bool{}},
		{"one an hour ago", []time.Time{ago(time.Hour)}, []bool{true}},
		{"several in one hour: the last", []time.Time{at(11, 25, 11, 5), at(11, 25, 11, 30), at(11, 25, 11, 55)},
			[]bool{false, false, true}},
		{"hours of today: one each", []time.Time{at(11, 25, 9, 10), at(11, 25, 9, 50), at(11, 25, 10, 10), at(11, 25, 12, 0), at(11, 25, 12, 20)},
			[]bool{false, true, true, false, true}},
		{"yesterday within 24 h: one an hour", []time.Time{at(11, 24, 13, 0), at(11, 24, 13, 40), at(11, 24, 14, 0)},
			[]bool{false, true, true}},
		{"past 24 h: the last of each day", []time.Time{at(11, 23, 1, 0), at(11, 23, 23, 0), at(11, 24, 11, 0), at(11, 24, 12, 0)},
			[]bool{false, true, false, true}},
		// 11-24 12:00 is 24.5 h old: daily tier only; 11-24 13:00 is in
		// the hourly tier and the newest of 11-24.
		{"the day tier sees versions of the hour tier", []time.Time{at(11, 24, 12, 0), at(11, 24, 13, 0)},
			[]bool{false, true}},
		{"7 days: 11-18 12:31 is kept, 11-18 12:29 is not (weekly: the week of 11-16 has newer)",
			[]time.Time{at(11, 18, 12, 29), at(11, 18, 12, 31), at(11, 19, 0, 0)}, []bool{false, true, true}},
		// Weeks start on Monday: 11-16 and 11-09 are Mondays; 11-15 is a Sunday.
		{"weeks: the last of each", []time.Time{at(11, 2, 10, 0), at(11, 8, 23, 0), at(11, 9, 0, 0), at(11, 15, 23, 59), at(11, 16, 0, 0)},
			[]bool{false, true, false, true, true}},
		{"4 weeks and older: none", []time.Time{ago(28 * 24 * time.Hour), ago(40 * 24 * time.Hour)}, []bool{false, false}},
		{"just under 4 weeks: its week's last", []time.Time{ago(28*24*time.Hour - time.Minute)}, []bool{true}},
		{"a clock stepped back: age zero, kept", []time.Time{now.Add(time.Hour)}, []bool{true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := keepExponential(tc.created, now); fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("keepExponential(%v) = %v, want %v", tc.created, got, tc.want)
			}
		})
	}

	// A version every 10 minutes for 6 weeks: 24 hourly (the hour under
	// way among them), the days and weeks before.
	var created []time.Time
	for c := now.Add(-42 * 24 * time.Hour); !c.After(now); c = c.Add(10 * time.Minute) {
		created = append(created, c)
	}
	kept := 0
	for _, k := range keepExponential(created, now) {
		if k {
			kept++
		}
	}
	// Hourly (created after 11-24 12:30): the hours 11-24 12:00 to 11-25
	// 12:00, 25 of them. Daily (after 11-18 12:30): the days 11-18 to 11-23
	// add 6 (11-24's last, 23:50, is its hour's; 11-25's is the newest).
	// Weekly (after 10-28 12:30): the weeks from Mondays 10-26, 11-02 and
	// 11-09 add 3 (11-22 23:50 and the newest are kept already).
	if want := 25 + 6 + 3; kept != want {
		t.Errorf("a version every 10 minutes for 6 weeks: %d kept, want %d", kept, want)
	}
}
