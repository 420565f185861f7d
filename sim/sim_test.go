package sim

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func preset(t testing.TB, name string) Deployment {
	t.Helper()
	d, err := DeploymentPreset(name)
	require.NoError(t, err)
	return d
}

func workload(t testing.TB, kind string) *Synthetic {
	t.Helper()
	w, err := SyntheticWorkload(kind)
	require.NoError(t, err)
	return w
}

// opts1P1D is the paper's reference run, optionally with a +100% spike in minutes 15–25.
func opts1P1D(t testing.TB, seed uint64, spike float64) Options {
	w := workload(t, "terminal-bench")
	o := Options{Seed: seed, Deployment: preset(t, "paper-1p1d-h100"), Duration: 90 * time.Minute,
		MeasureFrom: 25 * time.Minute, MeasureTo: 85 * time.Minute,
		Streams: []Stream{{Class: "base", Workload: w, RatePerMin: 3.3}}}
	if spike > 1 {
		o.Streams = append(o.Streams, Stream{Class: "spike", Workload: w, RatePerMin: 3.3 * (spike - 1),
			From: 15 * time.Minute, To: 25 * time.Minute})
	}
	return o
}

func run(t testing.TB, o Options) *Result {
	t.Helper()
	var failed error
	if o.Controller == nil {
		o.Controller = invariantController(&failed)
	}
	s, err := New(o)
	require.NoError(t, err)
	r := s.Run()
	require.NoError(t, failed, "invariants")
	require.NoError(t, s.checkInvariants(), "invariants at the end")
	return r
}

func TestDeterministic(t *testing.T) {
	enc := func(seed uint64) string {
		r := run(t, opts1P1D(t, seed, 2))
		b, err := json.Marshal(r)
		require.NoError(t, err)
		tl, err := json.Marshal(r.Timeline)
		require.NoError(t, err)
		return string(b) + string(tl)
	}
	a, b := enc(7), enc(7)
	assert.Equal(t, a, b, "same seed must give byte-identical results")
	assert.NotEqual(t, a, enc(8), "another seed should give another run")
}

func TestHealthyAndTrapped(t *testing.T) {
	healthy := run(t, opts1P1D(t, 1, 1))
	require.NotNil(t, healthy.HitRateMeanWindow)
	assert.Greater(t, *healthy.HitRateMeanWindow, 0.9)
	assert.Less(t, *healthy.TTFTP50Window, 1.0)
	assert.Equal(t, healthy.Sessions.Arrived, healthy.Sessions.Good, "an idle-ish deployment serves every session well")
	// Prefill far below saturation when healthy, as in the paper (≈ 1/12).
	assert.InDelta(t, 1.0/12, *healthy.PrefillBusyWindow, 0.04)

	trapped := run(t, opts1P1D(t, 1, 2))
	assert.Less(t, *trapped.HitRateEnd, 0.5)
	assert.Greater(t, *trapped.PrefillBusyWindow, 0.95)
	assert.Less(t, trapped.GoodputPerHour, 0.3*healthy.GoodputPerHour)
	// The base sessions are the same in both runs: removing the spike only removes sessions.
	assert.GreaterOrEqual(t, trapped.Sessions.Arrived, healthy.Sessions.Arrived)
}

func TestUnloadedTimeMatchesASessionAlone(t *testing.T) {
	// One session at a time (closed loop of one): every session's duration must be its unloaded
	// time, which goodput divides by.
	o := opts1P1D(t, 3, 1)
	o.Streams = nil
	o.ClosedLoop = 1
	o.ClosedWorkload = workload(t, "terminal-bench")
	o.Duration, o.MeasureFrom, o.MeasureTo = 2*time.Hour, 0, 2*time.Hour
	o.NoDrain = true
	s, err := New(o)
	require.NoError(t, err)
	s.Run()
	n := 0
	for _, ss := range s.sessions {
		if ss.state != stDone {
			continue
		}
		n++
		got := (ss.end - ss.arrival).Seconds()
		want := ss.unloaded.Seconds()
		assert.InEpsilon(t, want, got, 0.02, "session %d", ss.id)
	}
	assert.Greater(t, n, 5)
}

func TestGoodputCountsRefusals(t *testing.T) {
	// A gate that refuses every other session: refused sessions arrived, so they count against
	// goodput, and the rest run unhindered.
	g := &alternateGate{}
	o := opts1P1D(t, 2, 1)
	o.Gate = g
	r := run(t, o)
	c := r.Sessions
	assert.Equal(t, c.Arrived, c.Completed+c.Rejected+c.Shed)
	assert.InDelta(t, c.Arrived/2, c.Rejected+c.Shed, 1)
	assert.Positive(t, c.Shed)
	assert.InDelta(t, float64(c.Good)/(60.0/60), r.GoodputPerHour, 1e-9)
	missed := 0
	for i, m := range r.Timeline {
		if float64(i) >= r.MeasureFromMin && float64(i) < r.MeasureToMin {
			missed += m.MissedArrivals
		}
	}
	assert.Equal(t, c.Arrived-c.Good, missed, "every measured session that is not good counts as missed in the minute it arrived")
}

// TestMissedArrivalsAtTheEnd: sessions a gate holds past the run's end are unsettled; those
// already past their deadline (Slowdown × their unloaded time) count as missed in the minute they
// arrived, the others (which may still be good) do not.
func TestMissedArrivalsAtTheEnd(t *testing.T) {
	o := opts1P1D(t, 4, 1)
	o.Gate = &holdGate{release: 24 * time.Hour}
	o.NoDrain = true // the run ends at its last arrivals: the newest held sessions may still be good
	s, err := New(o)
	require.NoError(t, err)
	r := s.Run()
	want := make([]int, len(r.Timeline))
	late, pending := 0, 0
	for _, ss := range s.sessions {
		require.Equal(t, stHeld, ss.state, "the gate holds every session")
		if i := int(ss.arrival / time.Minute); i < len(want) {
			if float64(s.now-ss.arrival) > s.o.SLO.Slowdown*float64(ss.unloaded) {
				want[i]++
				late++
			} else {
				pending++
			}
		}
	}
	require.Positive(t, late, "the oldest held sessions are past their deadline")
	require.Positive(t, pending, "the newest are not yet")
	for i, m := range r.Timeline {
		assert.Equal(t, want[i], m.MissedArrivals, "minute %d", i)
	}
}

type alternateGate struct{ n int }

func (g *alternateGate) Arrive(now time.Duration, s SessionInfo) Verdict {
	g.n++
	switch g.n % 4 {
	case 1:
		return Verdict{Action: Reject}
	case 3:
		return Verdict{Action: Shed}
	}
	return Verdict{Action: Admit, Priority: now}
}
func (g *alternateGate) CallStart(time.Duration, int64, int) bool { return true }
func (g *alternateGate) CallDone(time.Duration, int64, int)       {}
func (g *alternateGate) SessionDone(time.Duration, int64)         {}
func (g *alternateGate) Poll(time.Duration) []Release             { return nil }

// holdGate holds every session until release, then admits them all in arrival order.
type holdGate struct {
	release time.Duration
	held    []int64
	infos   map[int64]SessionInfo
	done    int
}

func (g *holdGate) Arrive(now time.Duration, s SessionInfo) Verdict {
	if now >= g.release {
		return Verdict{Action: Admit, Priority: now}
	}
	if g.infos == nil {
		g.infos = map[int64]SessionInfo{}
	}
	g.infos[s.ID] = s
	g.held = append(g.held, s.ID)
	return Verdict{Action: Hold}
}
func (g *holdGate) CallStart(time.Duration, int64, int) bool { return true }
func (g *holdGate) CallDone(time.Duration, int64, int)       {}
func (g *holdGate) SessionDone(time.Duration, int64)         { g.done++ }
func (g *holdGate) Poll(now time.Duration) []Release {
	if now < g.release {
		return nil
	}
	var out []Release
	for _, id := range g.held {
		out = append(out, Release{ID: id, Action: Admit, Priority: g.infos[id].Arrival})
	}
	g.held = nil
	return out
}

func TestGateHoldsAndReleases(t *testing.T) {
	g := &holdGate{release: 30 * time.Minute}
	o := opts1P1D(t, 4, 1)
	o.Gate = g
	o.Controller = nil
	var failed error
	o.Controller = invariantController(&failed)
	s, err := New(o)
	require.NoError(t, err)
	s.RunUntil(29 * time.Minute)
	obs := s.Observe()
	assert.Zero(t, obs.LiveSessions, "nothing starts while the gate holds")
	assert.Positive(t, obs.HeldSessions)
	assert.Zero(t, obs.WorkingSetTokens, "held sessions have no context in the cache")
	s.Run()
	require.NoError(t, failed)
	assert.Positive(t, g.done)
	held, after := 0, 0
	for _, ss := range s.sessions {
		switch {
		case ss.arrival < g.release && ss.started >= 0:
			held++
			assert.GreaterOrEqual(t, ss.started, g.release, "a held session started before its release")
		case ss.arrival >= g.release+time.Minute && ss.started >= 0:
			after++
		}
	}
	assert.Positive(t, held)
	assert.Positive(t, after)
}

func TestLending(t *testing.T) {
	// A deployment under cache pressure: lending must write prefixes back instead of recomputing
	// them, never lend more than its cap, and give every token back when switched off.
	o := opts1P1D(t, 5, 1)
	o.Deployment.Prefill.CacheTokens = 300_000
	o.Deployment.Lending = LendingState{Enabled: true, MaxFraction: 0.5}
	var failed error
	o.Controller = invariantController(&failed)
	s, err := New(o)
	require.NoError(t, err)
	s.RunUntil(40 * time.Minute)
	require.NoError(t, failed)
	var lentHits float64
	for _, st := range s.Stats() {
		if st.Role == RolePrefill {
			lentHits += st.CachedLent
		} else {
			assert.LessOrEqual(t, st.LentTokens, int(0.5*float64(st.MaxTotalTokens)))
			assert.Positive(t, st.LentTokens)
		}
	}
	assert.Positive(t, lentHits, "lent KV was written back to prefill")
	capWith := s.Observe().CacheCapacity
	s.SetLending(false, 0.5)
	require.NoError(t, s.checkInvariants())
	for _, st := range s.Stats() {
		if st.Role == RoleDecode {
			assert.Zero(t, st.LentTokens, "switching lending off reclaims everything")
		}
	}
	assert.Less(t, s.Observe().CacheCapacity, capWith, "lent KV counts as cache capacity")
	s.Run()
	require.NoError(t, failed)
}

func TestLendingRaisesHitRateUnderPressure(t *testing.T) {
	// With the cache too small for the working set, the same sessions hit more with lending on.
	base := opts1P1D(t, 6, 1)
	base.Deployment.Prefill.CacheTokens = 400_000
	off := run(t, base)
	base.Deployment.Lending.Enabled = true
	on := run(t, base)
	assert.Greater(t, *on.HitRateMeanWindow, *off.HitRateMeanWindow)
}

func TestDecodePreallocBlocksPrefill(t *testing.T) {
	// Decode too small for the load: requests wait for decode KV before prefill may start, and
	// reservations never exceed the memory.
	o := opts1P1D(t, 7, 1)
	o.Deployment.Decode.KVTokens = 120_000
	var failed error
	sawQueue := false
	o.Controller = &Controller{Every: 5 * time.Second, Tick: func(now time.Duration, c Control) {
		if failed == nil {
			failed = c.(*Sim).checkInvariants()
		}
		for _, st := range c.Stats() {
			if st.Role == RoleDecode && st.PreallocQueue > 0 {
				sawQueue = true
				assert.LessOrEqual(t, st.UsedTokens, st.MaxTotalTokens)
			}
		}
	}}
	s, err := New(o)
	require.NoError(t, err)
	s.Run()
	require.NoError(t, failed)
	assert.True(t, sawQueue, "a decode pre-allocation queue formed")
}

func TestHiCacheHostTier(t *testing.T) {
	o := opts1P1D(t, 8, 1)
	o.Deployment.Prefill.CacheTokens = 300_000
	o.Policy = PolicyHiCache
	s, err := New(o)
	require.NoError(t, err)
	s.RunUntil(45 * time.Minute)
	require.NoError(t, s.checkInvariants())
	var p InstanceStats
	for _, st := range s.Stats() {
		if st.Role == RolePrefill {
			p = st
		}
	}
	assert.Equal(t, 600_000, p.HostTotalTokens, "HiCache defaults to twice the GPU pool")
	assert.Positive(t, p.CachedHost, "prefixes evicted from the GPU came back from host memory")
	assert.LessOrEqual(t, p.HostUsedTokens, p.HostTotalTokens)
}

func TestContinuumPinsAndOrdersBySession(t *testing.T) {
	o := opts1P1D(t, 9, 2)
	o.Policy = PolicyContinuum
	var failed error
	pinnedSeen := false
	o.Controller = &Controller{Every: 5 * time.Second, Tick: func(now time.Duration, c Control) {
		s := c.(*Sim)
		if failed == nil {
			failed = s.checkInvariants()
		}
		if s.prefill[0].cache.pinned > 0 {
			pinnedSeen = true
		}
		// Program-level FCFS: the head of the prefill queue is the oldest session waiting.
		q := s.prefill[0].queue.Items()
		for _, r := range q {
			if len(q) > 0 && r.s.arrival < q[0].s.arrival {
				failed = errString("prefill queue head is not the oldest session")
			}
		}
	}}
	s, err := New(o)
	require.NoError(t, err)
	r := s.Run()
	require.NoError(t, failed)
	assert.True(t, pinnedSeen)
	assert.NotNil(t, r.HitRateMeanWindow)
}

type errString string

func (e errString) Error() string { return string(e) }

func TestKillAbortsEverything(t *testing.T) {
	o := opts1P1D(t, 10, 1)
	o.Streams = append(o.Streams, Stream{Class: "extra", Workload: workload(t, "short"), RatePerMin: 13.2,
		From: 15 * time.Minute, To: 25 * time.Minute, KillAt: 25 * time.Minute})
	var failed error
	o.Controller = invariantController(&failed)
	s, err := New(o)
	require.NoError(t, err)
	s.RunUntil(25*time.Minute + time.Second)
	require.NoError(t, failed)
	for _, ss := range s.sessions {
		if ss.class == "extra" {
			assert.NotEqual(t, stLive, ss.state, "session %d survived the kill", ss.id)
		}
	}
	s.Run()
	require.NoError(t, failed)
}

func TestCurveShapeInputs(t *testing.T) {
	// Completion rate with N sessions held live: more sessions complete more calls until the
	// working set passes the cache, then fewer (the cache-first shape the fluid model needs).
	rate := func(n int) float64 {
		o := opts1P1D(t, 11, 1)
		o.Streams = nil
		o.ClosedLoop = n
		o.ClosedWorkload = workload(t, "terminal-bench")
		o.Duration, o.MeasureFrom, o.MeasureTo = 50*time.Minute, 20*time.Minute, 50*time.Minute
		o.NoDrain = true
		s, err := New(o)
		require.NoError(t, err)
		s.RunUntil(20 * time.Minute)
		c0 := s.Observe().CallsCompleted
		s.RunUntil(50 * time.Minute)
		return float64(s.Observe().CallsCompleted-c0) / (30 * 60)
	}
	low, mid, high := rate(10), rate(35), rate(90)
	assert.Greater(t, mid, 1.5*low)
	assert.Less(t, high, 0.7*mid)
}

func TestExternalCalls(t *testing.T) {
	o := Options{Deployment: preset(t, "paper-1p1d-h100"), Duration: time.Hour, MeasureTo: time.Hour,
		External: true, NoDrain: true}
	s, err := New(o)
	require.NoError(t, err)
	var events []CallEvent
	note := func(ev CallEvent) { events = append(events, ev) }
	require.NoError(t, s.Submit(ExternalCall{Session: "a", Shared: 2000, Prompt: 10_000, Output: 100, Notify: note}))
	assert.ErrorIs(t, s.Submit(ExternalCall{Session: "a", Prompt: 11_000, Output: 10}), ErrBusy)
	s.RunUntil(time.Minute)
	require.NotEmpty(t, events)
	assert.Equal(t, FirstToken, events[0].Kind)
	assert.Equal(t, Done, events[len(events)-1].Kind)
	assert.Equal(t, 100, events[len(events)-1].Tokens)
	assert.Equal(t, 2000, events[0].CachedTokens, "a new session hits only the shared prefix")
	for i := 1; i < len(events); i++ {
		assert.GreaterOrEqual(t, events[i].At, events[i-1].At)
		assert.GreaterOrEqual(t, events[i].Tokens, events[i-1].Tokens)
	}

	events = nil
	require.NoError(t, s.Submit(ExternalCall{Session: "a", Prompt: 10_400, Output: 50, Notify: note}))
	s.RunUntil(2 * time.Minute)
	require.NotEmpty(t, events)
	assert.Equal(t, 10_000, events[0].CachedTokens, "the previous prompt is cached; PD prefill never saw the output")
	assert.Equal(t, int64(10_450), s.Observe().WorkingSetTokens)

	events = nil
	require.NoError(t, s.Submit(ExternalCall{Session: "a", Prompt: 11_000, Output: 5000, Notify: note}))
	s.RunUntil(2*time.Minute + 500*time.Millisecond)
	assert.True(t, s.EndSession("a"))
	assert.Equal(t, Aborted, events[len(events)-1].Kind)
	assert.Zero(t, s.Observe().LiveSessions)
	assert.False(t, s.EndSession("a"))
	require.NoError(t, s.checkInvariants())
	assert.Error(t, s.Submit(ExternalCall{Session: "b", Prompt: 0, Output: 1}))
}

func TestOptionsValidation(t *testing.T) {
	good := opts1P1D(t, 1, 1)
	cases := map[string]func(o *Options){
		"deployment.prefill.cache_tokens":   func(o *Options) { o.Deployment.Prefill.CacheTokens = 0 },
		"deployment.decode.kv_tokens":       func(o *Options) { o.Deployment.Decode.KVTokens = -1 },
		"deployment.lending.max_fraction":   func(o *Options) { o.Deployment.Lending.MaxFraction = 1.5 },
		"deployment.prefill.tokens_per_sec": func(o *Options) { o.Deployment.Prefill.TokensPerSec = math.NaN() },
		"slo.tpot_fraction":                 func(o *Options) { o.SLO = SLO{Slowdown: 4, TPOTMs: 50, TPOTFraction: 2} },
		"measure":                           func(o *Options) { o.MeasureTo = 2 * time.Hour },
		"policy":                            func(o *Options) { o.Policy = "lru-magic" },
		"arrivals: no arrival stream":       func(o *Options) { o.Streams = nil },
		"rate_per_min must be ≥ 0":          func(o *Options) { o.Streams[0].RatePerMin = -1 },
		"deployment.prefill.load_back_tokens_": func(o *Options) {
			o.Deployment.Prefill.HostCacheTokens, o.Deployment.Prefill.LoadBackTokensPerSec = 1, 0
		},
	}
	for want, mutate := range cases {
		t.Run(want, func(t *testing.T) {
			o := good
			o.Streams = append([]Stream(nil), good.Streams...)
			mutate(&o)
			_, err := New(o)
			require.Error(t, err)
			assert.Contains(t, err.Error(), want)
		})
	}
	_, err := New(good)
	assert.NoError(t, err)
}

func TestWorkloadShapes(t *testing.T) {
	// The generators' headline statistics, as docs/simulator.md states them.
	cases := []struct {
		kind                         string
		medianPromptLo, medianPrompt float64
		peakLo, peakHi               float64
		reuseLo                      float64
	}{
		{"terminal-bench", 20_000, 30_000, 25_000, 60_000, 0.96},
		{"swebench-pro", 45_000, 75_000, 95_000, 120_000, 0.97},
		{"short", 10_000, 20_000, 12_000, 28_000, 0.93},
	}
	for _, tc := range cases {
		t.Run(tc.kind, func(t *testing.T) {
			w := workload(t, tc.kind)
			s, err := New(opts1P1D(t, 1, 1))
			require.NoError(t, err)
			var prompts, peaks []float64
			var reused, sent float64
			for i := range 500 {
				spec := w.Session(s.sessionRNG(0, uint64(i)))
				peaks = append(peaks, float64(spec.PeakContext()))
				for j, c := range spec.Calls {
					prompts = append(prompts, float64(c.Prompt))
					if j > 0 {
						reused += float64(c.Reused)
						sent += float64(c.Prompt)
					}
				}
			}
			mp, pk := median(prompts), median(peaks)
			assert.True(t, mp >= tc.medianPromptLo && mp <= tc.medianPrompt, "median prompt %.0f", mp)
			assert.True(t, pk >= tc.peakLo && pk <= tc.peakHi, "median peak context %.0f", pk)
			assert.Greater(t, reused/sent, tc.reuseLo)
		})
	}
	short := workload(t, "short")
	s, err := New(opts1P1D(t, 1, 1))
	require.NoError(t, err)
	over := 0
	for i := range 500 {
		if s.dep.UnloadedTime(short.Session(s.sessionRNG(0, uint64(i)))) > 5*time.Minute {
			over++
		}
	}
	assert.LessOrEqual(t, over, 5, "short sessions finish in under five minutes on a healthy engine")
}

func BenchmarkHour1P3D(b *testing.B) {
	w := workload(b, "terminal-bench")
	for b.Loop() {
		s, err := New(Options{Seed: 1, Deployment: preset(b, "paper-1p3d-h200"), Duration: time.Hour,
			MeasureTo: time.Hour, NoDrain: true, Streams: []Stream{{Class: "base", Workload: w, RatePerMin: 6}}})
		if err != nil {
			b.Fatal(err)
		}
		s.Run()
	}
}

func BenchmarkTrapped1P1D(b *testing.B) {
	o := opts1P1D(b, 1, 2)
	for b.Loop() {
		s, err := New(o)
		if err != nil {
			b.Fatal(err)
		}
		s.Run()
	}
}

// TestDecodeStepFromBandwidth checks the bandwidth-derived step against the arithmetic in
// docs/simulator.md and the properties the model rests on.
func TestDecodeStepFromBandwidth(t *testing.T) {
	h100 := preset(t, "paper-1p1d-h100")
	// A batch of one at 25K tokens of context: 2.45 GB of dense weights, 8/256 of 32.2 GB of
	// experts, 25,000 × 20,480 B of KV and 128.8 MB of state over 0.7 × 3.35 TB/s, plus 3 ms.
	want := 3 + (2.45e9+32.2e9*8/256+25_000*20_480+128.8e6)/(0.7*3350e9)*1000
	assert.InDelta(t, want, float64(h100.StepTime(1, 25_000))/1e6, 1e-3)

	q := h100.Decode
	assert.InDelta(t, 8.0/256, q.expertCoverage(1), 1e-12, "one token reads its 8 experts")
	assert.Greater(t, q.expertCoverage(200), 0.99, "a large batch reads nearly every expert")
	assert.Greater(t, h100.StepTime(20, 600_000), h100.StepTime(10, 600_000), "more sequences, more bytes")
	assert.Greater(t, h100.StepTime(10, 600_000), h100.StepTime(10, 300_000), "more context, more KV")

	h200 := preset(t, "paper-1p3d-h200")
	assert.Less(t, h200.StepTime(10, 300_000), h100.StepTime(10, 300_000), "H200 has more bandwidth")

	// The fullest batch each decode GPU can hold (its whole KV pool, sequences of 25K tokens)
	// stays under the 50 ms TPOT: on these presets the TPOT clause cannot bind.
	for _, d := range []Deployment{h100, h200} {
		n := d.Decode.KVTokens / 25_000
		assert.Less(t, d.StepTime(n, int64(d.Decode.KVTokens)), 50*time.Millisecond)
	}

	legacy := h100
	legacy.Decode = DecodePool{Instances: 1, KVTokens: 800_000, StepBaseMs: 15, StepPerKTokenMs: 0.01, StepPerSeqMs: 0.05}
	require.NoError(t, legacy.Validate())
	assert.Equal(t, seconds((15+0.01*300+0.05*10)/1000), legacy.StepTime(10, 300_000), "the empirical formula still works")
}

func TestDecodeStepValidation(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(q *DecodePool)
		field string
	}{
		{"both formulas", func(q *DecodePool) { q.StepBaseMs = 15 }, "deployment.decode.step_base_ms"},
		{"neither formula", func(q *DecodePool) { q.HBMGBPerSec = 0 }, "deployment.decode.step_base_ms"},
		{"efficiency above 1", func(q *DecodePool) { q.BandwidthEfficiency = 1.2 }, "deployment.decode.bandwidth_efficiency"},
		{"no efficiency", func(q *DecodePool) { q.BandwidthEfficiency = 0 }, "deployment.decode.bandwidth_efficiency"},
		{"negative KV bytes", func(q *DecodePool) { q.KVBytesPerToken = -1 }, "deployment.decode.kv_bytes_per_token"},
		{"no weights", func(q *DecodePool) { q.WeightBytes, q.ExpertWeightBytes = 0, 0 }, "deployment.decode.weight_bytes"},
		{"more routed than experts", func(q *DecodePool) { q.ExpertsPerToken = 300 }, "deployment.decode.experts_per_token"},
		{"routing without experts", func(q *DecodePool) { q.Experts = 0 }, "deployment.decode.experts_per_token"},
		{"infinite bandwidth", func(q *DecodePool) { q.HBMGBPerSec = math.Inf(1) }, "deployment.decode.hbm_gb_per_sec"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := preset(t, "paper-1p1d-h100")
			c.edit(&d.Decode)
			err := d.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.field)
		})
	}
	d := preset(t, "paper-1p1d-h100")
	d.Decode.Experts, d.Decode.ExpertsPerToken = 0, 0
	require.NoError(t, d.Validate(), "a dense model: experts 0 reads all expert bytes")
	assert.InDelta(t, 1, d.Decode.expertCoverage(1), 1e-12)
}

func TestSessionCountsSplitTheSLOClauses(t *testing.T) {
	o := opts1P1D(t, 1, 1)
	o.Duration, o.MeasureFrom, o.MeasureTo = 30*time.Minute, 5*time.Minute, 25*time.Minute
	o.SLO = SLO{Slowdown: 4, TPOTMs: 1, TPOTFraction: 0.95} // no decode step is that fast
	r := run(t, o)
	require.Positive(t, r.Sessions.Completed)
	assert.Equal(t, r.Sessions.Completed, r.Sessions.SlowTokens)
	assert.Zero(t, r.Sessions.Late, "a healthy deployment finishes within 4× unloaded")
	assert.Zero(t, r.Sessions.Good)
	o.SLO = SLO{Slowdown: 1, TPOTMs: 50, TPOTFraction: 0.95} // any queueing makes a session late
	r = run(t, o)
	assert.Positive(t, r.Sessions.Late)
	assert.Zero(t, r.Sessions.SlowTokens)
	assert.Equal(t, r.Sessions.Completed-r.Sessions.Late, r.Sessions.Good)
}

// callHoldGate admits every session and holds every later call of the even sessions between
// from and until, then lets them go at once.
type callHoldGate struct {
	from, until time.Duration
	waiting     []int64
}

func (g *callHoldGate) Arrive(now time.Duration, s SessionInfo) Verdict {
	return Verdict{Action: Admit, Priority: now}
}
func (g *callHoldGate) CallStart(now time.Duration, id int64, _ int) bool {
	if id%2 == 1 || now < g.from || now >= g.until {
		return true
	}
	g.waiting = append(g.waiting, id)
	return false
}
func (g *callHoldGate) CallDone(time.Duration, int64, int) {}
func (g *callHoldGate) SessionDone(time.Duration, int64)   {}
func (g *callHoldGate) Poll(now time.Duration) []Release {
	if now < g.until {
		return nil
	}
	var out []Release
	for _, id := range g.waiting {
		out = append(out, Release{ID: id, Action: Admit})
	}
	g.waiting = nil
	return out
}

func TestGateHoldsLiveSessionsCalls(t *testing.T) {
	g := &callHoldGate{from: 20 * time.Minute, until: 25 * time.Minute}
	o := opts1P1D(t, 4, 1)
	o.Gate = g
	var failed error
	o.Controller = invariantController(&failed)
	s, err := New(o)
	require.NoError(t, err)
	s.RunUntil(24 * time.Minute)
	require.NoError(t, failed)
	obs := s.Observe()
	require.Positive(t, obs.HeldCalls, "even sessions' calls wait")
	assert.Zero(t, obs.HeldSessions, "no first call waits: the sessions are live")
	for _, ss := range s.sessions {
		if ss.callHeld {
			assert.Zero(t, ss.id%2, "only even sessions are held")
			assert.Nil(t, ss.inFlight, "a held call is not at the engines")
		}
	}
	s.RunUntil(25*time.Minute + time.Second)
	assert.Zero(t, s.Observe().HeldCalls, "every held call went at the release")
	res := s.Run()
	require.NoError(t, failed)
	assert.Zero(t, res.Sessions.Killed, "holding cuts no session")
	assert.Positive(t, res.Sessions.Completed)
	var heldMinute bool
	for _, m := range res.Timeline {
		if m.Minute >= 20 && m.Minute < 24 && m.HeldCalls > 0 {
			heldMinute = true
		}
	}
	assert.True(t, heldMinute, "the timeline counts held calls")
}
