// Package servetest starts a simulated deployment (`basin sim serve`) on a loopback test server,
// for the tests of everything that talks to one: the gateway, the load generator, the command line.
package servetest

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/serve"
)

// Start serves the paper's 1P1D H100 deployment at speed× the wall clock (external traffic only)
// and stops it when the test ends.
func Start(t testing.TB, speed float64) *httptest.Server {
	t.Helper()
	dep, err := sim.DeploymentPreset("paper-1p1d-h100")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := serve.New(serve.Options{Sim: sim.Options{Seed: 1, Deployment: dep}, Speed: speed})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("sim serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("sim serve: Run did not return after cancel")
		}
		ts.Close()
	})
	return ts
}
