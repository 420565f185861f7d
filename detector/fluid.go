package detector

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Fluid model defaults.
const (
	// DefaultLambdaTau is the time constant of the arrival-rate EWMA behind λ (basin's design
	// value, 10 minutes): a 10-minute spike, the paper's trigger, moves λ by 1 − 1/e of its size, so
	// the equilibria shift while it lasts, but a one-minute burst moves them by a tenth of its size.
	DefaultLambdaTau = 10 * time.Minute
	// DefaultKTau is the time constant of the call and completion rate EWMAs whose ratio is K:
	// chosen because K is a property of the workload, and in a transient calls complete for
	// sessions that have not ended yet, so the ratio only means K over many session lifetimes.
	DefaultKTau = 30 * time.Minute
	// DefaultSlopeTau is the time constant of the observed dN/dt: chosen as a minute, the
	// collector's rate window, so it follows a spike within a minute without echoing one scrape.
	DefaultSlopeTau = time.Minute
	// DefaultFluidBinAlpha is the floor of a sample's weight in its N bin (memory of about 20
	// samples): X(N) differs on the healthy and the collapsed branch of the cache hysteresis, so
	// recent samples must win. Chosen, not measured.
	DefaultFluidBinAlpha = 0.05
	// DefaultFluidMinBinSamples is how many samples make an N bin part of the curve: chosen so
	// one sample taken in a transient is not a point of the curve.
	DefaultFluidMinBinSamples = 5
	// DefaultMinCompletions is how many sessions must have completed (integrated completion rate)
	// before a learnt K is used: chosen for a relative error of about 1/√30 ≈ 18%.
	DefaultMinCompletions = 30
	// fluidLinearBins is where N bins turn from width 1 to width ≈ N/20 (5% of N): the curve is
	// measured in whole sessions for small deployments and in 5% steps for large ones, which keeps
	// a 10,000-session deployment to about 150 bins.
	fluidLinearBins = 20
	// fallenPeak: the falling side of the curve counts as observed when its last point is 10%
	// under the peak, more than the bins' EWMA noise. Chosen.
	fallenPeak = 0.9
	// minAfterPeak: and when at least two curve points follow the peak, so one noisy bin at the
	// end of a sparse curve (a deployment ramping up) does not read as a falling side.
	minAfterPeak = 2
	// maxCrossingGap: a crossing between curve points more than two bins apart (more than one
	// unobserved bin between them) is interpolated across a gap and reported as estimated.
	maxCrossingGap = 2
	// maxTimeToTrap: a trap further away than this is reported as none (N is not growing at a
	// rate that matters), which also keeps the duration from overflowing.
	maxTimeToTrap = 30 * 24 * time.Hour
)

var logBinRatio = math.Log(1 + 1.0/fluidLinearBins)

// FluidOptions configure the fluid model. Zero fields take the defaults.
type FluidOptions struct {
	LambdaTau     time.Duration // DefaultLambdaTau
	KTau          time.Duration // DefaultKTau
	SlopeTau      time.Duration // DefaultSlopeTau
	BinAlpha      float64       // DefaultFluidBinAlpha
	MinBinSamples int           // DefaultFluidMinBinSamples
	// CallsPerSession fixes K; 0 takes it from the calibration (Seed) or learns it.
	CallsPerSession float64
	MinCompletions  float64 // DefaultMinCompletions
}

func (o FluidOptions) withDefaults() FluidOptions {
	if o.LambdaTau == 0 {
		o.LambdaTau = DefaultLambdaTau
	}
	if o.KTau == 0 {
		o.KTau = DefaultKTau
	}
	if o.SlopeTau == 0 {
		o.SlopeTau = DefaultSlopeTau
	}
	if o.BinAlpha == 0 {
		o.BinAlpha = DefaultFluidBinAlpha
	}
	if o.MinBinSamples == 0 {
		o.MinBinSamples = DefaultFluidMinBinSamples
	}
	if o.MinCompletions == 0 {
		o.MinCompletions = DefaultMinCompletions
	}
	return o
}

// Validate reports the first option NewFluid refuses, naming it; zero fields stand for their
// defaults.
func (o FluidOptions) Validate() error {
	o = o.withDefaults()
	switch {
	case o.LambdaTau < 0:
		return fmt.Errorf("Fluid.LambdaTau: %v, must be positive", o.LambdaTau)
	case o.KTau < 0:
		return fmt.Errorf("Fluid.KTau: %v, must be positive", o.KTau)
	case o.SlopeTau < 0:
		return fmt.Errorf("Fluid.SlopeTau: %v, must be positive", o.SlopeTau)
	case !(o.BinAlpha > 0 && o.BinAlpha <= 1):
		return fmt.Errorf("Fluid.BinAlpha: %v outside (0, 1]", o.BinAlpha)
	case o.MinBinSamples < 1:
		return fmt.Errorf("Fluid.MinBinSamples: %d, must be positive", o.MinBinSamples)
	case o.CallsPerSession != 0 && !(o.CallsPerSession >= 1 && !math.IsInf(o.CallsPerSession, 0)):
		return fmt.Errorf("Fluid.CallsPerSession: %v, a session makes at least one call", o.CallsPerSession)
	case !(o.MinCompletions > 0):
		return fmt.Errorf("Fluid.MinCompletions: %v, must be positive", o.MinCompletions)
	}
	return nil
}

// FluidObservation is what the fluid model reads from one snapshot. Rates are per second.
type FluidObservation struct {
	LiveSessions   float64
	CallRate       float64 // X: model calls completed per second
	CompletionRate float64 // sessions completed per second
	ArrivalRate    float64 // sessions arriving per second
	WorkingSet     float64 // tokens, for the mean context
	// InCall is how many live sessions have a model call in flight (the gateway's), when InCallOK.
	InCall   float64
	InCallOK bool
}

// FluidPoint is one point of the learnt completion curve.
type FluidPoint struct {
	N        float64 `json:"n"`
	CallRate float64 `json:"call_rate_per_s"`
	Samples  int     `json:"samples"`
}

// Equilibria are the fluid model's fixed points for the current λ: where the session completion
// curve X(N)/K crosses the arrival rate.
type Equilibria struct {
	// Stable is where X(N)/K first rises through λ: the population the deployment settles at.
	Stable *float64 `json:"stable_n,omitempty"`
	// Unstable is where X(N)/K falls back below λ: past it the population grows by itself.
	Unstable *float64 `json:"unstable_n,omitempty"`
	// Estimated marks an Unstable not observed on the curve: either the fall through λ lies in a
	// gap between observed populations (interpolated, bounded by the knee), or no fall was seen
	// and the knee bounds it — the N whose working set reaches knee × C at the current mean
	// context, or the last N the curve was seen above λ if larger.
	Estimated bool `json:"estimated,omitempty"`
	// NoEquilibrium is set when λ is above the whole curve up to its peak or the knee: there is no
	// stable point and the population grows until it is trapped, unless arrivals fall.
	NoEquilibrium bool `json:"no_equilibrium,omitempty"`
}

// Outlook is the fluid model's reading of the current population.
type Outlook struct {
	Equilibria Equilibria
	// KneeSessions is the N whose working set reaches knee × C at the current mean context.
	KneeSessions *float64
	// Edge is the population past which the deployment does not come back by itself: the unstable
	// equilibrium, or KneeSessions when there is none.
	Edge *float64
	// DistanceToEdge is Edge − N (negative past it).
	DistanceToEdge *float64
	// TimeToTrap is (Edge − N) / dN/dt while N grows, 0 past the edge while N still grows, nil
	// when N does not grow (or the trap is more than 30 days away) or there is no edge.
	TimeToTrap *time.Duration
	// ModelSlope is λ − X(N)/K and ObservedSlope the smoothed change of N, sessions per second;
	// TimeToTrap uses the larger.
	ModelSlope, ObservedSlope float64
	// Lambda is the smoothed arrival rate and K the calls per session (0 when not known yet).
	Lambda, K float64
	// LongLambda is the arrival rate smoothed over LongLambdaTau.
	LongLambda float64
	// SettledLambda is λ without its start's bias (Fluid.SettledLambda); MeanContext the smoothed
	// mean context, tokens (Fluid.MeanContext).
	SettledLambda, MeanContext float64
	// SettledLambdaSD is SettledLambda's standard error (Fluid.SettledLambdaSD), LongLambdaSD
	// LongLambda's (Fluid.LongLambdaSD).
	SettledLambdaSD, LongLambdaSD float64
	// ServedFraction is the smoothed served fraction (Fluid.ServedFraction); nil while unknown.
	ServedFraction *float64
	// SpikeTolerance is the largest spike the deployment absorbs now (nil while K, λ, the edge
	// or the curve is unknown).
	SpikeTolerance *SpikeTolerance
	// Lifetime is how long a session lives under the knee (Fluid.Lifetime); 0 while unknown.
	Lifetime time.Duration
}

// Fluid estimates the fluid model dN/dt = λ − X(N)/K online: X(N) from (live sessions, call
// rate) observations binned by N, K from the long-run ratio of call and session completion rates,
// λ from the arrival rate smoothed over LambdaTau.
type Fluid struct {
	o    FluidOptions
	bins []fluidBin

	started         bool
	lastAt          time.Time
	lastN, lastCall float64

	lambda, slope, meanCtx float64
	// lambdaLong is the arrival rate smoothed over LongLambdaTau (see there), started at zero
	// with longWeight the weight it has gathered: lambdaLong/longWeight is the average over the
	// time observed while that is shorter than the time constant. Started at the first reading
	// instead, an hour-long average kept a cold start's zero arrivals for an hour (at half an
	// hour it read 0.4 of the rate) and let a deployment at 1.2 × its peak pass for one under it.
	lambdaLong, longWeight float64
	// lambdaAvg is the arrival rate smoothed over LambdaTau like lambda, but started at zero with
	// avgWeight its gathered weight, as lambdaLong: lambdaAvg/avgWeight (SettledLambda) is the
	// average since the start while that is shorter than LambdaTau. lambda starts at the first
	// windowed reading and keeps e^(−t/τ) of it: a cold start's first minute, a few arrivals
	// over a short window, read 11.7/min on a deployment receiving 5.5 and held λ over 8/min for
	// five minutes. The detector keeps lambda (its tables were measured with it); package scaler,
	// which turns λ into instances, reads SettledLambda.
	lambdaAvg, avgWeight float64
	// ctxW and ctxN are the working set and the live sessions smoothed over MeanContextTau, with
	// ctxWeight their gathered weight: ctxW/ctxN is the mean context without the noise of a few
	// long sessions coming and going.
	ctxW, ctxN, ctxWeight float64
	// srvIn and srvN are the sessions in a call and the live sessions smoothed over
	// MeanContextTau over the steps that read both, with srvWeight their gathered weight:
	// srvIn/srvN is the served fraction without the instant's noise.
	srvIn, srvN, srvWeight float64
	calls, completions     float64 // EWMAs, ratio is K
	completed              float64 // sessions completed, integrated
	seededK                float64

	tolCurve sessionCurve // SpikeTolerance's scratch copy of the curve
}

type fluidBin struct {
	n, x float64
	cnt  int
}

// NewFluid returns an empty model.
func NewFluid(o FluidOptions) (*Fluid, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("fluid model: %w", err)
	}
	o = o.withDefaults()
	return &Fluid{o: o}, nil
}

// fluidBinIndex maps N to its bin: width 1 below fluidLinearBins, then geometric with ratio
// 1 + 1/fluidLinearBins (width ≈ N/20).
func fluidBinIndex(n float64) int {
	if n < fluidLinearBins {
		return int(n)
	}
	return fluidLinearBins + int(math.Log(n/fluidLinearBins)/logBinRatio)
}

// Seed fills the curve from a calibration's points (Sessions, CompletionRatePerS × K) as if each
// had been observed MinBinSamples times, and takes K from it unless CallsPerSession is set.
func (f *Fluid) Seed(c *Calibration) {
	if c == nil {
		return
	}
	f.seededK = c.CallsPerSession
	for _, p := range c.Points {
		if p.Sessions > 0 {
			for range f.o.MinBinSamples {
				f.addToBin(p.Sessions, p.CompletionRatePerS*c.CallsPerSession)
			}
		}
	}
}

func (f *Fluid) addToBin(n, x float64) {
	i := fluidBinIndex(n)
	if i >= len(f.bins) {
		f.bins = append(f.bins, make([]fluidBin, i+1-len(f.bins))...)
	}
	b := &f.bins[i]
	b.cnt++
	a := max(1/float64(b.cnt), f.o.BinAlpha)
	b.n += a * (n - b.n)
	b.x += a * (x - b.x)
}

// ewmaWeight is the weight of a new sample dt after the last in an EWMA with time constant tau.
func ewmaWeight(dt, tau time.Duration) float64 {
	if tau <= 0 {
		return 1
	}
	return 1 - math.Exp(-dt.Seconds()/tau.Seconds())
}

// Observe adds one observation made at at. Observations not after the previous one only update
// the curve. Negative or non-finite values are ignored.
func (f *Fluid) Observe(at time.Time, o FluidObservation) {
	for _, v := range []float64{o.LiveSessions, o.CallRate, o.CompletionRate, o.ArrivalRate, o.WorkingSet} {
		if !(v >= 0) || math.IsInf(v, 0) {
			return
		}
	}
	f.addToBin(o.LiveSessions, o.CallRate)
	if o.LiveSessions > 0 {
		f.meanCtx = o.WorkingSet / o.LiveSessions
	}
	f.lastCall = o.CallRate
	if !f.started {
		f.started, f.lastAt, f.lastN = true, at, o.LiveSessions
		f.lambda, f.calls, f.completions = o.ArrivalRate, o.CallRate, o.CompletionRate
		return
	}
	dt := at.Sub(f.lastAt)
	if dt <= 0 {
		return
	}
	f.lambda += ewmaWeight(dt, f.o.LambdaTau) * (o.ArrivalRate - f.lambda)
	wl := ewmaWeight(dt, f.o.LambdaTau*(LongLambdaTau/DefaultLambdaTau))
	f.lambdaLong += wl * (o.ArrivalRate - f.lambdaLong)
	f.longWeight += wl * (1 - f.longWeight)
	wa := ewmaWeight(dt, f.o.LambdaTau)
	f.lambdaAvg += wa * (o.ArrivalRate - f.lambdaAvg)
	f.avgWeight += wa * (1 - f.avgWeight)
	if o.LiveSessions > 0 {
		wc := ewmaWeight(dt, MeanContextTau)
		f.ctxW += wc * (o.WorkingSet - f.ctxW)
		f.ctxN += wc * (o.LiveSessions - f.ctxN)
		f.ctxWeight += wc * (1 - f.ctxWeight)
		if o.InCallOK {
			f.srvIn += wc * (o.InCall - f.srvIn)
			f.srvN += wc * (o.LiveSessions - f.srvN)
			f.srvWeight += wc * (1 - f.srvWeight)
		}
	}
	wk := ewmaWeight(dt, f.o.KTau)
	f.calls += wk * (o.CallRate - f.calls)
	f.completions += wk * (o.CompletionRate - f.completions)
	f.completed += o.CompletionRate * dt.Seconds()
	f.slope += ewmaWeight(dt, f.o.SlopeTau) * ((o.LiveSessions-f.lastN)/dt.Seconds() - f.slope)
	f.lastAt, f.lastN = at, o.LiveSessions
}

// Lambda is the smoothed arrival rate, sessions per second.
func (f *Fluid) Lambda() float64 { return f.lambda }

// longLambda is the long-run arrival rate: λ until a second reading.
func (f *Fluid) longLambda() float64 {
	if f.longWeight <= 0 {
		return f.lambda
	}
	return f.lambdaLong / f.longWeight
}

// SettledLambda is the arrival rate smoothed over LambdaTau from zero, its start's bias removed
// (see lambdaAvg): λ until a second reading.
func (f *Fluid) SettledLambda() float64 {
	if f.avgWeight <= 0 {
		return f.lambda
	}
	return f.lambdaAvg / f.avgWeight
}

// SettledLambdaSD is SettledLambda's standard error, sessions per second, taking arrivals as
// Poisson: an EWMA of time constant τ started from zero, with weight w gathered, averages the rate
// with variance λ/(2τ) × (2 − w)/w — λ/t over a short time t since the start, λ/(2τ) once long
// past it. +Inf before a second reading.
func (f *Fluid) SettledLambdaSD() float64 {
	return ewmaSD(f.SettledLambda(), f.o.LambdaTau, f.avgWeight)
}

// LongLambdaSD is the long-run arrival rate's standard error, as SettledLambdaSD's: the rate
// averaged since the start for the first tens of minutes, over about two hours once long past it.
// +Inf before a second reading.
func (f *Fluid) LongLambdaSD() float64 {
	return ewmaSD(f.longLambda(), f.o.LambdaTau*(LongLambdaTau/DefaultLambdaTau), f.longWeight)
}

// ewmaSD is the standard error of a Poisson rate averaged by an EWMA of time constant tau started
// from zero with weight w gathered (SettledLambdaSD); +Inf at w ≤ 0.
func ewmaSD(rate float64, tau time.Duration, w float64) float64 {
	if w <= 0 {
		return math.Inf(1)
	}
	return math.Sqrt(rate / (2 * tau.Seconds()) * (2 - w) / w)
}

// MeanContextTau is the time constant of the smoothed mean context (Fluid.MeanContext). Chosen:
// a session's lifetime is about 6.5 minutes unloaded, so five minutes averages over most of the
// live population's turnover while following a trap's growing contexts within minutes.
const MeanContextTau = 5 * time.Minute

// MeanContext is the live sessions' mean context, tokens: the smoothed working set over the
// smoothed live sessions (0 while no session has been live).
func (f *Fluid) MeanContext() float64 {
	if f.ctxWeight <= 0 || !(f.ctxN > 0) {
		return f.meanCtx
	}
	return f.ctxW / f.ctxN
}

// ServedFraction is the share of live sessions in a model call, smoothed over MeanContextTau:
// false until a step read both the sessions in a call and the live sessions. The instant's share
// is noise for sizing: 40 sessions of 1P1D read 10, 0 and 9 in a call over ten seconds, and the
// sizing turns it into decode instances, asked for at once.
func (f *Fluid) ServedFraction() (float64, bool) {
	if f.srvWeight <= 0 || !(f.srvN > 0) {
		return 0, false
	}
	return min(1, max(0, f.srvIn/f.srvN)), true
}

// LongLambdaTau is the time constant of the long-run arrival rate (with the default LambdaTau;
// it scales with it): an hour, over which a 10-minute spike moves the rate by a sixth of its size
// and the Poisson noise of a workload of long sessions (under a session a minute) stays within
// about 15%. Whether a trap outlived its cause — arrivals back under what the deployment
// completes — is read against it, not against λ alone.
const LongLambdaTau = 60 * time.Minute

// K returns calls per session: the fixed option, else the calibration's, else the learnt ratio
// once MinCompletions sessions have completed.
func (f *Fluid) K() (float64, bool) {
	switch {
	case f.o.CallsPerSession > 0:
		return f.o.CallsPerSession, true
	case f.seededK > 0:
		return f.seededK, true
	case f.completed >= f.o.MinCompletions && f.completions > 0 && f.calls > 0:
		return max(1, f.calls/f.completions), true
	}
	return 0, false
}

// Curve returns the learnt X(N), one point per bin with at least MinBinSamples samples, by N.
func (f *Fluid) Curve() []FluidPoint {
	var pts []FluidPoint
	for _, b := range f.bins {
		if b.cnt >= f.o.MinBinSamples {
			pts = append(pts, FluidPoint{N: b.n, CallRate: b.x, Samples: b.cnt})
		}
	}
	return pts
}

// Equilibria finds where X(N)/K crosses lambda on the learnt curve (with X(0) = 0), interpolating
// linearly; kneeSessions (≤ 0: unknown) bounds the unstable point when the curve does not show it.
func (f *Fluid) Equilibria(lambda, k, kneeSessions float64) Equilibria {
	var e Equilibria
	if !(lambda > 0) || !(k > 0) {
		// Nothing arrives: every population drains to the stable point 0; the knee still bounds
		// the edge for a deployment that is past it already.
		e.Stable = ptr(0.0)
		if kneeSessions > 0 {
			e.Unstable, e.Estimated = ptr(kneeSessions), true
		}
		return e
	}
	var prevN, prevV float64 // zero sessions complete nothing
	lastAbove := -1.0
	var peak, last, lastN float64
	afterPeak := 0 // curve points after the highest
	var unstable *float64
	unstableGap := false
	prevI := -1
	for i, b := range f.bins {
		if b.cnt < f.o.MinBinSamples {
			continue
		}
		v := b.x / k
		switch {
		case prevV < lambda && v >= lambda:
			if e.Stable == nil {
				e.Stable = ptr(cross(prevN, prevV, b.n, v, lambda))
			}
			unstable = nil // the curve came back above λ: an earlier fall was noise
		case prevV >= lambda && v < lambda && e.Stable != nil:
			unstable = ptr(cross(prevN, prevV, b.n, v, lambda))
			unstableGap = i-prevI > maxCrossingGap
		}
		if v >= lambda {
			lastAbove = b.n
		}
		if v > peak {
			peak, afterPeak = v, 0
		} else {
			afterPeak++
		}
		prevN, prevV, last, lastN, prevI = b.n, v, v, b.n, i
	}
	switch {
	case unstable != nil && !unstableGap:
		e.Unstable = unstable
		return e
	case unstable != nil:
		// Seen above λ on one side of a gap and below on the other: the crossing is somewhere in
		// the gap. Interpolate, bounded by the knee, and say it is an estimate.
		u := *unstable
		if kneeSessions > 0 {
			u = min(u, max(kneeSessions, lastAbove))
		}
		e.Unstable, e.Estimated = &u, true
		return e
	case e.Stable == nil:
		pastPeak := afterPeak >= minAfterPeak && last < fallenPeak*peak
		reachedKnee := kneeSessions > 0 && lastN >= kneeSessions
		e.NoEquilibrium = lastN > 0 && (pastPeak || reachedKnee)
		if e.NoEquilibrium {
			return e
		}
	}
	if kneeSessions > 0 {
		e.Unstable, e.Estimated = ptr(max(kneeSessions, lastAbove)), true
	}
	return e
}

// Peak is the highest session completion rate of the learnt curve, max X(N)/K, in sessions per
// second. ok is false until K is known and the curve's falling side has been observed (two points
// after the peak, the last 10% under it): before that the highest point seen is only a lower bound
// of what the deployment can complete.
func (f *Fluid) Peak() (peak float64, ok bool) {
	k, known := f.K()
	if !known {
		return 0, false
	}
	var last float64
	afterPeak := 0
	for _, b := range f.bins {
		if b.cnt < f.o.MinBinSamples {
			continue
		}
		v := b.x / k
		if v > peak {
			peak, afterPeak = v, 0
		} else {
			afterPeak++
		}
		last = v
	}
	return peak, peak > 0 && afterPeak >= minAfterPeak && last < fallenPeak*peak
}

// cross interpolates where the segment (n0, v0)–(n1, v1) reaches level.
func cross(n0, v0, n1, v1, level float64) float64 {
	if v1 == v0 {
		return n1
	}
	return n0 + (n1-n0)*(level-v0)/(v1-v0)
}

// at interpolates the learnt X at n (X(0) = 0; flat past the last point); the last observed call
// rate when the curve is empty.
func (f *Fluid) at(n float64) float64 {
	var prevN, prevX float64
	seen := false
	for _, b := range f.bins {
		if b.cnt < f.o.MinBinSamples {
			continue
		}
		if n <= b.n {
			if b.n == prevN {
				return b.x
			}
			return prevX + (b.x-prevX)*(n-prevN)/(b.n-prevN)
		}
		prevN, prevX, seen = b.n, b.x, true
	}
	if !seen {
		return f.lastCall
	}
	return prevX
}

// Outlook reads the model at population n; kneeRatio × cacheTokens / mean context gives the knee
// population (cacheTokens ≤ 0: unknown).
func (f *Fluid) Outlook(n, kneeRatio, cacheTokens float64) Outlook {
	out := Outlook{Lambda: f.lambda, LongLambda: f.longLambda(), ObservedSlope: f.slope,
		SettledLambda: f.SettledLambda(), MeanContext: f.MeanContext(), SettledLambdaSD: f.SettledLambdaSD(),
		LongLambdaSD: f.LongLambdaSD()}
	if v, ok := f.ServedFraction(); ok {
		out.ServedFraction = ptr(v)
	}
	if f.meanCtx > 0 && cacheTokens > 0 && kneeRatio > 0 {
		out.KneeSessions = ptr(kneeRatio * cacheTokens / f.meanCtx)
	}
	kneeN := 0.0
	if out.KneeSessions != nil {
		kneeN = *out.KneeSessions
	}
	k, ok := f.K()
	slope := f.slope
	if life, known := f.Lifetime(kneeN); known {
		out.Lifetime = life
	}
	if ok {
		out.K = k
		out.Equilibria = f.Equilibria(f.lambda, k, kneeN)
		out.ModelSlope = f.lambda - f.at(n)/k
		slope = max(slope, out.ModelSlope)
	} else if kneeN > 0 {
		out.Equilibria = Equilibria{Unstable: ptr(kneeN), Estimated: true}
	}
	switch {
	case out.Equilibria.Unstable != nil:
		out.Edge = out.Equilibria.Unstable
	case out.KneeSessions != nil:
		out.Edge = out.KneeSessions
	default:
		return out
	}
	d := *out.Edge - n
	out.DistanceToEdge = &d
	if ok {
		if tol, known := f.SpikeTolerance(n, f.lambda, k, *out.Edge); known {
			out.SpikeTolerance = &tol
		}
	}
	if slope > 0 {
		secs := max(0, d/slope)
		if secs <= maxTimeToTrap.Seconds() {
			out.TimeToTrap = ptr(time.Duration(secs * float64(time.Second)))
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// lifetimeKneeShare: a bin counts as healthy, for Lifetime, when its population is at most 0.8 of
// the knee population. Chosen: the same distance as the pressure rule's default entry (0.8 × knee,
// Options.PressureEnter), under which the hit rate is on its plateau and calls do not queue for
// cache; the lifetime read there is the one a deployment kept under the knee sees.
const lifetimeKneeShare = 0.8

// Lifetime is how long a session lives when the deployment is not congested, by Little's law on
// each learnt bin: N ÷ (X(N) ÷ K), the lower quartile over the bins whose population is at most
// lifetimeKneeShare × kneeSessions (≤ 0: unknown, then every bin counts). A bin's lifetime rises
// with whatever congestion it was observed in — calls queueing for decode in a decode-first
// deployment, a new instance's cold cache, a ramp whose windowed call rate lags its population —
// and never falls below the uncongested one, so the low side of the bins is the workload's own
// pace; the quartile rather than the minimum keeps one noisy bin from setting it. Unlike the peak
// completion rate, it does not move when instances are added or removed: more cache moves the knee
// and the peak to a larger population, but an uncongested session calls and runs its tools at the
// same pace. ok is false while K is unknown or no healthy bin has enough samples.
func (f *Fluid) Lifetime(kneeSessions float64) (time.Duration, bool) {
	k, known := f.K()
	if !known {
		return 0, false
	}
	var ts []float64
	for _, b := range f.bins {
		if b.cnt < f.o.MinBinSamples || !(b.n >= 1) || !(b.x > 0) {
			continue
		}
		if kneeSessions > 0 && b.n > lifetimeKneeShare*kneeSessions {
			continue
		}
		ts = append(ts, b.n*k/b.x)
	}
	if len(ts) == 0 {
		return 0, false
	}
	slices.Sort(ts)
	return time.Duration(lowerQuartile(ts) * float64(time.Second)), true
}

// lowerQuartile is the 25th percentile of sorted (not empty), interpolated between ranks.
func lowerQuartile(sorted []float64) float64 {
	pos := 0.25 * float64(len(sorted)-1)
	i := int(pos)
	if i+1 >= len(sorted) {
		return sorted[i]
	}
	return sorted[i] + (pos-float64(i))*(sorted[i+1]-sorted[i])
}
