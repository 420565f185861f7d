package cli

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/internal/store"
)

// runGateway serves basin's session-admission gateway until interrupted.
func runGateway(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env)
	cfgPath := fs.String("config", "", "gateway config file (YAML; see gateway/testdata/gateway.example.yaml)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if *cfgPath == "" {
		return fmt.Errorf("%w: --config is required", errUsage)
	}
	logger, reg, err := serverSetup(env, *level)
	if err != nil {
		return err
	}
	cfg, err := gateway.LoadConfig(*cfgPath)
	if err != nil {
		return err
	}
	if cfg.Store.Enabled() {
		store.RouteClientLogs(logger)
	}
	return gateway.Run(ctx, gateway.Options{Config: cfg, Logger: logger, Registerer: reg, Getenv: env.Getenv})
}

// serverSetup is what every long-running command needs: a text logger at the --log-level, and a
// registry with the Go and process collectors for its /metrics.
func serverSetup(env Env, level string) (*slog.Logger, *prometheus.Registry, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, nil, fmt.Errorf("%w: --log-level: %v", errUsage, err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: lv})), reg, nil
}
