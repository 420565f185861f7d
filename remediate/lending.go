package remediate

import (
	"context"
	"maps"
	"slices"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/lender"
)

// Lend runs the lender on a step's readings and adds its change to the plan: the risk rule on the
// snapshot says whether the deployment is cache-first (while it cannot tell, the switch holds),
// the lender decides for the decode instances given, and a toggle joins the plan (numbered if the
// plan had nothing else). The daemon and the simulator's harness both step lending through here.
func (p *Policy) Lend(plan Plan, l *lender.Lender, snap collector.Snapshot, knee float64, decode []lender.Instance) Plan {
	cf, why, ok := Classify(snap, knee)
	if !ok {
		return plan
	}
	d := l.Decide(lender.Inputs{At: plan.At, Instances: decode, CacheFirst: cf, Reason: why})
	if !d.Changed {
		return plan
	}
	lp := LendingPlan{Enabled: d.Enabled, MaxFraction: d.MaxFraction, Reasons: slices.Clone(d.Reasons)}
	if len(d.Grants) > 0 {
		lp.Grants = make(map[string]int64, len(d.Grants))
		for _, g := range d.Grants {
			lp.Grants[g.Instance] = g.Tokens
		}
	}
	plan.Lending = &lp
	plan.Reasons = append(slices.Clone(plan.Reasons), d.Reasons...)
	if plan.Seq == 0 {
		p.st.Seq++
		plan.Seq = p.st.Seq
	}
	return plan
}

// BackendLending is a lender backend behind the executor's Lending interface.
type BackendLending struct{ Backend lender.Backend }

// ApplyLending implements Lending.
func (b BackendLending) ApplyLending(ctx context.Context, p LendingPlan) error {
	d := lender.Decision{Enabled: p.Enabled, MaxFraction: p.MaxFraction, Changed: true}
	for _, name := range slices.Sorted(maps.Keys(p.Grants)) {
		d.Grants = append(d.Grants, lender.Grant{Instance: name, Tokens: p.Grants[name]})
	}
	return b.Backend.Apply(ctx, d)
}
