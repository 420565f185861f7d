package cli

import (
	"context"
	"fmt"

	"github.com/basin-dev/basin/internal/daemon"
)

// runDaemon runs basin's collector, detector and remediation loop until interrupted.
func runDaemon(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env)
	cfgPath := fs.String("config", "", "daemon config file (YAML; see examples/daemon.yaml)")
	dryRun := fs.Bool("dry-run", false, "decide, audit and notify, but take no action (overrides the file's dry_run)")
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
	cfg, err := daemon.LoadConfig(*cfgPath)
	if err != nil {
		return err
	}
	if *dryRun {
		cfg.DryRun = true
	}
	d, err := daemon.New(cfg, daemon.Options{Logger: logger, Registerer: reg, Gatherer: reg})
	if err != nil {
		return err
	}
	defer d.Close()
	logger.Info("basin daemon", "listen", cfg.Listen, "deployment", cfg.Deployment, "dry_run", cfg.DryRun, "data_dir", cfg.DataDir)
	return d.Run(ctx)
}
