package cli

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/basin-dev/basin/gateway"
)

// runGateway serves basin's session-admission gateway until interrupted.
func runGateway(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env, "gateway")
	cfgPath := fs.String("config", "", "gateway config file (YAML; see gateway/testdata/gateway.example.yaml)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if *cfgPath == "" {
		return fmt.Errorf("%w: --config is required", errUsage)
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("%w: --log-level: %v", errUsage, err)
	}
	cfg, err := gateway.LoadConfig(*cfgPath)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	logger := slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: lv}))
	return gateway.Run(ctx, gateway.Options{Config: cfg, Logger: logger, Registerer: reg, Getenv: env.Getenv})
}
