package scaler

import (
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

func newPolicy(t *testing.T, o Options) *Policy {
	t.Helper()
	if o.Roles == nil {
		o.Roles = []Role{RolePrefill, RoleDecode}
	}
	if o.Ceiling == nil {
		o.Ceiling = map[Role]int{RolePrefill: 10, RoleDecode: 10}
	}
	p, err := New(o)
	require.NoError(t, err)
	return p
}

// quiet is base() with arrivals a third as high: the arrivals need one prefill and one decode
// instance (30 sessions of 20K with the spike), and so do the live sessions, with the spike on
// top (400K + 200K of working set against 700K of knee, 300K of KV against 720K).
func quiet() NeedInputs {
	in := base()
	in.Arrivals = 0.05
	in.WorkingSet, in.LiveSessions = 400_000, 20
	in.DecodeReserved = 200_000
	return in
}

// lends is base() on a quiet deployment whose two decode instances lend 600K of cache: 1.68M live
// tokens need ⌈(1.68M ÷ 0.8 − 1.25 × 600K) ÷ 700K⌉ = 2 prefill with it, 3 without it, and 3 with
// the 520K one decode instance would lend (its 720K less 200K reserved).
func lends(offPlateau bool) func(*NeedInputs) {
	return func(in *NeedInputs) {
		in.Arrivals, in.WorkingSet, in.DecodeReserved, in.OffPlateau = 0.01, 1_680_000, 200_000, offPlateau
		in.CacheCapacity = 4*in.PrefillCache + 600_000
	}
}

func threeLend(in *NeedInputs) {
	in.Prefill, in.Decode, in.CacheCapacity = 1, 3, in.PrefillCache+1_200_000
}

// TestPolicySteps runs the policy every 5 s, as the daemon does: each step's readings hold until
// the next step's time, and no change may come between two steps.
func TestPolicySteps(t *testing.T) {
	type step struct {
		after   time.Duration // since t0
		in      func(*NeedInputs)
		changes []Change
		reason  string // in the reasons
	}
	busy := func(in *NeedInputs) { in.Arrivals = 0.3 } // 2 × base: prefill 6, decode 3
	// 0.2 sessions/s, 4/3 × base: 80 sessions (1.6M) need 3 prefill under 0.8 of the knee, 120
	// with the spike (2.4M) 4 under the knee; 60 of them in a call, 71 with the binomial margin:
	// 1.42M of KV, 2 decode.
	asked := func(in *NeedInputs) { in.Arrivals = 0.2 }
	// 0.2 ± 0.02/s: taken low (0.16) the arrivals need 3 prefill, 64 sessions and 96 with the
	// spike; taken high (0.24), 96 sessions and 128 with it: 2.56M, 4 prefill.
	noisy := func(in *NeedInputs) { in.Arrivals, in.ArrivalsSD = 0.2, 0.02 }
	blind := func(in *NeedInputs) { in.DecodeKV = 0 }
	prefillOnly := Options{Roles: []Role{RolePrefill}, Ceiling: map[Role]int{RolePrefill: 10}, ScaleInHold: time.Minute}
	for _, tc := range []struct {
		name  string
		o     Options
		steps []step
	}{
		{"scales out at once, all the need", Options{}, []step{
			{0, busy, []Change{{RolePrefill, 4, 6}, {RoleDecode, 2, 3}}, "scaling out 4 → 6"},
			{5 * time.Second, busy, nil, "no change"},
		}},
		{"scale-out capped at the ceiling", Options{Ceiling: map[Role]int{RolePrefill: 5, RoleDecode: 10}}, []step{
			{0, busy, []Change{{RolePrefill, 4, 5}, {RoleDecode, 2, 3}}, "(the ceiling; 6 would be needed)"},
		}},
		{"a second rise waits for the up cool-down", Options{}, []step{
			{0, busy, []Change{{RolePrefill, 4, 6}, {RoleDecode, 2, 3}}, ""},
			{30 * time.Second, func(in *NeedInputs) { in.Arrivals = 0.6 }, nil, "waits for the cool-down (30s of 1m0s)"},
			{time.Minute, func(in *NeedInputs) { in.Arrivals = 0.6 }, []Change{{RolePrefill, 6, 10}, {RoleDecode, 3, 6}}, "(the ceiling; 11 would be needed)"},
		}},
		{"scale-in only after the hold", Options{}, []step{
			{0, func(in *NeedInputs) { *in = quiet() }, nil, "1 would do, watched for 0s of the 15m0s"},
			{14 * time.Minute, func(in *NeedInputs) { *in = quiet() }, nil, "watched for 14m0s"},
			{15 * time.Minute, func(in *NeedInputs) { *in = quiet() }, []Change{{RolePrefill, 4, 1}, {RoleDecode, 2, 1}}, "scaling in 4 → 1"},
		}},
		{"a step that needs them all holds every instance for the hold", Options{}, []step{
			{0, func(in *NeedInputs) { *in = quiet() }, nil, ""},
			{10 * time.Minute, asked, nil, "prefill: need 4, asked 4"},
			{20 * time.Minute, func(in *NeedInputs) { *in = quiet() }, nil, "no scale-in: 4 was needed within the last 15m0s"},
			{35 * time.Minute, func(in *NeedInputs) { *in = quiet() }, []Change{{RolePrefill, 4, 1}, {RoleDecode, 2, 1}}, ""},
		}},
		// The base readings need 3 prefill and 2 decode until minute 5, one and one after: at
		// minute 15 the largest size of the last 15 minutes is 3, at minute 20 it is 1, and
		// the second scale-in does not wait: it is not the flapping the cool-down is for.
		{"a scale-in goes to the largest size of the hold, and on as the window moves", Options{}, []step{
			{0, nil, nil, "3 would do, watched for 0s"},
			{5 * time.Minute, func(in *NeedInputs) { *in = quiet() }, nil, ""},
			{15 * time.Minute, func(in *NeedInputs) { *in = quiet() }, []Change{{RolePrefill, 4, 3}}, "scaling in 4 → 3"},
			{20 * time.Minute, func(in *NeedInputs) { *in = quiet() }, []Change{{RolePrefill, 3, 1}, {RoleDecode, 2, 1}}, "scaling in 3 → 1"},
		}},
		{"a gap in the sizing restarts the watch", Options{}, []step{
			{0, func(in *NeedInputs) { *in = quiet() }, nil, ""},
			{5 * time.Minute, blind, nil, "no scaling"},
			{10 * time.Minute, func(in *NeedInputs) { *in = quiet() }, nil, "watched for 0s"},
			{15 * time.Minute, func(in *NeedInputs) { *in = quiet() }, nil, "watched for 5m0s of the 15m0s"},
			{25 * time.Minute, func(in *NeedInputs) { *in = quiet() }, []Change{{RolePrefill, 4, 1}, {RoleDecode, 2, 1}}, ""},
		}},
		{"the arrivals taken high hold a scale-in", Options{ScaleInHold: time.Minute}, []step{
			{0, noisy, nil, "prefill: need 3, asked 4 (floor 1, ceiling 10); no scale-in: the arrivals, taken 2 standard errors high, need 4"},
			{10 * time.Minute, noisy, nil, "taken 2 standard errors high, need 4"},
		}},
		{"scale-in waits for the down cool-down after a scale-out", Options{ScaleInHold: time.Minute}, []step{
			{0, busy, []Change{{RolePrefill, 4, 6}, {RoleDecode, 2, 3}}, ""},
			{time.Minute, func(in *NeedInputs) { *in = quiet() }, nil, "6 was needed within the last 1m0s"},
			{5 * time.Minute, func(in *NeedInputs) { *in = quiet() }, nil, "waits for the cool-down after the scale-out (5m0s of 10m0s)"},
			{10 * time.Minute, func(in *NeedInputs) { *in = quiet() }, []Change{{RolePrefill, 6, 1}, {RoleDecode, 3, 1}}, ""},
		}},
		// 2.4M live tokens need 4 prefill at the knee and ⌈2.4M ÷ (0.8 × 700K)⌉ = 5 at 0.8 of it:
		// the four are not shrunk. 1.6M need ⌈2M ÷ 700K⌉ = 3: scaled in to 3, not to the 1 the
		// arrivals need.
		{"never below what the live sessions need", Options{ScaleInHold: time.Minute}, []step{
			{0, func(in *NeedInputs) { in.WorkingSet, in.Arrivals = 2_400_000, 0.01 }, nil, "no scale-in: the live sessions need 5"},
		}},
		// 50 live sessions of 32K (1.6M) fit 3 prefill under 0.8 of the knee (2M of 2.1M), but
		// the planned spike's 20 sessions on top (2.24M) need 4: no scale-in, though the arrivals
		// (40 sessions, 60 with the spike: 1.92M) need 3.
		{"the planned spike on top of the live sessions", Options{ScaleInHold: time.Minute}, []step{
			{0, func(in *NeedInputs) { in.Arrivals, in.WorkingSet, in.LiveSessions = 0.1, 1_600_000, 50 }, nil,
				"prefill: need 3, asked 4 (floor 1, ceiling 10); no scale-in: the live sessions need 4"},
		}},
		{"down to what the live sessions need", Options{Roles: []Role{RolePrefill}, Ceiling: map[Role]int{RolePrefill: 10}, ScaleInHold: time.Minute}, []step{
			{0, func(in *NeedInputs) { in.WorkingSet, in.Arrivals = 1_600_000, 0.01 }, nil, ""},
			{time.Minute, func(in *NeedInputs) { in.WorkingSet, in.Arrivals = 1_600_000, 0.01 }, []Change{{RolePrefill, 4, 3}}, "scaling in 4 → 3"},
		}},
		// The cache decode lends stays when a prefill instance goes (lends).
		{"the lent cache counts for a prefill scale-in", prefillOnly, []step{
			{0, lends(false), nil, "2 would do, watched for 0s"},
			{time.Minute, lends(false), []Change{{RolePrefill, 4, 2}}, "scaling in 4 → 2"},
		}},
		{"not while the hit rate is off its plateau", prefillOnly, []step{
			{0, lends(true), nil, "3 would do, watched for 0s"},
			{time.Minute, lends(true), []Change{{RolePrefill, 4, 3}}, "scaling in 4 → 3"},
		}},
		{"nor what a decode scale-in takes back", Options{ScaleInHold: time.Minute}, []step{
			{0, lends(false), nil, "prefill: need 1, asked 4 (floor 1, ceiling 10); 2 would do"},
			{time.Minute, lends(false), []Change{{RolePrefill, 4, 3}, {RoleDecode, 2, 1}}, "scaling in 4 → 3"},
		}},
		// One prefill instance and three decode lending 1.2M (TestSize's "only the decode
		// instances kept lend"): where decode is scaled, with a floor of 1, the third decode
		// instance may go and its KV with it, so the spike needs a second prefill instance; where
		// decode is not scaled, all three stay and lend, and one does.
		{"the lent KV of decode instances that may go", Options{}, []step{
			{0, threeLend, []Change{{RolePrefill, 1, 2}}, "prefill: need 2, asked 1"},
		}},
		{"the lent KV of decode instances that stay", Options{Roles: []Role{RolePrefill}, Ceiling: map[Role]int{RolePrefill: 10}}, []step{
			{0, threeLend, nil, "prefill: need 1, asked 1"},
		}},
		{"the floor holds", Options{Floor: map[Role]int{RolePrefill: 3, RoleDecode: 2}, ScaleInHold: time.Minute}, []step{
			{0, func(in *NeedInputs) { *in = quiet() }, nil, ""},
			{time.Minute, func(in *NeedInputs) { *in = quiet() }, []Change{{RolePrefill, 4, 3}}, "floor 3"},
		}},
		// 30 sessions of 25K (750K) brush the knee of one instance (700K), but the arrivals, 8
		// sessions (12 with the spike), need one: a steady population at the knee is no reason to
		// scale out (the exported need says 2, so that an autoscaler does not scale in under it).
		{"the live sessions at the knee do not scale out", Options{}, []step{
			{0, func(in *NeedInputs) {
				*in = base()
				in.Arrivals, in.LiveSessions, in.WorkingSet, in.Prefill, in.DecodeReserved = 0.02, 30, 750_000, 1, 100_000
			}, nil, "prefill: need 1, asked 1"},
		}},
		{"one role scaled", Options{Roles: []Role{RoleDecode}, Ceiling: map[Role]int{RoleDecode: 10}}, []step{
			{0, busy, []Change{{RoleDecode, 2, 3}}, ""},
		}},
		{"nothing read yet: nothing asked", Options{}, []step{
			{0, func(in *NeedInputs) { in.Prefill, in.Decode = 0, 0 }, nil, "no instance read yet"},
		}},
		{"blind: no sizing, no change", Options{}, []step{
			{0, blind, nil, "no scaling: sizing: decode KV"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, tc.o)
			readings := func(s step) NeedInputs {
				in := base()
				if s.in != nil {
					s.in(&in)
				}
				return in
			}
			for i, s := range tc.steps {
				if i > 0 {
					prev := tc.steps[i-1]
					for at := prev.after + 5*time.Second; at < s.after; at += 5 * time.Second {
						d := p.Decide(Inputs{At: t0.Add(at), NeedInputs: readings(prev)})
						require.Empty(t, d.Changes, "at %v, before step %d: %q", at, i, d.Reasons)
					}
				}
				d := p.Decide(Inputs{At: t0.Add(s.after), NeedInputs: readings(s)})
				assert.Equal(t, s.changes, d.Changes, "step %d: %q", i, d.Reasons)
				if s.reason != "" {
					assert.Contains(t, joined(d.Reasons), s.reason, "step %d", i)
				}
			}
		})
	}
}

func joined(rs []string) string {
	out := ""
	for _, r := range rs {
		out += r + "\n"
	}
	return out
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want []string
	}{
		{"no roles", Options{}, []string{"roles: none scaled"}},
		{"no ceiling", Options{Roles: []Role{RolePrefill}}, []string{"ceiling.prefill: required"}},
		{"floor above ceiling", Options{Roles: []Role{RolePrefill}, Floor: map[Role]int{RolePrefill: 4}, Ceiling: map[Role]int{RolePrefill: 2}},
			[]string{"floor.prefill: 4 above ceiling.prefill 2"}},
		{"unknown role and a stray ceiling", Options{Roles: []Role{"unified"}, Ceiling: map[Role]int{RoleDecode: 2}},
			[]string{`roles: unknown role "unified"`, "ceiling.decode: set for a role that is not scaled"}},
		{"negative durations", Options{Roles: []Role{RoleDecode}, Ceiling: map[Role]int{RoleDecode: 2}, UpCoolDown: -1, ScaleInHold: -time.Second},
			[]string{"up_cool_down", "scale_in_hold"}},
		{"sizing options", Options{Roles: []Role{RoleDecode}, Ceiling: map[Role]int{RoleDecode: 2}, Need: NeedOptions{SpikeSize: -1}},
			[]string{"spike_size"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.o)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// TestPolicyRestore: a restarted daemon keeps what it asked and when, so a cool-down and a
// scale-in hold survive the restart.
func TestPolicyRestore(t *testing.T) {
	p := newPolicy(t, Options{})
	in := base()
	in.Arrivals = 0.3
	require.True(t, p.Decide(Inputs{At: t0, NeedInputs: in}).Changed())
	q := newPolicy(t, Options{})
	q.Restore(p.State())
	in.Arrivals = 0.6
	d := q.Decide(Inputs{At: t0.Add(30 * time.Second), NeedInputs: in})
	assert.False(t, d.Changed(), "the cool-down carried over: %q", d.Reasons)
	assert.Equal(t, 6, q.State()[RolePrefill].Asked)
}

// TestPolicyRestoreKeepsTheWindow: the sizes a scale-in looks back over survive a restart through
// the daemon's JSON state file; a restart within a minute goes on watching, a longer one watches
// a whole window again.
func TestPolicyRestoreKeepsTheWindow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		resume time.Duration // the first step after the restart
		in     time.Duration // when the scale-in comes
	}{
		{"restarted at once", 10 * time.Minute, 15 * time.Minute},
		{"down for five minutes", 15 * time.Minute, 30 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, Options{})
			at := time.Duration(0)
			for ; at < 10*time.Minute; at += 5 * time.Second {
				require.Empty(t, p.Decide(Inputs{At: t0.Add(at), NeedInputs: quiet()}).Changes)
			}
			b, err := json.Marshal(p.State())
			require.NoError(t, err)
			var st map[Role]RoleState
			require.NoError(t, json.Unmarshal(b, &st))
			q := newPolicy(t, Options{})
			q.Restore(st)
			for at = tc.resume; at < tc.in; at += 5 * time.Second {
				require.Empty(t, q.Decide(Inputs{At: t0.Add(at), NeedInputs: quiet()}).Changes, "at %v", at)
			}
			assert.Equal(t, []Change{{RolePrefill, 4, 1}, {RoleDecode, 2, 1}}, q.Decide(Inputs{At: t0.Add(tc.in), NeedInputs: quiet()}).Changes)
		})
	}
}

// TestPolicyOnAClock runs the policy as the daemon's loop does, on a ticker, in a synctest
// bubble: arrivals double at minute 5 and fall back at minute 20; the pool grows at the first
// step after the rise and shrinks only once the quiet has lasted the hold, after the cool-down.
func TestPolicyOnAClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPolicy(t, Options{})
		start := time.Now()
		tick := time.NewTicker(5 * time.Second)
		defer tick.Stop()
		var out, in time.Duration
		for now := range tick.C {
			el := now.Sub(start)
			readings := quiet()
			readings.Prefill, readings.Decode = 4, 2
			if el >= 5*time.Minute && el < 20*time.Minute {
				readings = base()
				readings.Arrivals = 0.3
			}
			for _, c := range p.Decide(Inputs{At: now, NeedInputs: readings}).Changes {
				switch {
				case c.Role == RolePrefill && c.To > c.From:
					out = el
				case c.Role == RolePrefill && c.To < c.From:
					in = el
				}
			}
			if el > 60*time.Minute {
				break
			}
		}
		assert.Equal(t, 5*time.Minute, out, "scaled out at the first step of the rise")
		assert.Equal(t, 35*time.Minute, in, "scaled in 15 minutes into the quiet")
	})
}
