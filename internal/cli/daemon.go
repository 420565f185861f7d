package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/basin-dev/basin/internal/daemon"
	"github.com/basin-dev/basin/internal/scaledclock"
)

// runDaemon runs basin's collector, detector and remediation loop until interrupted.
func runDaemon(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env)
	cfgPath := fs.String("config", "", "daemon config file (YAML; see examples/daemon.yaml)")
	dryRun := fs.Bool("dry-run", false, "decide, audit and notify, but take no action (overrides the file's dry_run)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	speed := fs.Float64("clock-speed", 1, "the deployment's seconds per wall second: 1 for real engines; S to watch `basin sim serve --speed S` in its own time (tests)")
	start := fs.String("clock-start", "", "with --clock-speed: when the simulated deployment started (RFC 3339), so that a restarted daemon keeps its time (default: now)")
	instance := fs.String("instance", "", "with a store (store.url): this daemon's name in the lease and its status, over the file's instance key (default: host name and pid)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if *cfgPath == "" {
		return fmt.Errorf("%w: --config is required", errUsage)
	}
	// The daemon has one time base, the clock it is given; a simulated deployment served faster than
	// real time is watched on a clock at its speed, from the deployment's start when given (a
	// restarted process then carries on its time) or from now.
	from := time.Now()
	if *start != "" {
		var err error
		if from, err = time.Parse(time.RFC3339Nano, *start); err != nil {
			return fmt.Errorf("%w: --clock-start %q: want an RFC 3339 time, like 2026-03-02T10:00:00Z", errUsage, *start)
		}
	}
	clock, err := scaledclock.Since(*speed, from, nil)
	if err != nil {
		return fmt.Errorf("%w: --clock-speed %v: must be a number in (0, %d]", errUsage, *speed, scaledclock.MaxSpeed)
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
	d, err := daemon.New(cfg, daemon.Options{Logger: logger, Registerer: reg, Gatherer: reg, Clock: clock, Instance: *instance})
	if err != nil {
		return err
	}
	defer d.Close()
	logger.Info("basin daemon", "listen", cfg.Listen, "deployment", cfg.Deployment, "dry_run", cfg.DryRun, "data_dir", cfg.DataDir,
		"clock_speed", *speed, "store", cfg.Store.Enabled())
	return d.Run(ctx)
}
