package calibrate

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/sim/scenario"
	"github.com/basin-dev/basin/sim/serve/servetest"
)

// TestLiveCalibrationAgainstSimServe step-loads `basin sim serve` over HTTP and scrapes its
// per-instance metrics: the points climb in working set, and a calibration comes out.
func TestLiveCalibrationAgainstSimServe(t *testing.T) {
	if raceEnabled {
		t.Skip("wall-clock step load: under the race detector the simulated endpoint answers too slowly; `go test ./...` runs it")
	}
	const speed = 200
	ts := servetest.Start(t, speed)
	sc, err := scenario.Load("paper-1p1d-h100")
	require.NoError(t, err)
	// An observe-only gateway in front (a budget nothing reaches): it is how basin sees sessions.
	cfg, err := gateway.ParseConfig([]byte("upstreams: [" + ts.URL + "]\nadmission: {budget_tokens: 1000000000000}\n"))
	require.NoError(t, err)
	g, err := gateway.New(gateway.Options{Config: cfg, Getenv: func(k string) string {
		if k == gateway.AdminTokenEnv {
			return "t0ken"
		}
		return ""
	}})
	require.NoError(t, err)
	gw := httptest.NewServer(g.Handler())
	defer gw.Close()
	admin := httptest.NewServer(g.AdminHandler())
	defer admin.Close()
	targets := []collector.Target{
		{Name: "prefill-0", URL: ts.URL + "/metrics/prefill-0", Role: collector.RolePrefill, Dialect: collector.DialectSGLang},
		{Name: "decode-0", URL: ts.URL + "/metrics/decode-0", Role: collector.RoleDecode, Dialect: collector.DialectSGLang},
		{Name: "gateway", URL: admin.URL + "/metrics", Role: collector.RoleGateway, Dialect: collector.DialectGateway},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := Run(ctx, Options{Target: gw.URL, Targets: targets, Scenario: sc,
		Multipliers: []float64{1, 2, 3, 4}, Step: 5 * time.Minute, Speed: speed})
	require.NotNil(t, res, "%v", err)
	require.Len(t, res.Points, 4)
	assert.Greater(t, res.Points[3].WorkingSetOverCache, res.Points[0].WorkingSetOverCache,
		"more arrivals, more working set")
	for _, p := range res.Points {
		assert.True(t, p.HitRate > 0 && p.HitRate <= 1, "hit rate %v", p.HitRate)
	}
	if err == nil {
		assert.Positive(t, res.Calibration.KneeRatio)
		assert.Less(t, res.Calibration.PeakCompletionRatePerS, 0.2, "rates in the endpoint's time, not ×speed")
		assert.InDelta(t, 30, res.Calibration.CallsPerSession, 2)
	} else {
		// Four steps may not reach the knee's drop; the error says so rather than inventing one.
		assert.ErrorContains(t, err, "calibration")
	}
}

func TestOptionsNameTheField(t *testing.T) {
	_, err := Run(context.Background(), Options{Multipliers: []float64{-1}})
	require.Error(t, err)
	for _, f := range []string{"target", "metrics targets", "scenario", "step", "speed", "multipliers[0]"} {
		assert.Contains(t, err.Error(), f)
	}
}
