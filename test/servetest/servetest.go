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
	return StartWith(t, speed, nil)
}

// StartWith is Start with the server's options edited by tweak (nil: none). A test that runs the
// clock fast on a busy machine may want a longer IdleTimeout: at 1200×, the default 10 virtual
// minutes are half a second of wall time, which a stalled client can miss.
func StartWith(t testing.TB, speed float64, tweak func(*serve.Options)) *httptest.Server {
	t.Helper()
	dep, err := sim.DeploymentPreset("paper-1p1d-h100")
	if err != nil {
		t.Fatal(err)
	}
	o := serve.Options{Sim: sim.Options{Seed: 1, Deployment: dep}, Speed: speed}
	if tweak != nil {
		tweak(&o)
	}
	srv, err := serve.New(o)
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
