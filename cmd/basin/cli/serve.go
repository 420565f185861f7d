package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/serve"
)

// simServe runs a scenario's deployment against the wall clock and serves it over HTTP until
// interrupted.
func simServe(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env)
	scName := fs.String("scenario", "", "scenario file or preset name (its deployment, policy and SLO)")
	policy := fs.String("policy", "", "engine policy (default: the scenario's, else none)")
	speed := fs.Float64("speed", 60, "virtual seconds per wall second")
	listen := fs.String("listen", "127.0.0.1:8000", "address to serve on")
	traffic := fs.String("traffic", "external", "external: only HTTP clients; scenario: also the scenario's own arrivals")
	idle := fs.Duration("idle-timeout", serve.DefaultIdleTimeout, "end a session idle this long (virtual time)")
	outputs := fs.String("output-lengths", "workload", "workload: answers are as long as the scenario's workload's calls, at most the request's max_tokens (a model ends its turn); max-tokens: exactly max_tokens")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	sc, err := loadScenario(*scName)
	if err != nil {
		return err
	}
	o, err := basinWiring(sc).Options(sc, *policy)
	if err != nil {
		return err
	}
	var workload sim.Workload
	switch *outputs {
	case "workload":
		// The scenario's own sessions: its base stream's workload.
		if len(o.Streams) == 0 || o.Streams[0].Workload == nil {
			return fmt.Errorf("--output-lengths workload: scenario %s has no workload", sc.Name)
		}
		workload = o.Streams[0].Workload
	case "max-tokens":
	default:
		return fmt.Errorf("%w: --output-lengths: %q, want workload or max-tokens", errUsage, *outputs)
	}
	switch *traffic {
	case "external":
		o.Streams = nil
	case "scenario":
		o.Duration, o.MeasureFrom, o.MeasureTo = 0, 0, 0 // open-ended; the streams never stop
	default:
		return fmt.Errorf("%w: --traffic: %q, want external or scenario", errUsage, *traffic)
	}
	logger := slog.New(slog.NewTextHandler(env.Stderr, nil))
	srv, err := serve.New(serve.Options{Sim: o, Speed: *speed, IdleTimeout: *idle, Logger: logger, Workload: workload})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	logger.Info("serving simulated deployment", "scenario", sc.Name, "policy", o.Policy, "speed", *speed, "output_lengths", *outputs,
		"addr", "http://"+ln.Addr().String(), "metrics", "http://"+ln.Addr().String()+"/metrics")

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- srv.Run(ctx) }()
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		cancel()
	}
	shutdown, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	if e := hs.Shutdown(shutdown); e != nil {
		_ = hs.Close() // what Shutdown left open (see daemon.Serve)
		if err == nil {
			err = fmt.Errorf("shutdown: %w", e)
		}
	}
	if e := <-runErr; e != nil && err == nil {
		err = e
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
