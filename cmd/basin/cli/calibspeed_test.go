package cli

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/collector"
)

// A live calibration runs at the speed the engines announce; --speed may only agree with it.
func TestCalibrationSpeed(t *testing.T) {
	engine := func(body string) []collector.Target {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			fmt.Fprint(w, body)
		}))
		t.Cleanup(ts.Close)
		return []collector.Target{{Name: "unified-0", Role: collector.RoleUnified, URL: ts.URL}}
	}
	sim := engine("# TYPE basin_sim_speed gauge\nbasin_sim_speed 60\n")
	plain := engine("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1\n")
	ctx := context.Background()

	s, err := calibrationSpeed(ctx, sim, 0)
	require.NoError(t, err)
	assert.Equal(t, 60.0, s, "the announced speed")
	s, err = calibrationSpeed(ctx, sim, 60)
	require.NoError(t, err)
	assert.Equal(t, 60.0, s)
	_, err = calibrationSpeed(ctx, sim, 30)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "basin_sim_speed 60")
	s, err = calibrationSpeed(ctx, plain, 0)
	require.NoError(t, err)
	assert.Equal(t, 1.0, s, "a real engine announces nothing")
	s, err = calibrationSpeed(ctx, plain, 5)
	require.NoError(t, err)
	assert.Equal(t, 5.0, s, "an endpoint that announces nothing takes --speed as given")
	_, err = calibrationSpeed(ctx, plain, -1)
	assert.ErrorContains(t, err, "--speed")
}
