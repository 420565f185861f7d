package demo

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/basin-dev/basin/loadgen"
)

// run is a finished run of the 60-minute window with good sessions of arrived, its waits late
// by late (the worst window) on average.
func run(name string, good, arrived int, late time.Duration) RunResult {
	g := float64(good) // sessions per hour: the window is an hour
	// The load generators always mark their reports interrupted: the demo cuts the sessions
	// still live at the scenario's end.
	rep := &loadgen.Report{MeasureFromMin: 25, MeasureToMin: 85, GoodputPerHour: &g, Interrupted: true,
		Sessions: loadgen.Counts{Arrived: arrived, Completed: good, Good: &good}}
	return RunResult{Name: name, Report: rep, Budget: 1e12,
		Timing: Timing{Waits: 5000, Mean: late / 2, Worst: late, Max: 10 * late}}
}

func TestWriteAndVerdict(t *testing.T) {
	onTime := 100 * time.Millisecond
	for _, tc := range []struct {
		name string
		res  Result
		want []string // in the output
		not  []string // not in the output
		re   string   // a regexp the output matches
	}{
		{
			name: "kept time: the verdict",
			res: Result{Speed: 90, Runs: []RunResult{
				run(NoSpike, 217, 221, onTime), run(DryRun, 24, 221, onTime), run(Acting, 217, 221, onTime)}},
			want: []string{"kept 100%", "(11% of its no-spike goodput)"},
			not:  []string{"NOT KEEP", "No verdict"},
			re:   `ratio to no spike +1\.00 +0\.11 +1\.00\n.*\n.*\n.*\n.*\n.*\n.*\n *late per wait, mean/worst \(s\) +0\.05/0\.10 +0\.05/0\.10 +0\.05/0\.10\n`,
		},
		{
			// The machine could not play 90×: the reference collapsed with the rest, and dividing
			// by it read "kept 696%".
			name: "behind the wall clock: no verdict, the lag shown",
			res: Result{Speed: 90, Runs: []RunResult{
				run(NoSpike, 28, 221, 4*time.Second), run(DryRun, 24, 221, 3*time.Second), run(Acting, 195, 221, onTime)}},
			want: []string{"NOT KEEPING TIME at 90×", "2.00/4.00 NOT KEPT", "1.50/3.00 NOT KEPT",
				"No verdict from the live runs: the no spike, dry run runs did not keep time", "up to 2.00 s late on average (tolerance 0.20 s)",
				"up to 4.00 s over the worst\n5 minutes (tolerance 0.75 s), in the deployment's time", "Try a speed of 9 "},
			not: []string{"kept 6", "%;", "0.86", "6.96"},
			re:  `ratio to no spike +— +— +—\n`,
		},
		{
			name: "one run behind for a few minutes is enough",
			res: Result{Speed: 90, Runs: []RunResult{
				run(NoSpike, 217, 221, onTime), run(DryRun, 24, 221, onTime),
				{Name: Acting, Report: run(Acting, 217, 221, 0).Report,
					Timing: Timing{Waits: 5000, Mean: 100 * time.Millisecond, Worst: 900 * time.Millisecond}}}},
			want: []string{"0.10/0.90 NOT KEPT", "NOT KEEPING TIME", "No verdict from the live runs: the acting run did not keep time", "Try a speed of 70"},
			not:  []string{"kept 100%", "1.00     0.11"},
		},
		{
			// The most behind on average and the worst window come from different runs: the
			// message names the largest of each.
			name: "behind in different ways",
			res: Result{Speed: 90, Runs: []RunResult{
				{Name: NoSpike, Report: run(NoSpike, 42, 221, 0).Report,
					Timing: Timing{Waits: 5000, Mean: 670 * time.Millisecond, Worst: 6340 * time.Millisecond}},
				run(DryRun, 2, 221, onTime),
				{Name: Acting, Report: run(Acting, 122, 221, 0).Report,
					Timing: Timing{Waits: 5000, Mean: 500 * time.Millisecond, Worst: 9130 * time.Millisecond}}}},
			want: []string{"No verdict from the live runs: the no spike, acting runs did not keep time.",
				"up to 0.67 s late on average", "up to 9.13 s over the worst"},
		},
		{
			// Late all along by less than a window's tolerance: an hour of extra sessions.
			name: "late on average all run long",
			res: Result{Speed: 90, Runs: []RunResult{
				run(NoSpike, 217, 221, onTime), run(DryRun, 24, 221, onTime),
				{Name: Acting, Report: run(Acting, 217, 221, 0).Report,
					Timing: Timing{Waits: 5000, Mean: 300 * time.Millisecond, Worst: 500 * time.Millisecond}}}},
			want: []string{"0.30/0.50 NOT KEPT", "No verdict from the live runs: the acting run did not keep time", "Try a speed of 60"},
			not:  []string{"kept 100%"},
		},
		{
			name: "an unmeasured run has not shown it kept time",
			res: Result{Speed: 90, Runs: []RunResult{
				run(NoSpike, 217, 221, onTime), run(DryRun, 24, 221, onTime),
				{Name: Acting, Report: run(Acting, 217, 221, 0).Report}}},
			want: []string{"No verdict from the live runs: the acting run did not keep time"},
			not:  []string{"kept 100%"},
			re:   `late per wait, mean/worst \(s\) +0\.05/0\.10 +0\.05/0\.10 +\?\n`,
		},
		{
			name: "kept time but the reference collapsed: said, not divided by",
			res: Result{Speed: 90, Runs: []RunResult{
				run(NoSpike, 28, 221, onTime), run(DryRun, 24, 221, onTime), run(Acting, 195, 221, onTime)}},
			want: []string{"the no-spike reference did not stay healthy", "served 28 of its 221 sessions", "(13%, under 80%)"},
			not:  []string{"kept 6", "NOT KEEP", "0.86"},
		},
		{
			name: "interrupted: partial numbers, no verdict",
			res: Result{Speed: 90, Interrupted: true, Runs: []RunResult{
				run(NoSpike, 217, 221, onTime), run(DryRun, 24, 221, onTime), run(Acting, 217, 221, onTime)}},
			want: []string{"Interrupted: no verdict"},
			not:  []string{"kept 100%"},
		},
		{
			name: "a run without a report",
			res: Result{Speed: 90, Runs: []RunResult{
				run(NoSpike, 217, 221, onTime), {Name: DryRun}, run(Acting, 217, 221, onTime)}},
			want: []string{"The runs did not all finish: no verdict."},
			not:  []string{"kept 100%"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b strings.Builder
			Write(&b, &tc.res)
			out := b.String()
			for _, w := range tc.want {
				assert.Contains(t, out, w)
			}
			for _, n := range tc.not {
				assert.NotContains(t, out, n)
			}
			if tc.re != "" {
				assert.Regexp(t, regexp.MustCompile(tc.re), out)
			}
			assert.Contains(t, out, Verdict(&tc.res), "Write ends with the verdict")
		})
	}
}

func TestLatenessJustPastItsToleranceDoesNotReadAsIt(t *testing.T) {
	assert.Equal(t, "0.21 s", lateness(MaxMeanLag+time.Microsecond))
	assert.Equal(t, "0.20 s", lateness(MaxMeanLag))
	assert.Equal(t, "0.76 s", lateness(MaxLag+time.Millisecond))
	assert.Equal(t, "12 s", lateness(11*time.Second+time.Millisecond))
}

func TestSlowerSuggestion(t *testing.T) {
	for _, tc := range []struct {
		speed       float64
		mean, worst time.Duration
		want        string
	}{
		{90, time.Second, 4 * time.Second, "Try a speed of 10 "}, // 16.9, rounded down to tens
		{90, 0, 1100 * time.Millisecond, "Try a speed of 60 "},
		{90, 300 * time.Millisecond, 300 * time.Millisecond, "Try a speed of 60 "}, // the mean binds
		{9, 0, 2 * time.Second, "Try a speed of 3 "},
		{5, 0, 10 * time.Second, "Even 1× would be 2.00 s late per wait here"},
	} {
		assert.Contains(t, slower(tc.speed, Timing{Waits: 100, Mean: tc.mean, Worst: tc.worst})+" ", tc.want)
	}
}

// TestBudgetRow: a gateway that never had a budget set says so, not "0" or "∞".
func TestBudgetRow(t *testing.T) {
	onTime := 100 * time.Millisecond
	counting := run(DryRun, 24, 221, onTime)
	counting.Budget, counting.CountOnly = 0, true
	acting := run(Acting, 217, 221, onTime)
	acting.Budget = 650_000
	var b strings.Builder
	Write(&b, &Result{Speed: 90, Runs: []RunResult{run(NoSpike, 217, 221, onTime), counting, acting}})
	assert.Regexp(t, `session budget at the end +∞ +count only +650K\n`, b.String())
}

// TestNeedsVirtual: the runs are played again in virtual time exactly when the live ones finished
// and give no verdict because of the machine — not when they give one, nor when they were cut
// short (interrupted, unfinished).
func TestNeedsVirtual(t *testing.T) {
	onTime, late := 100*time.Millisecond, 3*time.Second
	unfinished := run(Acting, 217, 221, onTime)
	unfinished.Report = nil
	for _, tc := range []struct {
		name string
		res  Result
		want bool
	}{
		{"a verdict", Result{Runs: []RunResult{run(NoSpike, 217, 221, onTime), run(DryRun, 24, 221, onTime), run(Acting, 217, 221, onTime)}}, false},
		{"a run behind the wall clock", Result{Runs: []RunResult{run(NoSpike, 217, 221, onTime), run(DryRun, 24, 221, late), run(Acting, 217, 221, onTime)}}, true},
		{"an unhealthy reference", Result{Runs: []RunResult{run(NoSpike, 120, 221, onTime), run(DryRun, 24, 221, onTime), run(Acting, 217, 221, onTime)}}, true},
		{"interrupted", Result{Interrupted: true, Runs: []RunResult{run(NoSpike, 217, 221, late), run(DryRun, 24, 221, late), run(Acting, 217, 221, late)}}, false},
		{"a run unfinished", Result{Runs: []RunResult{run(NoSpike, 217, 221, late), run(DryRun, 24, 221, late), unfinished}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.res.Speed = 90
			assert.Equal(t, tc.want, needsVirtual(&tc.res))
		})
	}
}
