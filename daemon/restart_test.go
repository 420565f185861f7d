package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/remediate"
)

// intoIncident steps d healthy for a few steps, then lets the hit rate collapse until the policy
// has cut the budget; it returns the status right after the cut.
func (e *env) intoIncident(d *Daemon) Status {
	e.t.Helper()
	for range 4 {
		e.step(d)
	}
	require.Equal(e.t, detector.Healthy, d.StatusNow().Assessment.State)
	e.dep.collapse()
	s := e.stepUntil(d, 40, "incident cut", func(s Status) bool { return s.Policy.Target == testCut })
	require.Equal(e.t, detector.Trapped, s.Assessment.State)
	require.Equal(e.t, remediate.Incident, s.Policy.Mode)
	return s
}

// oneRecordPerSeq checks that no two plans share a sequence number: every budget record with the
// same seq carries the same change (an intent and its outcome share it, nothing else does).
func oneRecordPerSeq(t *testing.T, recs []remediate.Record) {
	t.Helper()
	to := map[uint64]int64{}
	for _, r := range recs {
		if r.Budget == nil {
			continue
		}
		if prev, ok := to[r.Seq]; ok && prev != r.Budget.To {
			t.Errorf("seq %d used by two budget changes: to %d and to %d (%s %s, reasons %q)", r.Seq, prev, r.Budget.To,
				r.Kind, r.Phase, r.Reasons)
		}
		to[r.Seq] = r.Budget.To
	}
}

// noDuplicateDone checks that no (seq, kind) has two done records.
func noDuplicateDone(t *testing.T, recs []remediate.Record) {
	t.Helper()
	type key struct {
		seq  uint64
		kind string
	}
	seen := map[key]bool{}
	for _, r := range recs {
		if r.Phase != remediate.PhaseDone {
			continue
		}
		k := key{r.Seq, r.Kind}
		assert.False(t, seen[k], "seq %d %s done twice", r.Seq, r.Kind)
		seen[k] = true
	}
}

// TestRestartMidIncident: the daemon is killed in an incident after it cut the budget; the one
// that comes back on the same data directory resumes the detector's state and the policy's mode
// and target, and does not cut again.
func TestRestartMidIncident(t *testing.T) {
	e := newEnv(t, "")
	d1 := e.daemon()
	cut := e.intoIncident(d1)
	e.step(d1) // the incident holds: nothing more to do
	require.Equal(t, 1, callsTo(e.gw.Budgets(), testCut), "%+v", e.gw.Budgets())
	calls := len(e.gw.Budgets())
	before := d1.StatusNow()
	assert.Equal(t, cut.Policy.Seq, before.Policy.Seq, "no plan after the cut")
	// Killed: d1 is never used again (a kill closes nothing; Daemon has no Close either).

	d2 := e.daemon()
	s := d2.StatusNow()
	assert.Equal(t, before.Policy, s.Policy, "mode, target, reference, seq and timers are restored")
	assert.Equal(t, remediate.Incident, s.Policy.Mode)
	assert.EqualValues(t, testCut, s.Policy.Target)
	assert.Empty(t, s.Pending, "the cut was done before the kill")

	// The restarted collector has no data yet: blind steps hold everything.
	e.clock.Advance(stepEvery)
	d2.Step(t.Context())
	s = d2.StatusNow()
	assert.Equal(t, detector.Trapped, s.Assessment.State, "resumed, held while blind")
	assert.True(t, before.Assessment.Since.Equal(s.Assessment.Since), "since %v, want %v", s.Assessment.Since, before.Assessment.Since)
	assert.NotEmpty(t, s.Assessment.Blind)

	// The trap goes on: trapped, incident, the budget held, no second cut.
	for range 12 {
		e.step(d2)
	}
	s = d2.StatusNow()
	assert.Equal(t, detector.Trapped, s.Assessment.State)
	assert.Empty(t, s.Assessment.Blind)
	assert.Equal(t, remediate.Incident, s.Policy.Mode)
	assert.EqualValues(t, testCut, s.Policy.Target)
	assert.Len(t, e.gw.Budgets(), calls, "no budget call after the restart: %+v", e.gw.Budgets()[calls:])
	recs := auditLines(t, e.cfg.DataDir)
	cuts := 0
	for _, r := range done(recs, "budget") {
		if r.Budget.To == testCut {
			cuts++
		}
	}
	assert.Equal(t, 1, cuts, "one cut in the audit log")
	noDuplicateDone(t, recs)
	oneRecordPerSeq(t, recs)
}

// TestStatusAfterRestartShowsResumedState: right after a restart, before its first step, the
// status shows the state the detector resumed — an operator who restarts the daemon mid-incident
// should not see an empty state (d.mu.last is the zero Assessment until the first Step).
func TestStatusAfterRestartShowsResumedState(t *testing.T) {
	e := newEnv(t, "")
	d1 := e.daemon()
	e.intoIncident(d1)

	d2 := e.daemon()
	s := d2.StatusNow()
	assert.Equal(t, detector.Trapped, s.Assessment.State,
		"BUG: the status shows state %q until the first step although the detector resumed trapped", s.Assessment.State)
}

// TestPauseSurvivesRestart: a pause taken through the API holds across a restart, and the
// restarted daemon takes no action while it lasts.
func TestPauseSurvivesRestart(t *testing.T) {
	e := newEnv(t, "")
	d1 := e.daemon()
	for range 4 {
		e.step(d1)
	}
	api := serveAPI(t, d1)
	code, body := call(t, http.MethodPost, api.URL+"/api/v1/pause", testToken, `{"minutes": 10, "reason": "maintenance"}`)
	require.Equal(t, http.StatusOK, code, "%s", body)
	until := e.clock.Now().Add(10 * time.Minute)
	calls := len(e.gw.Budgets())

	e.clock.Advance(time.Minute)
	d2 := e.daemon()
	s := d2.StatusNow()
	require.NotNil(t, s.Paused)
	assert.True(t, until.Equal(s.Paused.Until))
	assert.Contains(t, s.Paused.Reason, "maintenance")
	e.dep.collapse()
	for range 20 {
		e.step(d2)
	}
	assert.Equal(t, detector.Trapped, d2.StatusNow().Assessment.State)
	assert.Len(t, e.gw.Budgets(), calls, "no action while paused")

	// Once the pause is over the daemon acts as soon as it sees the trap again: the ten minutes
	// skipped left its rates without a window, and a trapped state held while blind is no reason
	// to cut.
	e.clock.Advance(10 * time.Minute)
	e.step(d2)
	assert.Nil(t, d2.StatusNow().Paused)
	require.True(t, d2.StatusNow().Blind)
	assert.Len(t, e.gw.Budgets(), calls, "no cut on a state it cannot see")
	e.stepUntil(d2, 5, "the cut once the trap is seen again", func(s Status) bool { return s.Policy.Target == testCut })
	assert.Equal(t, 1, callsTo(e.gw.Budgets(), testCut))
}

// stepKillable runs one Step on its own goroutine and reports whether it was killed
// (runtime.Goexit in the fake gateway) before it returned.
func stepKillable(d *Daemon) (killed bool) {
	finished := make(chan bool, 1)
	go func() {
		completed := false
		defer func() { finished <- completed }()
		d.Step(context.Background())
		completed = true
	}()
	return !<-finished
}

// killAtCut steps d into the incident; the cut's SetBudget kills the daemon mid-call, after
// calling apply when reached is true (the gateway got the call, the outcome was never written).
func (e *env) killAtCut(d *Daemon, reached bool) {
	e.t.Helper()
	for range 4 {
		e.step(d)
	}
	e.dep.collapse()
	e.gw.set(func(g *fakeGateway) {
		g.onSetBudget = func(tokens int64, apply func()) {
			if tokens != testCut {
				apply()
				return
			}
			if reached {
				apply()
			}
			runtime.Goexit()
		}
	})
	for range 40 {
		e.dep.advance(stepEvery)
		e.dep.feed(e.t, d, e.clock.Advance(e.wall(stepEvery)))
		if stepKillable(d) {
			e.gw.set(func(g *fakeGateway) { g.onSetBudget = nil })
			return
		}
	}
	e.t.Fatal("the daemon never cut the budget")
}

// serveBriefly runs Serve until reconcile has left nothing pending, then stops it.
func serveBriefly(t *testing.T, d *Daemon) {
	t.Helper()
	ln := listen(t)
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var s Status
		code, _ := call(t, http.MethodGet, base+"/api/v1/status", "", "")
		if code == http.StatusOK {
			getJSON(t, base+"/api/v1/status", &s)
			if len(s.Pending) == 0 {
				break
			}
		}
		require.True(t, time.Now().Before(deadline), "reconcile did not finish: %+v", s.Pending)
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
}

// TestKilledBetweenIntentAndAction: the daemon recorded the cut's intent (and saved its state) and
// was killed before the gateway got the call. The restarted daemon's Serve reconciles before its
// first step: the cut is made once, recorded done and reconciled, and never repeated.
func TestKilledBetweenIntentAndAction(t *testing.T) {
	e := newEnv(t, "")
	e.killAtCut(e.daemon(), false)
	assert.Zero(t, callsTo(e.gw.Budgets(), testCut), "the call never reached the gateway")
	pending := 0
	for _, r := range auditLines(t, e.cfg.DataDir) {
		if r.Phase == remediate.PhaseIntent && r.Budget != nil && r.Budget.To == testCut {
			pending++
		}
	}
	require.Equal(t, 1, pending, "the intent is on disk")

	d2 := e.daemon()
	require.Len(t, d2.StatusNow().Pending, 1, "the status shows the interrupted action")
	serveBriefly(t, d2)
	assert.Equal(t, 1, callsTo(e.gw.Budgets(), testCut), "the cut, once: %+v", e.gw.Budgets())
	assert.EqualValues(t, testCut, e.gw.Budget())
	recs := auditLines(t, e.cfg.DataDir)
	outcome := recs[len(recs)-1]
	assert.Equal(t, remediate.PhaseDone, outcome.Phase)
	assert.True(t, outcome.Reconciled)
	assert.EqualValues(t, testCut, outcome.Budget.To)

	// Restarted again and stepping on in the trap: no second cut.
	d3 := e.daemon()
	assert.Empty(t, d3.StatusNow().Pending)
	for range 10 {
		e.step(d3)
	}
	assert.Equal(t, 1, callsTo(e.gw.Budgets(), testCut), "%+v", e.gw.Budgets())
	recs = auditLines(t, e.cfg.DataDir)
	noDuplicateDone(t, recs)
	oneRecordPerSeq(t, recs)
}

// TestKilledAfterTheGatewayGotTheCut: the gateway applied the cut, the daemon died before writing
// the outcome. Reconciliation finds the budget applied and records it done without calling again.
func TestKilledAfterTheGatewayGotTheCut(t *testing.T) {
	e := newEnv(t, "")
	e.killAtCut(e.daemon(), true)
	require.Equal(t, 1, callsTo(e.gw.Budgets(), testCut))

	d2 := e.daemon()
	require.Len(t, d2.StatusNow().Pending, 1)
	d2.reconcile(t.Context())
	assert.Empty(t, d2.StatusNow().Pending)
	assert.Equal(t, 1, callsTo(e.gw.Budgets(), testCut), "not called again: %+v", e.gw.Budgets())
	recs := auditLines(t, e.cfg.DataDir)
	outcome := recs[len(recs)-1]
	assert.Equal(t, remediate.PhaseDone, outcome.Phase)
	assert.True(t, outcome.Reconciled)
	assert.Contains(t, outcome.Reasons, "found applied after a restart")

	calls := len(e.gw.Budgets())
	for range 10 {
		e.step(d2)
	}
	assert.Len(t, e.gw.Budgets(), calls, "nothing more in the trap: %+v", e.gw.Budgets()[calls:])
	recs = auditLines(t, e.cfg.DataDir)
	noDuplicateDone(t, recs)
	oneRecordPerSeq(t, recs)
}

// TestIntentWithoutSavedState is the brief's literal crash: an intent in the audit log, written
// and synced, and the daemon killed before it saved its state (Execute appends the intents, then
// calls persist). The restarted daemon reconciles the intent — the cut is made once — but its
// policy was restored from the older state file and replayed only done records, so it neither
// knows the budget it just set nor that the intent's seq is taken: its next step "restores" the
// old budget as if someone else had changed it, under the intent's seq — see the report.
func TestIntentWithoutSavedState(t *testing.T) {
	e := newEnv(t, "")
	d1 := e.daemon()
	for range 4 {
		e.step(d1)
	}
	st := d1.StatusNow().Policy
	require.EqualValues(t, testReference, st.Target)
	a, warn, err := remediate.OpenAudit(auditPath(e.cfg.DataDir))
	require.NoError(t, err)
	require.Empty(t, warn)
	require.NoError(t, a.Append(context.Background(), remediate.Record{Seq: st.Seq + 1, At: e.clock.Now(), Kind: "budget", Phase: remediate.PhaseIntent,
		State: string(detector.Trapped), Mode: remediate.Incident,
		Budget:  &remediate.BudgetChange{From: testReference, To: testCut, Reference: testReference},
		Reasons: []string{"incident: cut B (written by the test)"}}))
	require.NoError(t, a.Close())

	d2 := e.daemon()
	require.Len(t, d2.StatusNow().Pending, 1)
	d2.reconcile(t.Context())
	assert.Empty(t, d2.StatusNow().Pending)
	assert.Equal(t, 1, callsTo(e.gw.Budgets(), testCut), "the cut, once: %+v", e.gw.Budgets())

	for range 3 { // the restarted collector needs two readings for its rates
		e.step(d2)
	}
	s := d2.StatusNow()
	require.Empty(t, s.Assessment.Blind)
	assert.EqualValues(t, testCut, s.Policy.Target, "BUG: the policy does not know the budget reconcile set")
	assert.EqualValues(t, testCut, e.gw.Budget(), "BUG: the reconciled cut was undone: %+v", e.gw.Budgets())
	assert.GreaterOrEqual(t, s.Policy.Seq, st.Seq+1, "BUG: the policy's seq is behind the audit log's")
	oneRecordPerSeq(t, auditLines(t, e.cfg.DataDir))
}

// TestPendingIntentRetriedWhenGatewayReturns: the gateway is down when the restarted daemon
// reconciles, so the interrupted cut stays pending. Once the gateway answers again the cut is made
// once and the intent closed: left pending, the status would list it for good and the next
// restart's reconcile would act on it again, whatever the budget has become by then.
func TestPendingIntentRetriedWhenGatewayReturns(t *testing.T) {
	e := newEnv(t, "")
	e.killAtCut(e.daemon(), false)

	e.gw.set(func(g *fakeGateway) { g.stateErr = errors.New("connection refused") })
	d2 := e.daemon()
	d2.reconcile(t.Context())
	require.Len(t, d2.StatusNow().Pending, 1, "left pending while the gateway is unread")
	assert.Zero(t, callsTo(e.gw.Budgets(), testCut))

	e.gw.set(func(g *fakeGateway) { g.stateErr = nil })
	for range 10 {
		e.step(d2)
	}
	assert.Equal(t, 1, callsTo(e.gw.Budgets(), testCut), "the loop makes the cut once: %+v", e.gw.Budgets())
	assert.Empty(t, d2.StatusNow().Pending,
		"the interrupted intent stays pending after the gateway came back: %s", fmtPending(d2.StatusNow().Pending))
}

func fmtPending(recs []remediate.Record) string {
	s := ""
	for _, r := range recs {
		s += fmt.Sprintf("[seq %d %s %s] ", r.Seq, r.Kind, r.Phase)
	}
	return s
}

// TestPausedStepsStillSaveState: while remediation is paused the detector keeps stepping; a
// restart must resume the state it reached, not the one saved before the pause.
func TestPausedStepsStillSaveState(t *testing.T) {
	e := newEnv(t, "")
	d1 := e.daemon()
	for range 4 {
		e.step(d1)
	}
	api := serveAPI(t, d1)
	code, body := call(t, http.MethodPost, api.URL+"/api/v1/pause", testToken, `{"minutes": 60, "reason": "hands off"}`)
	require.Equal(t, http.StatusOK, code, "%s", body)
	e.dep.collapse()
	for range 20 {
		e.step(d1)
	}
	require.Equal(t, detector.Trapped, d1.StatusNow().Assessment.State)

	d2 := e.daemon()
	e.clock.Advance(stepEvery)
	d2.Step(t.Context()) // blind: shows the resumed state
	assert.Equal(t, detector.Trapped, d2.StatusNow().Assessment.State,
		"the restart resumed the state saved before the pause")
}

// TestReconcileRespectsPause: a pause is "no action for that long"; the restarted daemon finishes
// an interrupted action only once the pause is over. Here the loop died in the cut's SetBudget,
// the operator paused basin through the API (which saves the pause), and basin was restarted.
func TestReconcileRespectsPause(t *testing.T) {
	e := newEnv(t, "")
	d1 := e.daemon()
	e.killAtCut(d1, false)
	api := serveAPI(t, d1) // the loop is dead, the API still answers
	code, body := call(t, http.MethodPost, api.URL+"/api/v1/pause", testToken, `{"minutes": 60, "reason": "holding the budget by hand"}`)
	require.Equal(t, http.StatusOK, code, "%s", body)

	d2 := e.daemon()
	require.NotNil(t, d2.StatusNow().Paused)
	d2.reconcile(t.Context())
	assert.Zero(t, callsTo(e.gw.Budgets(), testCut), "reconcile acted during a pause: %+v", e.gw.Budgets())
}

// TestHistorySurvivesRestart: the status page's history (GET /api/v1/history) is kept in data_dir,
// so a restarted daemon still draws the last hour; the file stays bounded however long it runs,
// and a line cut short by a crash is dropped, not fatal.
func TestHistorySurvivesRestart(t *testing.T) {
	e := newEnv(t, "")
	d1 := e.daemon()
	for range 10 {
		e.step(d1)
	}
	var before struct{ Points []HistoryPoint }
	getJSON(t, serveAPI(t, d1).URL+"/api/v1/history", &before)
	require.Len(t, before.Points, 10)

	d2 := e.daemon() // killed: no Close, no save at exit
	var after struct{ Points []HistoryPoint }
	getJSON(t, serveAPI(t, d2).URL+"/api/v1/history", &after)
	require.Len(t, after.Points, 10, "the history survived the restart")
	for i := range before.Points {
		assert.True(t, before.Points[i].T.Equal(after.Points[i].T))
		assert.Equal(t, before.Points[i].State, after.Points[i].State)
		assert.Equal(t, before.Points[i].WC, after.Points[i].WC)
		assert.Equal(t, before.Points[i].Budget, after.Points[i].Budget)
	}
	e.step(d2)
	getJSON(t, serveAPI(t, d2).URL+"/api/v1/history", &after)
	require.Len(t, after.Points, 11, "and goes on from there")
	assert.True(t, after.Points[10].T.After(after.Points[9].T))

	// A long run: the file is rewritten with the last hour once it holds two.
	for range 2*historyLen + 5 {
		e.step(d2)
	}
	fi, err := os.Stat(historyPath(e.cfg.DataDir))
	require.NoError(t, err)
	assert.Less(t, fi.Size(), int64(2*historyLen*400), "bounded")
	lines := bytes.Count(mustRead(t, historyPath(e.cfg.DataDir)), []byte("\n"))
	assert.LessOrEqual(t, lines, 2*historyLen)
	assert.GreaterOrEqual(t, lines, historyLen)

	// A crash mid-write leaves a last line cut short.
	f, err := os.OpenFile(historyPath(e.cfg.DataDir), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(`{"t":"2026-03-02T12:00:00Z","sta`)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	d3 := e.daemon()
	getJSON(t, serveAPI(t, d3).URL+"/api/v1/history", &after)
	assert.Len(t, after.Points, historyLen, "the last hour, without the cut line")
	e.step(d3)
	pts, err := readHistoryLines(historyPath(e.cfg.DataDir))
	require.NoError(t, err, "no glued lines after the restart")
	assert.Equal(t, historyLen+1, len(pts))
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

// readHistoryLines decodes every line of a history file, failing on any bad one.
func readHistoryLines(path string) ([]HistoryPoint, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []HistoryPoint
	for line := range bytes.Lines(b) {
		var p HistoryPoint
		if err := json.Unmarshal(line, &p); err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		out = append(out, p)
	}
	return out, nil
}
