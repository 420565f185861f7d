package detector

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testK = 40.0

// simCurve is a completion curve shaped like the simulator's paper-1p1d-h100 one, in sessions per
// minute: rising linearly to a peak of 5.1 at N = 40, falling to 0.5 at N = 60, flat after.
func simCurve(n float64) float64 {
	switch {
	case n <= 40:
		return 5.1 * n / 40
	case n <= 60:
		return 5.1 - 0.23*(n-40)
	}
	return 0.5
}

// callRate is X(N) in calls per second for simCurve.
func callRate(n float64) float64 { return simCurve(n) * testK / 60 }

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

// fluidClock feeds a Fluid observations 5 s apart.
type fluidClock struct {
	f  *Fluid
	at time.Time
}

func (c *fluidClock) observe(n, lambdaPerMin float64) {
	c.at = c.at.Add(5 * time.Second)
	c.f.Observe(c.at, FluidObservation{
		LiveSessions: n, CallRate: callRate(n), CompletionRate: simCurve(n) / 60,
		ArrivalRate: lambdaPerMin / 60, WorkingSet: n * 25_000,
	})
}

// learnt returns a fluid model that has seen N = 1…maxN six times each at arrival rate λ.
func learnt(t *testing.T, maxN int, lambdaPerMin float64) *fluidClock {
	t.Helper()
	f, err := NewFluid(FluidOptions{CallsPerSession: testK})
	require.NoError(t, err)
	c := &fluidClock{f: f, at: t0}
	for range 6 {
		for n := 1; n <= maxN; n++ {
			c.observe(float64(n), lambdaPerMin)
		}
	}
	return c
}

func TestFluidEquilibria(t *testing.T) {
	tests := []struct {
		name             string
		lambda           float64 // per minute
		maxN             int
		kneeN            float64
		stable, unstable float64 // 0: nil
		estimated, noEq  bool
	}{
		// 3.3/min: up through λ at 40 × 3.3/5.1, down at 40 + (5.1 − 3.3)/0.23.
		{name: "λ inside the curve", lambda: 3.3, maxN: 80, kneeN: 70, stable: 40 * 3.3 / 5.1, unstable: 40 + 1.8/0.23},
		{name: "λ above the peak: no equilibrium", lambda: 6, maxN: 80, kneeN: 70, noEq: true},
		{name: "λ above the curve seen so far, knee not reached: unknown", lambda: 6, maxN: 30, kneeN: 70, unstable: 70, estimated: true},
		{name: "λ above the curve up to the knee: no equilibrium", lambda: 6, maxN: 30, kneeN: 25, noEq: true},
		// The curve never falls below 0.3/min: the edge is at least the last N seen above λ.
		// (The last bin holds N = 79 and 80: its mean is 79.5.)
		{name: "λ below the whole falling side", lambda: 0.3, maxN: 80, kneeN: 70, stable: 40 * 0.3 / 5.1, unstable: 79.5, estimated: true},
		{name: "rising side only: the knee bounds the edge", lambda: 3.3, maxN: 30, kneeN: 50, stable: 40 * 3.3 / 5.1, unstable: 50, estimated: true},
		{name: "rising side only, no knee: no edge", lambda: 3.3, maxN: 30, stable: 40 * 3.3 / 5.1},
		// No arrivals: everything drains to 0 (checked as "< 0.3" below), the knee bounds the edge.
		{name: "no arrivals", lambda: 0, maxN: 80, kneeN: 70, stable: 1e-9, unstable: 70, estimated: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := learnt(t, tc.maxN, tc.lambda)
			assert.InDelta(t, tc.lambda/60, c.f.Lambda(), 1e-12)
			e := c.f.Equilibria(c.f.Lambda(), testK, tc.kneeN)
			checkN := func(want float64, got *float64, what string) {
				if want == 0 {
					assert.Nil(t, got, what)
					return
				}
				if assert.NotNil(t, got, what) {
					assert.InDelta(t, want, *got, 0.3, what)
				}
			}
			checkN(tc.stable, e.Stable, "stable")
			checkN(tc.unstable, e.Unstable, "unstable")
			assert.Equal(t, tc.estimated, e.Estimated, "estimated")
			assert.Equal(t, tc.noEq, e.NoEquilibrium, "no equilibrium")
		})
	}
}

func TestFluidNoisyDipIsNotTheEdge(t *testing.T) {
	c := learnt(t, 80, 3.3)
	// A bin on the rising side reads low (a transient): the curve dips under λ and comes back.
	for range 50 {
		c.at = c.at.Add(5 * time.Second)
		c.f.Observe(c.at, FluidObservation{LiveSessions: 30, CallRate: 0.1, CompletionRate: 0.001, ArrivalRate: 3.3 / 60, WorkingSet: 30 * 25_000})
	}
	e := c.f.Equilibria(c.f.Lambda(), testK, 70)
	require.NotNil(t, e.Unstable)
	assert.InDelta(t, 40+1.8/0.23, *e.Unstable, 0.3)
	assert.False(t, e.Estimated)
}

// TestFluidLambdaSmoothing: a one-minute burst barely moves the equilibria; the same rise
// sustained for half an hour pushes λ over the peak.
func TestFluidLambdaSmoothing(t *testing.T) {
	c := learnt(t, 80, 3.3)
	before := c.f.Equilibria(c.f.Lambda(), testK, 70)
	require.NotNil(t, before.Unstable)
	for range 12 { // one minute at twice the rate
		c.observe(25, 6.6)
	}
	burst := c.f.Equilibria(c.f.Lambda(), testK, 70)
	require.NotNil(t, burst.Unstable)
	assert.InDelta(t, 3.3*(2-0.9048), c.f.Lambda()*60, 0.01, "λ moved by 1 − e^(−1/10) of the rise")
	assert.Less(t, *before.Unstable-*burst.Unstable, 1.5, "a burst must not move the edge much")
	assert.Greater(t, *before.Unstable-*burst.Unstable, 0.5, "but it does move it")
	for range 12 * 29 {
		c.observe(25, 6.6)
	}
	sustained := c.f.Equilibria(c.f.Lambda(), testK, 70)
	assert.Greater(t, c.f.Lambda()*60, 5.1)
	assert.True(t, sustained.NoEquilibrium, "sustained λ above the peak: no equilibrium")
	assert.Nil(t, sustained.Unstable)
}

// TestFluidSettledLambda: λ starts at its first reading and keeps e^(−t/τ) of it; the settled λ
// gives the first reading no weight, and its standard error falls from λ/t at the start to
// λ/(2τ) long after.
func TestFluidSettledLambda(t *testing.T) {
	f, err := NewFluid(FluidOptions{})
	require.NoError(t, err)
	at := time.Unix(0, 0)
	obs := func(perMin, live, ws float64) {
		f.Observe(at, FluidObservation{LiveSessions: live, ArrivalRate: perMin / 60, WorkingSet: ws})
		at = at.Add(5 * time.Second)
	}
	obs(18, 2, 40_000) // a cold start's first reading: a few arrivals over a short window
	assert.InDelta(t, 18, f.SettledLambda()*60, 1e-9, "λ until a second reading")
	assert.True(t, math.IsInf(f.SettledLambdaSD(), 1), "no error known from one reading")
	assert.True(t, math.IsInf(f.LongLambdaSD(), 1), "no error known from one reading")
	for range 12 * 5 { // five minutes at 5.5 a minute
		obs(5.5, 20, 400_000)
	}
	assert.InDelta(t, 5.5, f.SettledLambda()*60, 1e-9, "the first reading carries no weight")
	assert.Greater(t, f.Lambda()*60, 8.0, "λ still holds over half of the first reading's excess")
	// Five minutes in: the error of a 5.5/min Poisson rate averaged over about five minutes.
	sd5 := f.SettledLambdaSD() * 60
	assert.InDelta(t, math.Sqrt(5.5/5.0), sd5, 0.15, "about √(λ/t) early")
	assert.InDelta(t, math.Sqrt(5.5/5.0), f.LongLambdaSD()*60, 0.1, "the long-run rate's too: √(λ/t) early")
	for range 12 * 120 { // two hours more
		obs(5.5, 20, 400_000)
	}
	assert.InDelta(t, math.Sqrt(5.5/20), f.SettledLambdaSD()*60, 0.01, "√(λ/2τ) long after the start, τ = 10 min")
	assert.Less(t, f.SettledLambdaSD()*60, sd5)
	// Two hours in, the long-run rate (τ = 60 min) is still between its early √(λ/t) and its
	// √(λ/2τ) long after.
	long := f.LongLambdaSD() * 60
	assert.Greater(t, long, math.Sqrt(5.5/120), "over about two hours")
	assert.Less(t, long, math.Sqrt(5.5/125*1.5), "at most ×1.5 the variance of two hours' average")
}

// TestFluidMeanContext: the mean context is the smoothed working set over the smoothed live
// sessions, so a few long sessions coming and going move it less than W/live does.
func TestFluidMeanContext(t *testing.T) {
	f, err := NewFluid(FluidOptions{})
	require.NoError(t, err)
	at := time.Unix(0, 0)
	for range 12 * 30 { // half an hour of 20 sessions at 20K
		f.Observe(at, FluidObservation{LiveSessions: 20, WorkingSet: 400_000, ArrivalRate: 0.05})
		at = at.Add(5 * time.Second)
	}
	assert.InDelta(t, 20_000, f.MeanContext(), 1)
	for range 12 { // a minute in which two 200K sessions join: W/live is 36K
		f.Observe(at, FluidObservation{LiveSessions: 22, WorkingSet: 800_000, ArrivalRate: 0.05})
		at = at.Add(5 * time.Second)
	}
	assert.Greater(t, f.MeanContext(), 20_000.0)
	assert.Less(t, f.MeanContext(), 24_000.0, "a minute moves it by a fifth of the way (τ = 5 min)")
	assert.Equal(t, f.MeanContext(), f.Outlook(22, 1.25, 560_000).MeanContext)
}

func TestFluidTimeToTrap(t *testing.T) {
	edge := 40 + 1.8/0.23
	tests := []struct {
		name     string
		from, to float64 // N moves from → to, by 1 every 10 s
		lambda   float64
		growing  bool
		pastEdge bool
	}{
		{name: "growing towards the edge", from: 30, to: 42, lambda: 3.3, growing: true},
		{name: "shrinking", from: 42, to: 30, lambda: 3.3},
		{name: "growing past the edge", from: 40, to: 52, lambda: 3.3, growing: true, pastEdge: true},
		{name: "steady at the stable point", from: 26, to: 26, lambda: 3.3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := learnt(t, 80, tc.lambda)
			step := 1.0
			if tc.to < tc.from {
				step = -1
			}
			n := tc.from
			for i := 0; i < 30; i++ {
				c.observe(n, tc.lambda)
				c.observe(n, tc.lambda)
				if n != tc.to {
					n += step
				}
			}
			out := c.f.Outlook(n, 1.9, 70*25_000/1.9) // the knee at N = 70, past the edge
			require.NotNil(t, out.DistanceToEdge)
			assert.InDelta(t, edge-n, *out.DistanceToEdge, 0.3)
			if !tc.growing {
				assert.Nil(t, out.TimeToTrap)
				return
			}
			require.NotNil(t, out.TimeToTrap)
			rate := max(out.ModelSlope, out.ObservedSlope)
			assert.Greater(t, rate, 0.0)
			if tc.pastEdge {
				assert.Zero(t, *out.TimeToTrap)
				return
			}
			assert.Greater(t, *out.TimeToTrap, time.Duration(0))
			assert.InDelta(t, (edge-n)/rate, out.TimeToTrap.Seconds(), 3)
		})
	}
}

func TestFluidLearnsK(t *testing.T) {
	f, err := NewFluid(FluidOptions{})
	require.NoError(t, err)
	at := t0
	_, ok := f.K()
	assert.False(t, ok, "no K before any completion")
	// 0.055 sessions/s complete: 30 sessions take 545 s.
	for i := range 200 {
		at = at.Add(5 * time.Second)
		f.Observe(at, FluidObservation{LiveSessions: 25, CallRate: 2.2, CompletionRate: 0.055, ArrivalRate: 0.055, WorkingSet: 625_000})
		if i == 100 {
			_, ok := f.K()
			assert.False(t, ok, "K after %d completed sessions", int(0.055*5*float64(i)))
		}
	}
	k, ok := f.K()
	require.True(t, ok)
	assert.InDelta(t, 40, k, 1e-6)

	// A calibration's K wins over the learnt one; an option's over both.
	f.Seed(&Calibration{CallsPerSession: 25})
	k, _ = f.K()
	assert.Equal(t, 25.0, k)
	fixed, err := NewFluid(FluidOptions{CallsPerSession: 60})
	require.NoError(t, err)
	fixed.Seed(&Calibration{CallsPerSession: 25})
	k, _ = fixed.K()
	assert.Equal(t, 60.0, k)
}

func TestFluidSeed(t *testing.T) {
	f, err := NewFluid(FluidOptions{})
	require.NoError(t, err)
	cal := &Calibration{CallsPerSession: testK}
	for n := 5.0; n <= 80; n += 5 {
		cal.Points = append(cal.Points, Point{Sessions: n, CompletionRatePerS: simCurve(n) / 60})
	}
	f.Seed(cal)
	f.Observe(t0, FluidObservation{LiveSessions: 20, CallRate: callRate(20), CompletionRate: simCurve(20) / 60, ArrivalRate: 3.3 / 60, WorkingSet: 500_000})
	k, ok := f.K()
	require.True(t, ok)
	e := f.Equilibria(f.Lambda(), k, 0)
	require.NotNil(t, e.Stable)
	require.NotNil(t, e.Unstable)
	assert.InDelta(t, 40*3.3/5.1, *e.Stable, 0.3)
	assert.InDelta(t, 40+1.8/0.23, *e.Unstable, 0.3)
	assert.False(t, e.Estimated)
}

func TestFluidBins(t *testing.T) {
	// Width 1 up to 20, then about 5% of N.
	assert.Equal(t, 0, fluidBinIndex(0.5))
	assert.Equal(t, 19, fluidBinIndex(19.9))
	assert.Equal(t, 20, fluidBinIndex(20))
	assert.Equal(t, 20, fluidBinIndex(20.9))
	assert.Equal(t, 21, fluidBinIndex(21.1))
	assert.Less(t, fluidBinIndex(10_000), 160)
	assert.Less(t, fluidBinIndex(1e6), 250)
	assert.Equal(t, 1, fluidBinIndex(10_000*1.05)-fluidBinIndex(10_000), "bins are 5% wide at 10,000")
}

func TestFluidOptions(t *testing.T) {
	for _, tc := range []struct {
		o    FluidOptions
		want string
	}{
		{FluidOptions{LambdaTau: -time.Second}, "Fluid.LambdaTau"},
		{FluidOptions{KTau: -time.Second}, "Fluid.KTau"},
		{FluidOptions{SlopeTau: -time.Second}, "Fluid.SlopeTau"},
		{FluidOptions{BinAlpha: 1.5}, "Fluid.BinAlpha"},
		{FluidOptions{MinBinSamples: -1}, "Fluid.MinBinSamples"},
		{FluidOptions{CallsPerSession: 0.5}, "Fluid.CallsPerSession"},
		{FluidOptions{MinCompletions: -1}, "Fluid.MinCompletions"},
	} {
		_, err := NewFluid(tc.o)
		assert.ErrorContains(t, err, tc.want)
	}
}

// TestFluidCrossingInAGap: the curve was seen up to the peak and again far down its falling side,
// never in between; the fall through λ is interpolated across the gap and flagged as estimated.
func TestFluidCrossingInAGap(t *testing.T) {
	f, err := NewFluid(FluidOptions{CallsPerSession: testK})
	require.NoError(t, err)
	c := &fluidClock{f: f, at: t0}
	for range 6 {
		for n := 1; n <= 80; n++ {
			if n <= 40 || n >= 58 {
				c.observe(float64(n), 3.3)
			}
		}
	}
	tests := []struct {
		kneeN, want float64
	}{
		// 5.1/min at 40, 5.1 − 0.23 × 18 = 0.96/min at 58: 3.3/min is crossed at 40 + 18 × 1.8/4.14.
		{kneeN: 70, want: 40 + 18*1.8/4.14},
		// A knee inside the gap bounds it.
		{kneeN: 45, want: 45},
	}
	for _, tc := range tests {
		e := f.Equilibria(f.Lambda(), testK, tc.kneeN)
		require.NotNil(t, e.Unstable)
		assert.InDelta(t, tc.want, *e.Unstable, 0.3)
		assert.True(t, e.Estimated)
	}
}

// TestFluidRampUpIsNotOverload: a deployment ramping up sees λ above the few populations it has
// been through — that is why N grows — and one low last bin is not a falling side.
func TestFluidRampUpIsNotOverload(t *testing.T) {
	f, err := NewFluid(FluidOptions{CallsPerSession: testK})
	require.NoError(t, err)
	c := &fluidClock{f: f, at: t0}
	for n := 1.0; n <= 14; n++ {
		for range 6 {
			c.observe(n, 3.3)
		}
	}
	for range 6 { // the last bin reads 20% low
		c.at = c.at.Add(5 * time.Second)
		f.Observe(c.at, FluidObservation{LiveSessions: 15, CallRate: 0.8 * callRate(15), CompletionRate: 0.01, ArrivalRate: 3.3 / 60, WorkingSet: 15 * 25_000})
	}
	e := f.Equilibria(f.Lambda(), testK, 70)
	assert.False(t, e.NoEquilibrium)
	assert.Nil(t, e.Stable)
	require.NotNil(t, e.Unstable)
	assert.Equal(t, 70.0, *e.Unstable)
	assert.True(t, e.Estimated)
}

// TestFluidPeak: the learnt peak counts only once the curve has been seen falling past it; before,
// the highest point seen is a lower bound.
func TestFluidPeak(t *testing.T) {
	for _, tc := range []struct {
		maxN   int
		wantOK bool
	}{
		{maxN: 30, wantOK: false}, // still rising
		{maxN: 42, wantOK: false}, // past the peak, not 10% under it
		{maxN: 60, wantOK: true},
	} {
		t.Run(fmt.Sprint(tc.maxN), func(t *testing.T) {
			c := learnt(t, tc.maxN, 3.3)
			p, ok := c.f.Peak()
			assert.Equal(t, tc.wantOK, ok)
			if ok {
				assert.InDelta(t, 5.1/60, p, 0.2/60, "bins 5% wide average the top of the curve")
			}
		})
	}
	f, err := NewFluid(FluidOptions{})
	require.NoError(t, err)
	_, ok := f.Peak()
	assert.False(t, ok, "no K, no peak")
}

func TestDetectorCurve(t *testing.T) {
	d, err := New(Options{})
	require.NoError(t, err)
	assert.Nil(t, d.Curve(), "K unknown: no curve")
	cal := &Calibration{Version: 1, KneeRatio: 1.8, PlateauHit: 0.96, PeakCompletionRatePerS: 5.1 / 60,
		CallsPerSession: testK, Created: t0, Source: "test"}
	for n := 10.0; n <= 60; n += 10 {
		cal.Points = append(cal.Points, Point{WorkingSetOverCache: n / 40, HitRate: 0.96, Sessions: n, CompletionRatePerS: simCurve(n) / 60})
	}
	d, err = New(Options{Calibration: cal})
	require.NoError(t, err)
	c := d.Curve()
	require.Len(t, c, 6)
	assert.InDelta(t, 40, c[3].N, 1e-9)
	assert.InDelta(t, 5.1/60, c[3].SessionsPerS, 1e-9)
}

// The long-run rate is the average of what has been seen while that is shorter than its hour, so
// a cold start does not hold it down for an hour; a spike weighs by its share of that history.
func TestFluidLongLambda(t *testing.T) {
	f, err := NewFluid(FluidOptions{CallsPerSession: testK})
	require.NoError(t, err)
	c := &fluidClock{f: f, at: t0}
	for range 12 * 30 {
		c.observe(10, 6)
	}
	long := func() float64 { return c.f.Outlook(10, 2, 1e6).LongLambda * 60 }
	assert.InDelta(t, 6, long(), 0.05, "half an hour at 6/min after one empty reading")
	for range 12 * 10 { // a 10-minute doubling
		c.observe(10, 12)
	}
	for range 12 * 3 {
		c.observe(10, 6)
	}
	// 43 minutes seen, the spike 3–13 minutes ago: its weight is (e^(−3/60) − e^(−13/60)) ÷
	// (1 − e^(−43/60)) = 0.285 of the history.
	assert.InDelta(t, 6*1.285, long(), 0.02)
	assert.Less(t, long(), c.f.Lambda()*60+1, "not above λ three minutes after the spike")
}

// TestFluidServedFraction: the served fraction is unknown until a step reads the sessions in a
// call, and smoothed over MeanContextTau after: a step with nobody in a call moves it by the
// step's weight, not to 0.
func TestFluidServedFraction(t *testing.T) {
	f, err := NewFluid(FluidOptions{})
	require.NoError(t, err)
	at := time.Unix(0, 0)
	obs := func(inCall float64, ok bool) {
		f.Observe(at, FluidObservation{LiveSessions: 40, ArrivalRate: 0.1, WorkingSet: 1e6, InCall: inCall, InCallOK: ok})
		at = at.Add(5 * time.Second)
	}
	for range 12 {
		obs(0, false)
	}
	_, ok := f.ServedFraction()
	assert.False(t, ok, "no gateway: unknown")
	assert.Nil(t, f.Outlook(40, 1.25, 1e6).ServedFraction)
	for range 12 * 10 { // ten minutes with 10 of 40 in a call
		obs(10, true)
	}
	v, ok := f.ServedFraction()
	require.True(t, ok)
	assert.InDelta(t, 0.25, v, 1e-9)
	obs(0, true) // an instant with nobody in a call
	v, _ = f.ServedFraction()
	assert.Less(t, v, 0.25, "the step counts")
	assert.Greater(t, v, 0.24, "by its 5 s of the 5 minutes' weight, not to 0")
	obs(0, false) // a step without the reading leaves it
	w, _ := f.ServedFraction()
	assert.Equal(t, v, w)
	assert.InDelta(t, v, *f.Outlook(40, 1.25, 1e6).ServedFraction, 1e-12)
}
