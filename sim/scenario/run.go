package scenario

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/basin-dev/basin/sim"
)

// Progress receives the fraction of a multi-run job that is done.
type Progress func(done float64)

// Run simulates the scenario under an engine policy and, when it has spikes, its spike-free twin
// with the same seed, filling in the no-spike goodput and the ratio. Wiring.Run is the wired form.
func Run(sc *Scenario, policy string, progress Progress) (*sim.Result, error) {
	return Wiring{}.Run(sc, policy, progress)
}

// Run simulates the scenario under a policy, with w, and, when it has spikes, its spike-free twin
// with the same seed and the same wiring, filling in the no-spike goodput and the ratio.
func (w Wiring) Run(sc *Scenario, policy string, progress Progress) (*sim.Result, error) {
	r, _, err := w.RunPair(sc, policy, progress)
	return r, err
}

// RunPair is Run that also returns the spike-free twin's own result (the scenario's result again
// when it has no spikes).
func RunPair(sc *Scenario, policy string, progress Progress) (spiked, calm *sim.Result, err error) {
	return Wiring{}.RunPair(sc, policy, progress)
}

// RunPair is Wiring.Run that also returns the spike-free twin's own result (the scenario's result
// again when it has no spikes).
func (w Wiring) RunPair(sc *Scenario, policy string, progress Progress) (spiked, calm *sim.Result, err error) {
	jobs := []*Scenario{sc}
	if sc.HasSpikes() {
		jobs = append(jobs, sc.WithoutSpikes())
	}
	res, err := w.runAll(jobs, []string{policy}, progress)
	if err != nil {
		return nil, nil, err
	}
	spiked, calm = res[0][0], res[len(res)-1][0]
	setRatio(spiked, calm.GoodputPerHour)
	if calm != spiked {
		setRatio(calm, calm.GoodputPerHour)
	}
	return spiked, calm, nil
}

func setRatio(r *sim.Result, noSpike float64) {
	r.NoSpikeGoodputPerHour = &noSpike
	if noSpike > 0 {
		v := r.GoodputPerHour / noSpike
		r.GoodputRatio = &v
	}
}

// Compare runs the scenario under several engine policies in one go (and the spike-free twin of
// each), so every ratio comes from one invocation on one machine. Wiring.Compare is the wired form.
func Compare(sc *Scenario, policies []string, progress Progress) ([]*sim.Result, error) {
	return Wiring{}.Compare(sc, policies, progress)
}

// Compare runs the scenario under several policies, with w, in one go (and the spike-free twin of
// each), so every ratio comes from one invocation on one machine.
func (w Wiring) Compare(sc *Scenario, policies []string, progress Progress) ([]*sim.Result, error) {
	jobs := []*Scenario{sc}
	if sc.HasSpikes() {
		jobs = append(jobs, sc.WithoutSpikes())
	}
	res, err := w.runAll(jobs, policies, progress)
	if err != nil {
		return nil, err
	}
	out := res[0]
	for i, r := range out {
		if len(res) > 1 {
			setRatio(r, res[1][i].GoodputPerHour)
		} else {
			setRatio(r, r.GoodputPerHour)
		}
	}
	return out, nil
}

// runAll runs every (scenario, policy) pair, each built with w, two at a time (the machines this
// runs on have two cores); results are indexed [scenario][policy] and do not depend on the
// scheduling.
func (w Wiring) runAll(scs []*Scenario, policies []string, progress Progress) ([][]*sim.Result, error) {
	type job struct{ i, j int }
	var jobs []job
	out := make([][]*sim.Result, len(scs))
	for i := range scs {
		out[i] = make([]*sim.Result, len(policies))
		for j := range policies {
			jobs = append(jobs, job{i, j})
		}
	}
	var mu sync.Mutex
	frac := make([]float64, len(jobs))
	report := func(k int, f float64) {
		if progress == nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		frac[k] = f
		var sum float64
		for _, v := range frac {
			sum += v
		}
		progress(sum / float64(len(frac)))
	}
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for k, jb := range jobs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			o, err := w.Options(scs[jb.i], policies[jb.j])
			if err != nil {
				errs[k] = err
				return
			}
			o.Progress = func(f float64) { report(k, f) }
			s, err := sim.New(o)
			if err != nil {
				errs[k] = err
				return
			}
			r := s.Run()
			r.Scenario = scs[jb.i].Name
			if policies[jb.j] != "" {
				r.Policy = sim.Policy(policies[jb.j]) // the name asked for, which may be basin's
			}
			out[jb.i][jb.j] = r
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// CurvePoint is the completion rate measured with N sessions held live.
type CurvePoint struct {
	N int `json:"n"`
	// CallsPerSec is X(N), model calls completed per second.
	CallsPerSec float64 `json:"calls_per_sec"`
	// SessionsPerMin is X(N)/K, the session completion rate the fluid model compares with λ.
	SessionsPerMin float64 `json:"sessions_per_min"`
	HitRate        float64 `json:"hit_rate"`
	// WorkingSetOverCache is the mean working set over the cache capacity during the measurement.
	WorkingSetOverCache float64 `json:"working_set_over_cache"`
}

// Curve is the fluid model of a scenario: dN/dt = λ − X(N)/K, with X measured in closed loop.
type Curve struct {
	Scenario string       `json:"scenario"`
	Policy   sim.Policy   `json:"policy"`
	K        float64      `json:"calls_per_session"`
	Lambda   float64      `json:"arrival_rate_per_min"`
	Points   []CurvePoint `json:"points"`
	// Stable is where X(N)/K first rises through λ; Unstable where it falls back below it. Past
	// Unstable the live population grows on its own. Nil when the curve does not cross.
	Stable   *float64 `json:"stable_n"`
	Unstable *float64 `json:"unstable_n"`
	// PeakSessionsPerMin is the highest completion rate on the curve: the most the deployment
	// can sustain.
	PeakSessionsPerMin float64 `json:"peak_sessions_per_min"`
	PeakN              int     `json:"peak_n"`
}

// CurveOptions bound the closed-loop runs.
type CurveOptions struct {
	Ns      []int         // populations to measure; empty: chosen from the cache size
	Warmup  time.Duration // default 20 min
	Measure time.Duration // default 30 min
}

// MeasureCurve holds N sessions live for each N (a new one starts whenever one ends) and measures
// the completion rate under an engine policy, then finds the fluid model's equilibria for the
// scenario's base rate. Wiring.MeasureCurve is the wired form.
func MeasureCurve(sc *Scenario, policy string, co CurveOptions, progress Progress) (*Curve, error) {
	return Wiring{}.MeasureCurve(sc, policy, co, progress)
}

// MeasureCurve is the package's MeasureCurve with the runs' options built by w.
func (w Wiring) MeasureCurve(sc *Scenario, policy string, co CurveOptions, progress Progress) (*Curve, error) {
	if co.Warmup == 0 {
		co.Warmup = 20 * time.Minute
	}
	if co.Measure == 0 {
		co.Measure = 30 * time.Minute
	}
	base, err := w.Options(sc, policy)
	if err != nil {
		return nil, err
	}
	wl := base.Streams[0].Workload
	k, meanCtx := workloadShape(wl, sc.Seed)
	ns := co.Ns
	if len(ns) == 0 {
		// Up to three times the population whose mean context fills twice the cache: past the
		// knee on every deployment we ship.
		capTokens := float64(base.Deployment.Prefill.CacheTokens*base.Deployment.Prefill.Instances) * 2 * 3
		top := max(20, int(capTokens/meanCtx))
		step := max(1, top/30)
		for n := step; n <= top; n += step {
			ns = append(ns, n)
		}
	}
	pts := make([]CurvePoint, len(ns))
	errs := make([]error, len(ns))
	var done sync.WaitGroup
	var mu sync.Mutex
	finished := 0
	sem := make(chan struct{}, 2)
	for i, n := range ns {
		done.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			pts[i], errs[i] = closedLoop(base, wl, n, co.Warmup, co.Measure, k)
			mu.Lock()
			finished++
			if progress != nil {
				progress(float64(finished) / float64(len(ns)))
			}
			mu.Unlock()
		})
	}
	done.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	c := &Curve{Scenario: sc.Name, Policy: base.Policy, K: k, Lambda: sc.Arrivals.RatePerMin, Points: pts}
	for _, p := range pts {
		if p.SessionsPerMin > c.PeakSessionsPerMin {
			c.PeakSessionsPerMin, c.PeakN = p.SessionsPerMin, p.N
		}
	}
	c.Stable, c.Unstable = Equilibria(pts, c.Lambda)
	return c, nil
}

// Equilibria finds where the completion curve crosses λ: first upward (stable), then downward
// (unstable), interpolating linearly between measured points.
func Equilibria(pts []CurvePoint, lambda float64) (stable, unstable *float64) {
	prevN, prevV := 0.0, -lambda // zero sessions complete nothing
	for _, p := range pts {
		v := p.SessionsPerMin - lambda
		n := float64(p.N)
		cross := prevN + (n-prevN)*(-prevV)/(v-prevV)
		if stable == nil && prevV < 0 && v >= 0 {
			stable = &cross
		} else if stable != nil && unstable == nil && prevV >= 0 && v < 0 {
			unstable = &cross
		}
		prevN, prevV = n, v
	}
	return stable, unstable
}

func closedLoop(base sim.Options, w sim.Workload, n int, warmup, measure time.Duration, k float64) (CurvePoint, error) {
	o := base
	o.Streams = nil
	o.ClosedLoop = n
	o.ClosedWorkload = w
	o.Duration = warmup + measure
	o.MeasureFrom, o.MeasureTo = warmup, warmup+measure
	o.NoDrain = true
	s, err := sim.New(o)
	if err != nil {
		return CurvePoint{}, fmt.Errorf("closed loop N=%d: %w", n, err)
	}
	s.RunUntil(warmup)
	c0 := s.Observe().CallsCompleted
	r := s.Run()
	calls := float64(r.CallsCompleted - c0)
	x := calls / measure.Seconds()
	p := CurvePoint{N: n, CallsPerSec: x, SessionsPerMin: x / k * 60, HitRate: math.NaN()}
	if r.HitRateMeanWindow != nil {
		p.HitRate = *r.HitRateMeanWindow
	}
	var wsum float64
	var cnt int
	for _, m := range r.Timeline[int(warmup/time.Minute):] {
		if m.CacheCapacity > 0 {
			wsum += float64(m.WorkingSetTokens) / float64(m.CacheCapacity)
			cnt++
		}
	}
	if cnt > 0 {
		p.WorkingSetOverCache = wsum / float64(cnt)
	}
	return p, nil
}

// workloadShape estimates the mean calls per session K and the mean live context of a workload
// by drawing sessions from it.
func workloadShape(w sim.Workload, seed uint64) (k, meanCtx float64) {
	rng := rand.New(rand.NewPCG(seed, 0xC0DE))
	const n = 2000
	var calls, ctx float64
	for range n {
		s := w.Session(rng)
		calls += float64(len(s.Calls))
		var sum float64
		for _, c := range s.Calls {
			sum += float64(c.Prompt)
		}
		ctx += sum / float64(len(s.Calls))
	}
	return calls / n, ctx / n
}
