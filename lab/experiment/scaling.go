package experiment

import (
	"errors"
	"fmt"
	"time"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/scaler"
	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/harness"
	"github.com/basin-dev/basin/sim/scenario"
)

// Scaling: arrivals past what the deployment completes turn users away whatever basin's
// admission does; a team with spare GPUs would rather add instances. Three arms run the same rows
// (the matrix's geometry: base load from minute 0, the spike over minutes 15–25, goodput over the
// sessions that arrive in minutes 25–85) on the same seeds:
//
//   - ArmBasin: basin's admission and remediation, the pools as provisioned;
//   - ArmAutoscaler: the same, with the peers' utilisation-based autoscaler (sim.DefaultAutoscaler:
//     decode on KV usage, prefill on queued requests, the HPA's algorithm) sizing the pools;
//   - ArmScaling: the same, with basin's own scaling (package scaler) sizing them.
//
// Both scaling arms start from the provisioned pools (their floor) and may grow to the same
// ceiling; each added instance starts after the simulator's start-up delay, cold.

// Scaling arms.
const (
	ArmBasin      = "basin"
	ArmAutoscaler = "basin+utilisation-autoscaler"
	ArmScaling    = "basin+scaling"
)

// ScalingArms lists the arms in table order.
var ScalingArms = []string{ArmBasin, ArmAutoscaler, ArmScaling}

// ScalingSpec is the sweep.
type ScalingSpec struct {
	Deployments []string
	Workload    string
	// Loads are base arrival rates over the deployment's calibrated peak completion rate; Spikes
	// the extra arrivals over minutes 15–25 as a fraction of the base rate.
	Loads, Spikes []float64
	Seeds         []uint64
	// Ceiling bounds each role's instances in both scaling arms.
	Ceiling int
	// Need sizes basin's scaling (zero: package scaler's defaults).
	Need scaler.NeedOptions
	// SecondSpikeFrom, when set, repeats each row's spike from this minute, as long and as high:
	// the pools an arm grew for the first spike meet a second one inside the goodput window, which
	// shows what the room an arm keeps after a spike buys (the table with one spike shows only
	// what it costs). 0: one spike.
	SecondSpikeFrom time.Duration
	Workers         int
}

// DefaultScaling is the sweep: 1.2 and 1.5 × peak with and without a +100% spike on both
// deployments, 2 × peak (where the arrivals outrun basin's admission by more than 1.3×: the
// calibrated peak understates what it completes), and the quiet row (0.5 × peak) that no arm may
// scale up; three seeds; a ceiling of 8 instances a role (NVIDIA Dynamo planner's default GPU
// budget, as the autoscaler baseline's).
func DefaultScaling() ScalingSpec {
	return ScalingSpec{Deployments: []string{"1p1d", "1p3d"}, Workload: "terminal-bench",
		Loads: []float64{0.5, 1.2, 1.5, 2}, Spikes: []float64{0, 1}, Seeds: []uint64{1, 2, 3}, Ceiling: 8, Workers: 2}
}

// Validate names every problem.
func (s ScalingSpec) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	for _, d := range s.Deployments {
		if _, ok := matrixDeployment(d); !ok {
			add("deployments: %q, want one of %v", d, matrixDeploymentNames())
		}
	}
	if len(s.Deployments) == 0 {
		add("deployments: empty")
	}
	if _, err := sim.SyntheticWorkload(s.Workload); err != nil {
		add("workload: %w", err)
	}
	if len(s.Loads) == 0 || len(s.Spikes) == 0 || len(s.Seeds) == 0 {
		add("loads, spikes and seeds: each needs at least one value")
	}
	if s.Ceiling < 2 {
		add("ceiling: %d, want ≥ 2", s.Ceiling)
	}
	if s.Workers < 1 {
		add("workers: %d, want ≥ 1", s.Workers)
	}
	if f := s.SecondSpikeFrom; f != 0 && (f < matrixSpikeTo || f+(matrixSpikeTo-matrixSpikeFrom) > matrixMeasureTo) {
		add("second spike: from %v, want from the first spike's end (%v) to %v, so that it ends in the window",
			f, matrixSpikeTo, matrixMeasureTo-(matrixSpikeTo-matrixSpikeFrom))
	}
	return errors.Join(errs...)
}

// ScalingRun is one arm's run of a row on one seed.
type ScalingRun struct {
	Seed           uint64   `json:"seed"`
	GoodputPerHour float64  `json:"goodput_per_hour"`
	FirstWaitP50   *float64 `json:"first_call_wait_p50_s"`
	// InstanceMinutes are prefill plus decode instance-minutes over the goodput window (an
	// instance counts from when it is asked for until it is gone).
	InstanceMinutes float64 `json:"instance_minutes"`
	// MaxPrefill and MaxDecode are the most instances of each role at a minute's end.
	MaxPrefill int `json:"max_prefill"`
	MaxDecode  int `json:"max_decode"`
	// FirstScaleOutMin is when the arm first asked for more instances, from the simulator's
	// record (sim.Result.FirstScaleOutMin), the same way for both scaling arms;
	// FirstUtilAlertMin is when a conventional utilisation alert first held (null: never).
	FirstScaleOutMin  *float64 `json:"first_scale_out_min"`
	FirstUtilAlertMin *float64 `json:"first_utilisation_alert_min"`
	// ServesAllMin is the first minute from which nobody waits at the gateway until the goodput
	// window ends: the deployment serves every arrival from then on (0: nobody ever waited;
	// null: somebody still waits at the window's end).
	ServesAllMin *float64 `json:"serves_all_min"`
	// CeilingMin is the first minute from which no session arriving until the goodput window's
	// end missed the SLO (sim.Minute.MissedArrivals): the arm is at the all-arrivals ceiling from
	// then on. A session may still wait at the gateway a while and be good (0: from the start;
	// null: a session arriving in the window's last minute missed it).
	CeilingMin *float64 `json:"ceiling_min"`
	// ArrivedPerHour is the sessions arriving in the goodput window, per hour: the most goodput
	// any arm can reach (the all-arrivals ceiling).
	ArrivedPerHour float64 `json:"arrived_per_hour"`
	// ShortMinutes counts the window's minutes that ended with somebody waiting at the gateway
	// (the deployment short of capacity); FirstShortMin is the first minute of the run that did
	// (null: none).
	ShortMinutes  int      `json:"short_minutes"`
	FirstShortMin *float64 `json:"first_short_min"`
}

// GoodputPerInstanceHour is good sessions per instance-hour over the window.
func (r ScalingRun) GoodputPerInstanceHour(windowMin float64) float64 {
	if r.InstanceMinutes <= 0 {
		return 0
	}
	return r.GoodputPerHour * windowMin / 60 / (r.InstanceMinutes / 60)
}

// ScalingRow is a deployment × load × spike with each arm's runs.
type ScalingRow struct {
	Deployment     string                  `json:"deployment"`
	CacheFirst     bool                    `json:"cache_first"`
	Load           float64                 `json:"load"`
	Spike          float64                 `json:"spike"`
	ArrivalsPerMin float64                 `json:"arrivals_per_min"`
	Provisioned    [2]int                  `json:"provisioned"` // prefill, decode
	Runs           map[string][]ScalingRun `json:"runs"`
}

// ScalingResult is the sweep's rows.
type ScalingResult struct {
	Spec         ScalingSpec   `json:"spec"`
	StartupDelay time.Duration `json:"-"`
	WindowMin    float64       `json:"window_min"`
	Rows         []ScalingRow  `json:"rows"`
}

// RunScaling runs the sweep: each deployment calibrated once (as the matrix does), then every row
// × arm × seed on a worker pool; the result does not depend on the number of workers.
func RunScaling(spec ScalingSpec, progress func(done, total int)) (*ScalingResult, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	res := &ScalingResult{Spec: spec, StartupDelay: sim.DefaultStartupDelay, WindowMin: (matrixMeasureTo - matrixMeasureFrom).Minutes()}
	cals := map[string]*detector.Calibration{}
	for _, d := range spec.Deployments {
		g := MatrixGroup{Deployment: d, Tier: TierGPU, Workload: spec.Workload}
		sc, err := matrixScenario(g, 1, 0, 0)
		if err != nil {
			return nil, err
		}
		cal, err := harness.Calibrate(sc, harness.Epoch)
		if err != nil {
			return nil, fmt.Errorf("calibrate %s: %w", g, err)
		}
		cals[d] = cal
		md, _ := matrixDeployment(d)
		dep, err := sim.DeploymentPreset(md.Preset)
		if err != nil {
			return nil, err
		}
		for _, l := range spec.Loads {
			for _, sp := range spec.Spikes {
				res.Rows = append(res.Rows, ScalingRow{Deployment: d, CacheFirst: md.CacheFirst, Load: l, Spike: sp,
					ArrivalsPerMin: l * cal.PeakCompletionRatePerS * 60, Provisioned: [2]int{dep.Prefill.Instances, dep.Decode.Instances},
					Runs: map[string][]ScalingRun{}})
			}
		}
	}
	type job struct{ row, arm, seed int }
	var jobs []job
	for r := range res.Rows {
		for a := range ScalingArms {
			for s := range spec.Seeds {
				jobs = append(jobs, job{r, a, s})
			}
		}
	}
	out := make([]ScalingRun, len(jobs))
	err := parallel(len(jobs), spec.Workers, func(i int) error {
		j := jobs[i]
		row := res.Rows[j.row]
		run, err := runScalingCell(row, ScalingArms[j.arm], spec.Seeds[j.seed], cals[row.Deployment], spec)
		if err != nil {
			return fmt.Errorf("%s load %.2f spike +%.0f%% %s seed %d: %w", row.Deployment, row.Load, 100*row.Spike,
				ScalingArms[j.arm], spec.Seeds[j.seed], err)
		}
		out[i] = run
		return nil
	}, progress)
	if err != nil {
		return nil, err
	}
	for i, j := range jobs {
		arm := ScalingArms[j.arm]
		res.Rows[j.row].Runs[arm] = append(res.Rows[j.row].Runs[arm], out[i])
	}
	return res, nil
}

// runScalingCell runs one arm of a row on one seed.
func runScalingCell(row ScalingRow, arm string, seed uint64, cal *detector.Calibration, spec ScalingSpec) (ScalingRun, error) {
	g := MatrixGroup{Deployment: row.Deployment, Tier: TierGPU, Workload: spec.Workload}
	sc, err := matrixScenario(g, row.ArrivalsPerMin, row.Spike, 0)
	if err != nil {
		return ScalingRun{}, err
	}
	sc.Seed = seed
	if f := spec.SecondSpikeFrom; f > 0 && row.Spike > 0 {
		sc.Arrivals.Spikes = append(sc.Arrivals.Spikes, scenario.Spike{From: scenario.Duration(f),
			To: scenario.Duration(f + matrixSpikeTo - matrixSpikeFrom), Multiplier: 1 + row.Spike})
	}
	pol := harness.Policies{Calibrate: func() (*detector.Calibration, error) { return cal, nil }}
	floor := map[scaler.Role]int{scaler.RolePrefill: row.Provisioned[0], scaler.RoleDecode: row.Provisioned[1]}
	ceiling := map[scaler.Role]int{scaler.RolePrefill: spec.Ceiling, scaler.RoleDecode: spec.Ceiling}
	switch arm {
	case ArmAutoscaler:
		p := sim.DefaultAutoscaler()
		p.Prefill = sim.ScaleBounds{Min: row.Provisioned[0], Max: spec.Ceiling}
		p.Decode = sim.ScaleBounds{Min: row.Provisioned[1], Max: spec.Ceiling}
		pol.Autoscaler = &p
	case ArmScaling:
		pol.Scale = &scaler.Options{Roles: scaler.Roles(), Floor: floor, Ceiling: ceiling, Need: spec.Need}
	}
	o, err := scenario.Wiring{Policies: pol}.Options(sc, harness.Basin)
	if err != nil {
		return ScalingRun{}, err
	}
	s, err := sim.New(o)
	if err != nil {
		return ScalingRun{}, err
	}
	r := s.Run()
	// The first scale-out is the simulator's record, to the second, for both arms (each asks
	// through sim.Control.SetInstances): read off the timeline, an ask rounded up to its
	// minute's end and could land after an alert it came before.
	run := ScalingRun{Seed: seed, GoodputPerHour: r.GoodputPerHour, FirstWaitP50: r.FirstCallWaitP50, FirstScaleOutMin: r.FirstScaleOutMin,
		InstanceMinutes: r.PrefillInstanceMinutesWindow + r.DecodeInstanceMinutesWindow, FirstUtilAlertMin: r.UtilisationAlertFirstMin}
	lastWait := -1 // the last minute of the window somebody waited at the gateway
	lastMiss := -1 // the last minute of the window a session arrived that was not good
	arrived := 0
	for i, m := range r.Timeline {
		run.MaxPrefill, run.MaxDecode = max(run.MaxPrefill, m.PrefillInstances), max(run.MaxDecode, m.DecodeInstances)
		inWindow := float64(i) >= r.MeasureFromMin && float64(i) < r.MeasureToMin
		if inWindow {
			arrived += m.Arrivals
		}
		if m.MissedArrivals > 0 && float64(i) < r.MeasureToMin {
			lastMiss = i
		}
		if m.QueuedSessions > 0 && float64(i) < r.MeasureToMin {
			lastWait = i
			if run.FirstShortMin == nil {
				v := float64(i)
				run.FirstShortMin = &v
			}
			if inWindow {
				run.ShortMinutes++
			}
		}
	}
	if w := r.MeasureToMin - r.MeasureFromMin; w > 0 {
		run.ArrivedPerHour = float64(arrived) * 60 / w
	}
	if float64(lastWait+1) < r.MeasureToMin {
		v := float64(lastWait + 1)
		run.ServesAllMin = &v
	}
	if float64(lastMiss+1) < r.MeasureToMin {
		v := float64(lastMiss + 1)
		run.CeilingMin = &v
	}
	return run, nil
}
