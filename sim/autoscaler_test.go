package sim

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHPAArithmetic(t *testing.T) {
	for _, tc := range []struct {
		name           string
		current, ready int
		metric, target float64
		average        bool
		want           int
	}{
		{name: "usage over target scales up", current: 2, ready: 2, metric: 0.95, target: 0.8, want: 3},               // ceil(2 × 1.1875)
		{name: "within the 10% tolerance", current: 2, ready: 2, metric: 0.87, target: 0.8, want: 2},                  // 1.0875
		{name: "just past the tolerance", current: 2, ready: 2, metric: 0.89, target: 0.8, want: 3},                   // ceil(2.225)
		{name: "low usage scales down", current: 4, ready: 4, metric: 0.2, target: 0.8, want: 1},                      // ceil(1)
		{name: "a Value target counts ready instances", current: 3, ready: 2, metric: 1, target: 0.8, want: 3},        // ceil(2 × 1.25)
		{name: "under target by the tolerance exactly", current: 5, ready: 5, metric: 0.72, target: 0.8, want: 5},     // 0.9
		{name: "queue spread at target", current: 2, metric: 23, target: 5, average: true, want: 5},                   // ceil(4.6)
		{name: "queue within tolerance", current: 2, metric: 10.4, target: 5, average: true, want: 2},                 // 1.04
		{name: "queue below tolerance", current: 2, metric: 8.9, target: 5, average: true, want: 2},                   // ceil(1.78)
		{name: "empty queue", current: 3, metric: 0, target: 5, average: true, want: 0},                               // the floor applies later
		{name: "AverageValue ignores readiness", current: 4, ready: 1, metric: 31, target: 5, average: true, want: 7}, // ceil(6.2)
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := hpaValue(tc.current, tc.ready, tc.metric, tc.target, 0.1)
			if tc.average {
				got = hpaAverageValue(tc.current, tc.metric, tc.target, 0.1)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// fakeControl is a deployment whose metrics a test sets: every decode instance at usage, the
// prefill queue at queued. Instances it is asked for are running at once.
type fakeControl struct {
	usage  float64
	queued int
	n      [2]int
	now    time.Duration
	calls  []scaleCall
}

type scaleCall struct {
	at   time.Duration
	role Role
	n    int
}

func (f *fakeControl) Stats() []InstanceStats {
	var out []InstanceStats
	for i := range f.n[rolePrefill] {
		st := InstanceStats{Role: RolePrefill, Index: i, MaxTotalTokens: 1000}
		if i == 0 {
			st.Queued = f.queued
		}
		out = append(out, st)
	}
	for i := range f.n[roleDecode] {
		out = append(out, InstanceStats{Role: RoleDecode, Index: i, MaxTotalTokens: 1000, UsedTokens: int(f.usage * 1000)})
	}
	return out
}

func (f *fakeControl) Observe() Observation        { return Observation{Now: f.now} }
func (f *fakeControl) SetLending(bool, float64)    {}
func (f *fakeControl) Instances(r Role) (int, int) { return f.n[f.idx(r)], 0 }
func (f *fakeControl) SetInstances(r Role, n int) {
	f.calls = append(f.calls, scaleCall{at: f.now, role: r, n: n})
	f.n[f.idx(r)] = n
}

func (f *fakeControl) idx(r Role) int {
	if r == RoleDecode {
		return roleDecode
	}
	return rolePrefill
}

// drive ticks a fresh autoscaler over [0, until] at its controller's period; set changes the
// metrics before the tick at each time.
func drive(t *testing.T, p AutoscalerParams, f *fakeControl, until time.Duration, set func(now time.Duration)) {
	t.Helper()
	a, err := NewUtilisationAutoscaler(p)
	require.NoError(t, err)
	ctl := a.Controller()
	for now := time.Duration(0); now <= until; now += ctl.Every {
		f.now = now
		set(now)
		ctl.Tick(now, f)
	}
}

func TestAutoscalerStabilisesScaleDownOnly(t *testing.T) {
	for _, tc := range []struct {
		name     string
		window   time.Duration
		downAt   time.Duration
		downWant int
	}{
		// Usage drops at 90 s; the last recommendation of 2 was made at 75 s, so a 5-minute
		// window lets the fall through at 375 s.
		{"the HPA's 5-minute window", 5 * time.Minute, 375 * time.Second, 1},
		{"no window", 0, 90 * time.Second, 1},
		{"a one-minute window", time.Minute, 135 * time.Second, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := DefaultAutoscaler()
			p.ScaleDownWindow = tc.window
			// Metrics read at every sync: a stale reading would add a second scale-up here (see
			// TestAutoscalerPollsAtItsInterval).
			p.PollingInterval = p.SyncPeriod
			f := &fakeControl{n: [2]int{1, 1}}
			drive(t, p, f, 10*time.Minute, func(now time.Duration) {
				switch {
				case now == 0:
					f.usage = 1 // ratio 1.25: two instances at once
				case now < 90*time.Second:
					f.usage = 0.8
				default:
					f.usage = 0.1
				}
			})
			var decode []scaleCall
			for _, c := range f.calls {
				if c.role == RoleDecode {
					decode = append(decode, c)
				}
			}
			require.Len(t, decode, 2, "one scale-up, one scale-down: %v", decode)
			assert.Equal(t, scaleCall{0, RoleDecode, 2}, decode[0], "scale-up is not stabilised")
			assert.Equal(t, scaleCall{tc.downAt, RoleDecode, tc.downWant}, decode[1])
			for _, c := range f.calls {
				assert.NotEqual(t, RolePrefill, c.role, "an empty queue at the floor changes nothing")
			}
		})
	}
}

func TestAutoscalerScaleUpRateAndBounds(t *testing.T) {
	p := DefaultAutoscaler()
	p.Prefill.Max = 12
	f := &fakeControl{n: [2]int{1, 1}, usage: 0.8}
	drive(t, p, f, 45*time.Second, func(time.Duration) { f.queued = 100 }) // 100 queued at 5 each: 20 wanted
	var prefill []scaleCall
	for _, c := range f.calls {
		if c.role == RolePrefill {
			prefill = append(prefill, c)
		}
	}
	// 1 → max(1 + 4, 1 × 2) = 5; 15 s later the period has passed: 5 → max(9, 10) = 10; then the
	// ceiling of 12.
	assert.Equal(t, []scaleCall{{0, RolePrefill, 5}, {15 * time.Second, RolePrefill, 10}, {30 * time.Second, RolePrefill, 12}}, prefill)

	p = DefaultAutoscaler()
	p.Decode = ScaleBounds{Min: 2, Max: 3}
	f = &fakeControl{n: [2]int{1, 5}, usage: 0.8}
	drive(t, p, f, 0, func(time.Duration) {})
	assert.Equal(t, []scaleCall{{0, RoleDecode, 3}}, f.calls, "a count above the ceiling comes down to it, even within the tolerance")
}

func TestAutoscalerPollsAtItsInterval(t *testing.T) {
	p := DefaultAutoscaler()
	f := &fakeControl{n: [2]int{1, 1}}
	// The queue jumps at 15 s, between polls (0 s, 30 s): the sync at 15 s still sees 0.
	drive(t, p, f, 30*time.Second, func(now time.Duration) {
		if now >= 15*time.Second {
			f.queued = 20
		}
	})
	require.NotEmpty(t, f.calls)
	assert.Equal(t, scaleCall{30 * time.Second, RolePrefill, 4}, f.calls[0])
}

func TestAutoscalerParamsValidation(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*AutoscalerParams)
	}{
		{"autoscaler.decode_kv_target", func(p *AutoscalerParams) { p.DecodeKVTarget = 1.2 }},
		{"autoscaler.decode_kv_target", func(p *AutoscalerParams) { p.DecodeKVTarget = 0 }},
		{"autoscaler.prefill_queue_target", func(p *AutoscalerParams) { p.PrefillQueueTarget = -1 }},
		{"autoscaler.sync_period", func(p *AutoscalerParams) { p.SyncPeriod = 0 }},
		{"autoscaler.polling_interval", func(p *AutoscalerParams) { p.PollingInterval = -time.Second }},
		{"autoscaler.tolerance", func(p *AutoscalerParams) { p.Tolerance = 1 }},
		{"autoscaler.scale_down_window", func(p *AutoscalerParams) { p.ScaleDownWindow = -time.Minute }},
		{"autoscaler.scale_up_pods", func(p *AutoscalerParams) { p.ScaleUpPods, p.ScaleUpPercent = 0, 0 }},
		{"autoscaler.scale_up_pods", func(p *AutoscalerParams) { p.ScaleUpPods = -1 }},
		{"autoscaler.scale_up_percent", func(p *AutoscalerParams) { p.ScaleUpPercent = -10 }},
		{"autoscaler.scale_up_period", func(p *AutoscalerParams) { p.ScaleUpPeriod = 0 }},
		{"autoscaler.prefill", func(p *AutoscalerParams) { p.Prefill.Min = 0 }},
		{"autoscaler.decode", func(p *AutoscalerParams) { p.Decode = ScaleBounds{Min: 3, Max: 2} }},
	} {
		t.Run(tc.field, func(t *testing.T) {
			p := DefaultAutoscaler()
			tc.edit(&p)
			_, err := NewUtilisationAutoscaler(p)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.field+":")
		})
	}
	assert.NoError(t, DefaultAutoscaler().Validate())
}

// checkedAutoscaler runs the autoscaler on its own schedule and checks the simulator's invariants
// at each of its ticks; a violation panics, failing the test with the time and the accounting
// that does not add up.
func checkedAutoscaler(a *UtilisationAutoscaler) *Controller {
	ctl := a.Controller()
	tick := ctl.Tick
	ctl.Tick = func(now time.Duration, c Control) {
		tick(now, c)
		if err := c.(*Sim).checkInvariants(); err != nil {
			panic(fmt.Sprintf("at %v: %v", now, err))
		}
	}
	return ctl
}

func TestScalingRunsAreDeterministic(t *testing.T) {
	enc := func(seed uint64) (string, *Result) {
		o := opts1P1D(t, seed, 2)
		a, err := NewUtilisationAutoscaler(DefaultAutoscaler())
		require.NoError(t, err)
		o.Controller = checkedAutoscaler(a)
		r := run(t, o)
		b, err := json.Marshal(r)
		require.NoError(t, err)
		tl, err := json.Marshal(r.Timeline)
		require.NoError(t, err)
		return string(b) + string(tl), r
	}
	a, r := enc(7)
	b, _ := enc(7)
	assert.Equal(t, a, b, "same seed with scaling must give byte-identical results")
	c, _ := enc(8)
	assert.NotEqual(t, a, c)
	scaled := false
	for _, m := range r.Timeline {
		scaled = scaled || m.PrefillInstances != 1 || m.DecodeInstances != 1
	}
	assert.True(t, scaled, "the autoscaler scaled this run (else the test shows nothing)")
}

// TestAutoscalerOnThePaperRuns runs the baseline on the paper's 1P1D reference runs: a healthy
// deployment is left alone (its KV usage and queue stay under the targets), and under the +100%
// spike it adds prefill instances and serves at least as many good sessions as the fixed
// deployment. `go test -run TestAutoscalerOnThePaperRuns -v ./sim/` prints the table
// docs/simulator.md quotes.
func TestAutoscalerOnThePaperRuns(t *testing.T) {
	for _, spike := range []float64{1, 2} {
		for seed := uint64(1); seed <= 3; seed++ {
			o := opts1P1D(t, seed, spike)
			fixed := run(t, o)
			a, err := NewUtilisationAutoscaler(DefaultAutoscaler())
			require.NoError(t, err)
			o.Controller = checkedAutoscaler(a)
			scaled := run(t, o)
			peak := [2]int{}
			for _, m := range scaled.Timeline {
				peak = [2]int{max(peak[0], m.PrefillInstances), max(peak[1], m.DecodeInstances)}
			}
			t.Logf("spike ×%.0f seed %d: goodput %.0f → %.0f/h, hit rate %.2f → %.2f, instance-minutes prefill %.0f decode %.0f, peak %dP%dD",
				spike, seed, fixed.GoodputPerHour, scaled.GoodputPerHour, *fixed.HitRateMeanWindow, *scaled.HitRateMeanWindow,
				scaled.PrefillInstanceMinutesWindow, scaled.DecodeInstanceMinutesWindow, peak[0], peak[1])
			if spike == 1 {
				assert.Equal(t, [2]int{1, 1}, peak, "seed %d: a healthy deployment is not scaled", seed)
				assert.Equal(t, fixed.GoodputPerHour, scaled.GoodputPerHour)
				continue
			}
			assert.GreaterOrEqual(t, scaled.GoodputPerHour, fixed.GoodputPerHour, "seed %d", seed)
		}
	}
}
