package lender

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Decide's steps, each on its own (lender_test.go runs them together through Decide).

func TestSurveyOf(t *testing.T) {
	for _, tc := range []struct {
		name          string
		insts         []Instance
		wantHottest   string // "" for none
		wantWaitingOn string
		wantBlind     []string
		wantAnyGrant  bool
	}{
		{name: "no instances"},
		{name: "the hottest is the most reserved", insts: []Instance{dec("d0", 60_000, 0, 0), dec("d1", 90_000, 0, 0), dec("d2", 30_000, 0, 0)},
			wantHottest: "d1", wantAnyGrant: true},
		{name: "a tie: the first", insts: []Instance{dec("d0", 90_000, 0, 0), dec("d1", 90_000, 0, 0)},
			wantHottest: "d0", wantAnyGrant: true},
		{name: "waiting: the first with requests waiting", insts: []Instance{dec("d0", 60_000, 0, 0), dec("d1", 30_000, 0, 2), dec("d2", 30_000, 0, 1)},
			wantHottest: "d0", wantWaitingOn: "d1", wantAnyGrant: true},
		{name: "unusable readings are named and never the hottest", insts: []Instance{{CapacityTokens: 1}, dec("d1", 30_000, 0, 0), {Name: "d2"}},
			wantHottest: "d1", wantBlind: []string{"instance 0 (no name)", "d2"}, wantAnyGrant: true},
		{name: "no memory beyond the headroom: no grant", insts: []Instance{dec("d0", 140_000, 0, 0)}, wantHottest: "d0"},
		{name: "waiting instances lend nothing", insts: []Instance{dec("d0", 30_000, 0, 1)}, wantHottest: "d0", wantWaitingOn: "d0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newLender(t, Options{}).surveyOf(tc.insts)
			require.Len(t, s.readings, len(tc.insts), "one reading per instance, in order")
			require.Len(t, s.measurements, len(tc.insts), "one line of measurements per instance")
			for i, r := range s.readings {
				assert.Equal(t, tc.insts[i].Name, r.Name)
			}
			assert.Equal(t, tc.wantHottest, nameOf(s.hottest), "hottest")
			assert.Equal(t, tc.wantWaitingOn, nameOf(s.waitingOn), "waiting on")
			assert.Equal(t, tc.wantBlind, s.blind)
			assert.Equal(t, tc.wantAnyGrant, s.anyGrant)
		})
	}
}

func nameOf(r *reading) string {
	if r == nil {
		return ""
	}
	return r.Name
}

func TestTrackWaiting(t *testing.T) {
	calm := []Instance{dec("d0", 60_000, 0, 0)}
	queue := []Instance{dec("d0", 60_000, 0, 2)}
	queueBlind := []Instance{dec("d0", 60_000, 0, 2), {Name: "d1"}}
	type step struct {
		after      time.Duration
		insts      []Instance
		wantOn     bool
		wantWaited time.Duration
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"nothing waits", []step{{0, calm, false, 0}, {time.Minute, calm, false, 0}}},
		{"the timer runs from the first step with a queue", []step{{0, calm, false, 0}, {10 * time.Second, queue, true, 0},
			{25 * time.Second, queue, true, 15 * time.Second}}},
		{"a clear step stops it, the next queue starts it again", []step{{0, queue, true, 0}, {10 * time.Second, calm, false, 0},
			{20 * time.Second, queue, true, 0}, {30 * time.Second, queue, true, 10 * time.Second}}},
		{"a blind step resets it", []step{{0, queue, true, 0}, {10 * time.Second, queueBlind, false, 0},
			{20 * time.Second, queue, true, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLender(t, Options{})
			for i, s := range tc.steps {
				on, waited := l.trackWaitingLocked(l.surveyOf(s.insts), t0.Add(s.after))
				assert.Equal(t, s.wantOn, on, "step %d", i)
				assert.Equal(t, s.wantWaited, waited, "step %d", i)
			}
		})
	}
}

func TestBinding(t *testing.T) {
	assert.Equal(t, "cache-first", binding(Inputs{CacheFirst: true}))
	assert.Equal(t, "decode-first", binding(Inputs{}))
	assert.Equal(t, "cache-first (risk rule: cache-first)", binding(Inputs{CacheFirst: true, Reason: "risk rule: cache-first"}))
}

func TestDwell(t *testing.T) {
	l := newLender(t, Options{})
	for _, tc := range []struct {
		name  string
		since time.Time
		at    time.Time
		want  bool
	}{
		{"never toggled", time.Time{}, t0, true},
		{"a second short of the dwell", t0, t0.Add(DefaultMinDwell - time.Second), false},
		{"the dwell passed", t0, t0.Add(DefaultMinDwell), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, l.dwellOK(situation{since: tc.since, elapsed: tc.at.Sub(tc.since)}))
		})
	}
	assert.Equal(t, "lending switched off 1m0s ago; it may switch at 2026-05-01T12:05:00Z (min dwell 5m0s)",
		l.dwellNote(situation{since: t0, elapsed: time.Minute}, "off"))
}

// situationAt is what Decide's verdict reads of insts at t0 + after, the switch last toggled at
// t0 (since zero: never) and requests waiting for waited.
func situationAt(t *testing.T, l *Lender, insts []Instance, cacheFirst bool, since time.Time, after, waited time.Duration) situation {
	t.Helper()
	at := t0.Add(after)
	s := situation{in: Inputs{At: at, Instances: insts, CacheFirst: cacheFirst, Reason: "risk rule"},
		survey: l.surveyOf(insts), since: since, elapsed: at.Sub(since)}
	s.binding = binding(s.in)
	s.waiting, s.waitedFor = s.waitingOn != nil, waited
	return s
}

func TestStayOn(t *testing.T) {
	calm := []Instance{dec("d0", 60_000, 0, 0), dec("d1", 90_000, 0, 0)}
	full := []Instance{dec("d0", 60_000, 0, 0), dec("d1", 150_000, 0, 0)}
	queue := []Instance{dec("d0", 60_000, 0, 0), dec("d1", 90_000, 0, 2)}
	blind := []Instance{dec("d0", 60_000, 0, 0), {Name: "d1"}}
	for _, tc := range []struct {
		name        string
		insts       []Instance
		cacheFirst  bool
		after       time.Duration // since the last toggle at t0
		waited      time.Duration
		want        bool
		wantVerdict string
	}{
		{"cache-first and calm: on", calm, true, time.Minute, 0, true,
			"lending on: cache-first (risk rule); hottest decode d1 reserved 0.60 < pressure-on 1.00"},
		{"a wholly reserved instance: reclaim at once, within the dwell", full, true, time.Second, 0, false,
			"lending off (reclaim): d1 reserved 1.00 ≥ pressure-on 1.00; immediate, not held by the dwell — decode memory serves calls, lent KV only saves recomputation"},
		{"a queue that lasted the waiting hold: reclaim at once", queue, true, time.Second, DefaultWaitingHold, false,
			"lending off (reclaim): d1 has had requests waiting for decode KV for 15s ≥ 15s (2 now); immediate"},
		{"a queue shorter than the waiting hold: on, that grant 0", queue, true, time.Minute, 10 * time.Second, true,
			"lending on: cache-first (risk rule); hottest decode d1 reserved 0.60 < pressure-on 1.00; d1 has requests waiting for decode KV (10s of 15s before a reclaim), its grant is 0"},
		{"decode-first after the dwell: off", calm, false, DefaultMinDwell, 0, false,
			"lending off: decode-first (risk rule) — decode memory binds before the cache, so lent KV would be reclaimed as load grows"},
		{"decode-first within the dwell: held on", calm, false, time.Minute, 0, true,
			"lending on, held: decode-first (risk rule), but lending switched on 1m0s ago; it may switch at 2026-05-01T12:05:00Z (min dwell 5m0s)"},
		{"a blind instance: the switch holds", blind, true, time.Minute, 0, true,
			"lending on: cache-first (risk rule); hottest decode d0 reserved 0.40 < pressure-on 1.00; no usable reading from d1: grant 0, the switch holds"},
		{"no instances: the switch holds", nil, true, time.Minute, 0, true,
			"lending on: cache-first (risk rule); no decode instance reported, the switch holds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLender(t, Options{})
			on, verdict := l.stayOn(situationAt(t, l, tc.insts, tc.cacheFirst, t0, tc.after, tc.waited))
			assert.Equal(t, tc.want, on)
			assert.True(t, strings.HasPrefix(verdict, tc.wantVerdict), "%q\nwant %q…", verdict, tc.wantVerdict)
		})
	}
}

func TestSwitchOn(t *testing.T) {
	calm := []Instance{dec("d0", 60_000, 0, 0), dec("d1", 90_000, 0, 0)}
	for _, tc := range []struct {
		name        string
		insts       []Instance
		cacheFirst  bool
		since       time.Time // the last toggle, zero for never
		want        bool
		wantVerdict string
	}{
		{"cache-first with headroom: on", calm, true, time.Time{}, true,
			"lending on: cache-first (risk rule); hottest decode d1 reserved 0.60 ≤ pressure-off 0.70, nothing waiting for decode KV"},
		{"decode-first: off", calm, false, time.Time{}, false, "lending off: decode-first (risk rule)"},
		{"no instances: off", nil, true, time.Time{}, false, "lending off: no decode instance reported, cannot confirm headroom"},
		{"an unusable reading: off", []Instance{dec("d0", 60_000, 0, 0), {Name: "d1"}}, true, time.Time{}, false,
			"lending off: no usable reading from d1, cannot confirm headroom"},
		{"the hottest above pressure-off: off", []Instance{dec("d0", 120_000, 0, 0)}, true, time.Time{}, false,
			"lending off: cache-first (risk rule), but hottest decode d0 reserved 0.80 > pressure-off 0.70"},
		{"requests waiting: off", []Instance{dec("d0", 60_000, 0, 3)}, true, time.Time{}, false,
			"lending off: cache-first (risk rule), but d0 has 3 requests waiting for decode KV"},
		{"nothing to lend: off", []Instance{{Name: "d0", CapacityTokens: 100, FreeTokens: 5, ReservedTokens: 60}}, true, time.Time{}, false,
			"lending off: cache-first (risk rule), but no decode instance has memory beyond its headroom"},
		{"within the dwell: held off", calm, true, t0.Add(-time.Minute), false,
			"lending off, held: cache-first (risk rule) with decode headroom, but lending switched off 1m0s ago"},
		{"after the dwell: on", calm, true, t0.Add(-DefaultMinDwell), true, "lending on: cache-first (risk rule)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLender(t, Options{})
			on, verdict := l.switchOn(situationAt(t, l, tc.insts, tc.cacheFirst, tc.since, 0, 0))
			assert.Equal(t, tc.want, on)
			assert.True(t, strings.HasPrefix(verdict, tc.wantVerdict), "%q\nwant %q…", verdict, tc.wantVerdict)
		})
	}
}

func TestGrants(t *testing.T) {
	l := newLender(t, Options{})
	rs := l.surveyOf([]Instance{dec("d0", 60_000, 0, 0), {Name: "d1"}, dec("d2", 30_000, 0, 2)}).readings
	for _, tc := range []struct {
		name    string
		enabled bool
		want    []Grant
	}{
		{"on: each its grant", true, []Grant{
			{Instance: "d0", Tokens: 75_000, Reason: "d0: free 90000 − headroom 15000 = 75000 ≥ 0.5 × 150000 = 75000 → 75000"},
			{Instance: "d1", Reason: "d1: unusable reading → 0"},
			{Instance: "d2", Reason: "d2: 2 requests waiting for decode KV → 0, decode needs its memory"},
		}},
		{"off: 0, with what it would be", false, []Grant{
			{Instance: "d0", Reason: "d0: lending off → 0 (on: free 90000 − headroom 15000 = 75000 ≥ 0.5 × 150000 = 75000 → 75000)"},
			{Instance: "d1", Reason: "d1: unusable reading → 0"},
			{Instance: "d2", Reason: "d2: lending off → 0 (on: 2 requests waiting for decode KV → 0, decode needs its memory)"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, grants(rs, tc.enabled))
		})
	}
	assert.NotNil(t, grants(nil, true), "no instances: an empty list, not null in the JSON")
}
