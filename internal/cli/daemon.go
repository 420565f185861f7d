package cli

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/basin-dev/basin/internal/daemon"
)

// runDaemon runs basin's collector, detector and remediation loop until interrupted.
func runDaemon(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env, "daemon")
	cfgPath := fs.String("config", "", "daemon config file (YAML; see examples/daemon.yaml)")
	dryRun := fs.Bool("dry-run", false, "decide, audit and notify, but take no action (overrides the file's dry_run)")
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
	cfg, err := daemon.LoadConfig(*cfgPath)
	if err != nil {
		return err
	}
	if *dryRun {
		cfg.DryRun = true
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	logger := slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: lv}))
	d, err := daemon.New(cfg, daemon.Options{Logger: logger, Registerer: reg, Gatherer: reg})
	if err != nil {
		return err
	}
	logger.Info("basin daemon", "listen", cfg.Listen, "deployment", cfg.Deployment, "dry_run", cfg.DryRun, "data_dir", cfg.DataDir)
	return d.Run(ctx)
}
