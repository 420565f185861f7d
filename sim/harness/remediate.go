package harness

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/admission/inproc"
	"github.com/basin-dev/basin/lender"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/scaler"
	"github.com/basin-dev/basin/sim"
)

// RemediationSummary counts what the remediation loop did in a run.
type RemediationSummary struct {
	BudgetChanges int `json:"budget_changes"`
	Sheds         int `json:"sheds"`
	// Incidents counts entries into incident mode.
	Incidents int `json:"incidents"`
	// LendingToggles counts lending switched on or off.
	LendingToggles int `json:"lending_toggles"`
	// MinBudgetTokens is the lowest budget set.
	MinBudgetTokens int64 `json:"min_budget_tokens"`
	// ScaleOuts and ScaleIns count the scaling policy's asks for more and for fewer instances of
	// a role.
	ScaleOuts int `json:"scale_outs,omitempty"`
	ScaleIns  int `json:"scale_ins,omitempty"`
	// Plans are the non-empty plans, in order (omitted from JSON: long).
	Plans []remediate.Plan `json:"-"`
}

// AttachRemediationFrom runs basin's remediation loop in a run: on every observation step the
// detector's assessment and the admission core's state go through remediate.Loop.Step — the step
// `basin daemon` runs — acting on the core instead of the gateway's admin API. The loop acts only
// from simulated time start on: before it the detector watches and the loop neither decides nor
// acts, as a daemon switched from watching to acting at start. The last rescue time is searched with it. With scale, the loop
// scales the simulated deployment too, through the simulator's instance switch (the scaler's sim
// backend), as a daemon with a scaling backend does.
func AttachRemediationFrom(o *sim.Options, g *Gate, do detector.Options, ro remediate.Options, start time.Duration,
	scale *scaler.Options) (*RemediationSummary, error) {
	pol, err := remediate.NewPolicy(ro)
	if err != nil {
		return nil, err
	}
	// The loop reads and acts on the core through the admission contract, as the daemon does on
	// a real gateway's admin API; the core's clock is the tick's.
	var now time.Time
	gw, err := inproc.New(inproc.Options{Core: g.core, Now: func() time.Time { return now }, Deliver: g.Take})
	if err != nil {
		return nil, err
	}
	var control sim.Control // set on each tick, before anything acts
	lend, err := lender.New(lender.Options{MaxFraction: o.Deployment.Lending.MaxFraction})
	if err != nil {
		return nil, err
	}
	lend.Restore(o.Deployment.Lending.Enabled, time.Time{})
	backend, err := lender.NewBackend(lender.BackendConfig{Kind: lender.KindSim},
		lender.Wiring{Sim: func(enabled bool, maxFraction float64) { control.SetLending(enabled, maxFraction) }})
	if err != nil {
		return nil, err
	}
	scaleBE, err := scaler.NewBackend(scaler.BackendConfig{Kind: scaler.KindSim},
		scaler.Wiring{Sim: func(r scaler.Role, n int) { control.SetInstances(sim.Role(r), n) }})
	if err != nil {
		return nil, err
	}
	exec, err := remediate.NewExecutor(remediate.ExecutorOptions{Audit: remediate.NewMemoryAudit(), Gateway: gw,
		Lending: remediate.BackendLending{Backend: backend}, Scaling: remediate.BackendScaling{Backend: scaleBE}})
	if err != nil {
		return nil, err
	}
	loop, err := remediate.NewLoop(pol, lend, exec)
	if err != nil {
		return nil, err
	}
	if scale != nil {
		if loop.Scaler, err = scaler.New(*scale); err != nil {
			return nil, err
		}
	}
	sum := &RemediationSummary{}
	err = ObserveEach(o, do, func(t Tick) {
		if t.T < start {
			return
		}
		now = t.Now
		control = t.Control
		view, err := gw.StateSessions(context.Background())
		if err != nil {
			panic(fmt.Sprintf("simulated remediation: %v", err)) // the in-process admission does not fail
		}
		in := remediate.StepInputs{Inputs: remediate.Inputs{At: t.Now, Assessment: t.Assessment, GatewayOK: true,
			Gateway: remediate.GatewayFrom(view)},
			Snapshot: t.Snapshot, Decode: decodeInstances(t.Control.Stats())}
		in.ArrivalRate, in.ArrivalOK = t.Snapshot.Get(collector.ArrivalRate)
		res := loop.Step(context.Background(), in, nil)
		if res.Err != nil {
			panic(fmt.Sprintf("simulated remediation: %v", res.Err)) // the in-process admission does not fail
		}
		if res.IncidentStarted {
			sum.Incidents++
		}
		plan := res.Plan
		if plan.Lending != nil {
			sum.LendingToggles++
		}
		if plan.Empty() {
			return
		}
		sum.Plans = append(sum.Plans, plan)
		if b := plan.Budget; b != nil && b.To != b.From {
			sum.BudgetChanges++
			if sum.MinBudgetTokens == 0 || b.To < sum.MinBudgetTokens {
				sum.MinBudgetTokens = b.To
			}
		}
		if plan.Shed != nil {
			sum.Sheds += len(plan.Shed.IDs)
		}
		if plan.Scale != nil {
			for _, c := range plan.Scale.Changes {
				if c.To > c.From {
					sum.ScaleOuts++
				} else {
					sum.ScaleIns++
				}
			}
		}
	})
	if err != nil {
		return nil, err
	}
	done := o.OnResult
	o.OnResult = func(r *sim.Result) {
		if done != nil {
			done(r) // observe's: attaches the Observation
		}
		if obs, ok := r.Detector.(*Observation); ok {
			obs.Remediation = sum
		}
	}
	sum.Plans = slices.Clip(sum.Plans)
	return sum, nil
}

// decodeInstances reads the simulated decode instances as the lender's inputs.
func decodeInstances(stats []sim.InstanceStats) []lender.Instance {
	var out []lender.Instance
	for _, st := range stats {
		if st.Role != sim.RoleDecode {
			continue
		}
		out = append(out, lender.Instance{Name: st.Name, CapacityTokens: float64(st.MaxTotalTokens),
			FreeTokens: float64(st.AvailableTokens), ReservedTokens: float64(st.UsedTokens),
			LentTokens: float64(st.LentTokens), Waiting: st.PreallocQueue})
	}
	return out
}
