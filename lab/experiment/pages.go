package experiment

import (
	"fmt"
	"github.com/basin-dev/basin/sim/harness"
	"io"
	"strings"
	"time"

	"github.com/basin-dev/basin/detector"
)

// Pressure is information; drifting and trapped page someone. A false page is BasinMetastableDrift
// or BasinTrapped firing in a run that does not collapse. The rules fire when basin_state has been
// drifting (or trapped) for their `for:`, so a page here is the detector holding one of those
// states for its PageFor without a break.

// PageFor is the `for:` of the alert each state pages with in rules/basin.rules.yml:
// BasinMetastableDrift for drifting, BasinTrapped for trapped (a rules test keeps them equal).
var PageFor = map[detector.State]time.Duration{detector.Drifting: 5 * time.Minute, detector.Trapped: time.Minute}

// InfoFor is the `for:` of BasinCacheKneeApproaching, the info-severity alert pressure raises (a
// rules test keeps them equal): a pressure spell at least this long notifies, a shorter one is
// only a state on the status page.
const InfoFor = 2 * time.Minute

// PressureSpells counts the run's spells in pressure held at least InfoFor: the notifications
// pressure alone would have sent.
func (r DetectionRun) PressureSpells() int {
	if r.Obs == nil {
		return 0
	}
	n := 0
	for i, tr := range r.Obs.Transitions {
		if tr.To == detector.Pressure && r.heldFor(i) >= InfoFor {
			n++
		}
	}
	return n
}

// heldFor is how long the state the run's i-th transition entered lasted: until the next
// transition, or the end of the run.
func (r DetectionRun) heldFor(i int) time.Duration {
	trs := r.Obs.Transitions
	until := harness.Epoch.Add(time.Duration(r.DurationMin * float64(time.Minute)))
	if i+1 < len(trs) {
		until = trs[i+1].At
	}
	return until.Sub(trs[i].At)
}

// PageMin is the first minute one of basin's paging alerts fires in the run: the end of the first
// stretch of its state's PageFor spent in drifting or in trapped without leaving it (a move from
// drifting to trapped starts the trapped alert's own wait). Nil when none fires.
func (r DetectionRun) PageMin() *float64 {
	if r.Obs == nil {
		return nil
	}
	for i, tr := range r.Obs.Transitions {
		hold, pages := PageFor[tr.To]
		if !pages {
			continue
		}
		if r.heldFor(i) >= hold {
			m := tr.At.Add(hold).Sub(harness.Epoch).Minutes()
			return &m
		}
	}
	return nil
}

// FalsePage reports basin paging in a run that did not collapse.
func (r DetectionRun) FalsePage() bool { return !r.Collapsed && r.PageMin() != nil }

// UtilisationFalsePage reports a conventional utilisation alert firing (its condition held for
// AlertFor, the same one minute) in a run that did not collapse.
func (r DetectionRun) UtilisationFalsePage() bool {
	return !r.Collapsed && r.Obs != nil && r.Obs.UtilisationFirstMin != nil
}

// PagesMarkdown writes the false pages of basin's alerts and of the utilisation alerts per
// scenario, next to the detector's internal drifting-or-trapped count, and the targets:
// none in the healthy presets, at most one in the healthy and +33% runs together.
func PagesMarkdown(w io.Writer, runs []DetectionRun) error {
	type agg struct{ runs, calm, pages, util, states, spells, collapsedPaged, collapsed int }
	names, by := byScenario(runs, func(a *agg, r DetectionRun) {
		a.runs++
		if r.Collapsed {
			a.collapsed++
			if r.PageMin() != nil {
				a.collapsedPaged++
			}
		} else {
			a.calm++
			a.spells += r.PressureSpells()
		}
		if r.FalsePage() {
			a.pages++
		}
		if r.UtilisationFalsePage() {
			a.util++
		}
		if r.FalseAlarm() {
			a.states++
		}
	})
	var b strings.Builder
	fmt.Fprintf(&b, "### Pages versus states\n\n"+
		"A *false page* is BasinMetastableDrift or BasinTrapped firing — basin_state drifting held for the "+
		"rule's `for: %gm`, or trapped held for `for: %gm` — in a run that did not collapse; pressure does not page. Utilisation "+
		"alerts are counted the same way: any of the four above firing (held for %g min) in a run that did not "+
		"collapse. *Drifting states* is the detector's internal count from the table above (drifting or trapped at "+
		"any moment in a run that did not collapse). *Pressure spells* is what pressure costs instead: in the runs "+
		"that did not collapse, spells in pressure held for BasinCacheKneeApproaching's `for: %gm`, each an "+
		"info-severity notification, per hour of those runs.\n\n", PageFor[detector.Drifting].Minutes(),
		PageFor[detector.Trapped].Minutes(), harness.AlertFor.Minutes(), InfoFor.Minutes())
	b.WriteString("| scenario | runs | not collapsed | false pages (basin) | false pages (utilisation) | drifting states | pressure spells (per hour) | collapsed runs paged |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	var calmHours float64
	var calmSpells int
	for _, n := range names {
		a := by[n]
		spells := "—"
		if h := float64(a.calm) * durationOf(runs, n).Hours(); h > 0 {
			spells = fmt.Sprintf("%d (%.1f)", a.spells, float64(a.spells)/h)
			calmHours += h
			calmSpells += a.spells
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %s | %d of %d |\n", n, a.runs, a.calm, a.pages, a.util, a.states,
			spells, a.collapsedPaged, a.collapsed)
	}
	var healthy []string
	var calmRuns, calmPages, calmUtil int
	for _, n := range names {
		if strings.HasSuffix(n, "-spike") {
			continue
		}
		a := by[n]
		calmRuns += a.runs
		calmPages += a.pages
		calmUtil += a.util
		if !strings.Contains(n, "-spike") {
			healthy = append(healthy, fmt.Sprintf("%s %d in %d", n, a.pages, a.runs))
		}
	}
	fmt.Fprintf(&b, "\nAgainst the targets: false pages in the healthy presets: %s (target: 0 each, ≥ 20 seeds); in "+
		"the healthy and +33%% runs together %d in %d (target ≤ 1; utilisation alerts: %d).\n",
		strings.Join(healthy, ", "), calmPages, calmRuns, calmUtil)
	if calmHours > 0 {
		fmt.Fprintf(&b, "\nPressure spells over all %.0f hours of runs that did not collapse: %d, %.1f an hour (no target: "+
			"pressure pages no one; the detector's overload hold trades this number for lead, docs/simulator.md has the "+
			"trade measured).\n",
			calmHours, calmSpells, float64(calmSpells)/calmHours)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// durationOf is the length of the scenario's runs (every run of a scenario has the same).
func durationOf(runs []DetectionRun, scenario string) time.Duration {
	for _, r := range runs {
		if r.Scenario == scenario {
			return time.Duration(r.DurationMin * float64(time.Minute))
		}
	}
	return 0
}
