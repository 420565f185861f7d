package calibrate

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/sim/scenario"
	"github.com/basin-dev/basin/test/servetest"
)

// TestLiveCalibrationAgainstSimServe step-loads `basin sim serve` over HTTP and scrapes its
// per-instance metrics: the points climb in working set, and a calibration comes out.
func TestLiveCalibrationAgainstSimServe(t *testing.T) {
	if raceEnabled {
		t.Skip("wall-clock step load: under the race detector the simulated endpoint answers too slowly; `go test ./...` runs it")
	}
	// The endpoint runs speed× the wall clock, and Run derives the collector's wall-clock windows
	// from the wall step (scrape timeout step/6, rate window step/2, staleness one step): a faster
	// test is both more work per wall second and tighter windows. Three runs each while other
	// packages' tests loaded the two cores: at 100× (a 3 s step, 500 ms scrapes) 7 to 12 of the
	// 72 scrapes timed out and one run lost the hit rate for the whole ×4 step ("hit_rate
	// stale"); at 50× (a 6 s step, 1 s scrapes) 0 to 8 timed out, never for a whole step.
	const speed = liveSpeed
	sc, targets, gwURL := startDeployment(t, speed)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := Run(ctx, Options{Target: gwURL, Targets: targets, Scenario: sc,
		Multipliers: []float64{1, 2, 3, 4}, Step: 5 * time.Minute, Speed: speed})
	require.NotNil(t, res, "%v", err)
	require.Len(t, res.Points, 4, "%v", err)
	assert.Greater(t, res.Points[3].WorkingSetOverCache, res.Points[0].WorkingSetOverCache,
		"more arrivals, more working set")
	for _, p := range res.Points {
		assert.True(t, p.HitRate > 0 && p.HitRate <= 1, "hit rate %v", p.HitRate)
	}
	endedAll(t, res, targets)
	if err == nil {
		assert.Positive(t, res.Calibration.KneeRatio)
		assert.Less(t, res.Calibration.PeakCompletionRatePerS, 0.2, "rates in the endpoint's time, not ×speed")
		assert.InDelta(t, 30, res.Calibration.CallsPerSession, 2)
	} else {
		// Four steps may not reach the knee's drop; the error says so rather than inventing one.
		assert.ErrorContains(t, err, "calibration")
	}
}

// liveSpeed is the simulated endpoint's speed in the wall-clock tests (see
// TestLiveCalibrationAgainstSimServe for why not faster).
const liveSpeed = 50

// startDeployment serves a simulated deployment behind an observe-only gateway (a budget nothing
// reaches: it is how basin sees sessions) and returns the workload, the metrics targets and the
// gateway's URL.
func startDeployment(t *testing.T, speed float64) (*scenario.Scenario, []collector.Target, string) {
	return startDeploymentBudget(t, speed, 1_000_000_000_000)
}

// startDeploymentBudget is startDeployment with the gateway's budget in tokens.
func startDeploymentBudget(t *testing.T, speed float64, budget int) (*scenario.Scenario, []collector.Target, string) {
	t.Helper()
	ts := servetest.Start(t, speed)
	sc, err := scenario.Load("paper-1p1d-h100")
	require.NoError(t, err)
	cfg, err := gateway.ParseConfig(fmt.Appendf(nil, "upstreams: [%s]\nadmission: {budget_tokens: %d}\n", ts.URL, budget))
	require.NoError(t, err)
	g, err := gateway.New(gateway.Options{Config: cfg, Getenv: func(k string) string {
		if k == gateway.AdminTokenEnv {
			return "t0ken"
		}
		return ""
	}})
	require.NoError(t, err)
	gw := httptest.NewServer(g.Handler())
	t.Cleanup(gw.Close)
	admin := httptest.NewServer(g.AdminHandler())
	t.Cleanup(admin.Close)
	return sc, []collector.Target{
		{Name: "prefill-0", URL: ts.URL + "/metrics/prefill-0", Role: collector.RolePrefill, Dialect: collector.DialectSGLang},
		{Name: "decode-0", URL: ts.URL + "/metrics/decode-0", Role: collector.RoleDecode, Dialect: collector.DialectSGLang},
		{Name: "gateway", URL: admin.URL + "/metrics", Role: collector.RoleGateway, Dialect: collector.DialectGateway},
	}, gw.URL
}

// endedAll checks that a run left no session live at the gateway: the load generator ended each
// it cut short or that did not complete, and the result counts them.
func endedAll(t *testing.T, res *Result, targets []collector.Target) {
	t.Helper()
	admin := strings.TrimSuffix(targets[len(targets)-1].URL, "/metrics")
	req, err := http.NewRequest(http.MethodGet, admin+"/admin/state?queue_tail=0", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer t0ken")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var st struct {
		Live   *int `json:"live_sessions"`
		Queued *int `json:"queued_sessions"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	require.NotNil(t, st.Live)
	assert.Zero(t, *st.Live, "sessions left live at the gateway after the run")
	assert.Zero(t, *st.Queued, "sessions left queued at the gateway after the run")
	assert.Positive(t, res.SessionEnds.Ended, "the run cut sessions short and ended them")
	assert.Zero(t, res.SessionEnds.Failed, "%v", res.SessionEnds)
}

// TestInterruptedKeepsWhatItMeasured cancels a live calibration after its first step: Run says
// where it stopped, keeps the point, and SavePartial writes it to a file marked partial.
// Progress has said all along which step runs, at what rate, and what was measured.
func TestInterruptedKeepsWhatItMeasured(t *testing.T) {
	if raceEnabled {
		t.Skip("wall-clock step load: under the race detector the simulated endpoint answers too slowly; `go test ./...` runs it")
	}
	const speed = liveSpeed
	sc, targets, gwURL := startDeployment(t, speed)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var seen []Progress
	res, err := Run(ctx, Options{Target: gwURL, Targets: targets, Scenario: sc,
		Multipliers: []float64{1, 2, 3, 4}, Step: 5 * time.Minute, Speed: speed,
		Progress: func(p Progress) {
			seen = append(seen, p)
			if len(p.Points) == 1 {
				cancel()
			}
		}})
	require.ErrorIs(t, err, context.Canceled)
	assert.ErrorContains(t, err, "interrupted in step 2 of 4, after 1 measured")
	require.NotNil(t, res)
	require.Len(t, res.Points, 1)
	assert.Nil(t, res.Calibration)
	endedAll(t, res, targets)

	require.NotEmpty(t, seen)
	assert.Equal(t, 1, seen[0].Step)
	assert.Equal(t, 4, seen[0].Steps)
	assert.InDelta(t, sc.Arrivals.RatePerMin, seen[0].RatePerMin, 1e-9)
	last := seen[len(seen)-1]
	assert.Equal(t, 2, last.Step)
	assert.InDelta(t, 2*sc.Arrivals.RatePerMin, last.RatePerMin, 1e-9)
	assert.Len(t, last.Points, 1)
	assert.Greater(t, last.Done, 0.2)
	assert.Less(t, last.Done, 0.5)
	assert.Positive(t, last.Elapsed)

	path := filepath.Join(t.TempDir(), "calibration.partial.json")
	require.NoError(t, res.SavePartial(path, err, time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)))
	b, rerr := os.ReadFile(path)
	require.NoError(t, rerr)
	var p Partial
	require.NoError(t, json.Unmarshal(b, &p))
	assert.True(t, p.Partial)
	assert.Equal(t, 1, p.StepsDone)
	assert.Equal(t, []float64{1, 2, 3, 4}, p.Multipliers)
	assert.Equal(t, 300.0, p.StepSeconds)
	assert.Equal(t, res.Points, p.Points)
	assert.Contains(t, p.Reason, "interrupted in step 2 of 4")
	assert.Contains(t, p.Source, "basin calibrate --target "+gwURL)
}

// TestCancelledBeforeAnyStep: cancelled before a step completes, there is nothing to keep, and
// SavePartial says so rather than writing an empty file.
func TestCancelledBeforeAnyStep(t *testing.T) {
	sc, err := scenario.Load("paper-1p1d-h100")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := Run(ctx, Options{Target: "http://127.0.0.1:1", Scenario: sc, Step: time.Minute, Speed: 1,
		Targets: []collector.Target{{Name: "prefill-0", URL: "http://127.0.0.1:1/metrics", Role: collector.RolePrefill}}})
	require.ErrorIs(t, err, context.Canceled)
	require.NotNil(t, res)
	assert.Empty(t, res.Points)
	path := filepath.Join(t.TempDir(), "p.json")
	assert.ErrorContains(t, res.SavePartial(path, err, time.Now()), "no step was measured")
	assert.NoFileExists(t, path)
}

func TestOptionsNameTheField(t *testing.T) {
	_, err := Run(context.Background(), Options{Multipliers: []float64{-1}})
	require.Error(t, err)
	for _, f := range []string{"target", "metrics targets", "scenario", "step", "speed", "multipliers[0]"} {
		assert.Contains(t, err.Error(), f)
	}
}

// TestLiveCalibrationUnderABudget step-loads through a gateway whose budget holds the working set
// far below the knee: the fit finds no knee, and the error says the budget did it, with its
// numbers; the sessions it held in the queue and those it admitted are all ended after the run.
func TestLiveCalibrationUnderABudget(t *testing.T) {
	if raceEnabled {
		t.Skip("wall-clock step load: under the race detector the simulated endpoint answers too slowly; `go test ./...` runs it")
	}
	sc, targets, gwURL := startDeploymentBudget(t, liveSpeed, 150_000)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := Run(ctx, Options{Target: gwURL, Targets: targets, Scenario: sc,
		Multipliers: []float64{1, 2, 3, 4}, Step: 5 * time.Minute, Speed: liveSpeed})
	require.NotNil(t, res, "%v", err)
	require.Len(t, res.Points, 4, "%v", err)
	require.ErrorIs(t, err, detector.ErrNoDrop)
	assert.ErrorContains(t, err, "knee beyond the measured range: the gateway's admission budget capped the working set")
	assert.ErrorContains(t, err, "the budget was 150000 tokens")
	for i, p := range res.Points {
		assert.LessOrEqual(t, p.WorkingSetOverCache, 0.5, "step %d: the budget (0.27 C) holds W far below the knee", i+1)
	}
	endedAll(t, res, targets)
}
