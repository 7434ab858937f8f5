package backup

import "time"

// Exponential retention (Retention.Exponential; docs/backup.md, "Exponential
// retention"): the versions kept thin out with age, as in gardener's
// etcd-backup-restore "Exponential" garbage collection policy. Each tier
// keeps, of the versions whose age is under its span, the newest of each
// of its calendar units (UTC):
//
//	tier     span      unit            at most kept by it
//	hourly   24 hours  the clock hour  24
//	daily    7 days    the day         7 (or 8: a partial day at each end)
//	weekly   4 weeks   the week from Monday 00:00 UTC   4 (or 5)
//
// A version is kept if any tier keeps it; versions four weeks old or more
// are kept by none (Prune still keeps the newest version, and the other
// rules, KeepLast and KeepWithin, may keep them).

// expTier is one tier of the exponential retention.
type expTier struct {
	span time.Duration
	// unit returns the calendar unit (an ordinal) of a UTC time.
	unit func(time.Time) int64
}

// daysBeforeMonday: 1970-01-01, day 0 of Unix time, was a Thursday, three
// days after a Monday.
const daysBeforeMonday = 3

var expTiers = []expTier{
	{span: 24 * time.Hour, unit: func(t time.Time) int64 { return t.Unix() / 3600 }},
	{span: 7 * 24 * time.Hour, unit: func(t time.Time) int64 { return floorDiv(t.Unix(), 86400) }},
	{span: 28 * 24 * time.Hour, unit: func(t time.Time) int64 { return floorDiv(floorDiv(t.Unix(), 86400)+daysBeforeMonday, 7) }},
}

// floorDiv is a/b rounded down (Unix times before 1970 are negative).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// keepExponential returns, for versions created at the given times, which
// the exponential retention keeps at now. A version created after now (a
// clock stepped back) has age zero.
func keepExponential(created []time.Time, now time.Time) []bool {
	keep := make([]bool, len(created))
	for _, tier := range expTiers {
		newest := map[int64]int{} // unit -> index of its newest version
		for i, c := range created {
			if now.Sub(c) >= tier.span {
				continue
			}
			u := tier.unit(c.UTC())
			if j, ok := newest[u]; !ok || c.After(created[j]) || c.Equal(created[j]) && i > j {
				newest[u] = i
			}
		}
		for _, i := range newest {
			keep[i] = true
		}
	}
	return keep
}
