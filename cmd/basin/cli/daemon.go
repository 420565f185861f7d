package cli

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/daemon"
	"github.com/basin-dev/basin/internal/scaledclock"
)

// runDaemon runs basin's collector, detector and remediation loop until interrupted.
func runDaemon(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env)
	cfgPath := fs.String("config", "", "daemon config file (YAML; see examples/daemon.yaml)")
	dryRun := fs.Bool("dry-run", false, "decide, audit and notify, but take no action (overrides the file's dry_run)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	speed := fs.Float64("clock-speed", 0, "the deployment's seconds per wall second (default: the speed its engines announce as basin_sim_speed, 1 for real engines); "+
		"an override that disagrees with the announced speed is an error")
	start := fs.String("clock-start", "", "on a deployment faster than real time: when it started (RFC 3339), so that a restarted daemon keeps its time (default: now)")
	instance := fs.String("instance", "", "with a store (store.url): this daemon's name in the lease and its status, over the file's instance key (default: host name and pid)")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	if *cfgPath == "" {
		return fmt.Errorf("%w: --config is required", errUsage)
	}
	speedSet := given(fs, "clock-speed")
	if speedSet && (!(*speed > 0 && *speed <= scaledclock.MaxSpeed) || math.IsInf(*speed, 0)) {
		return fmt.Errorf("%w: --clock-speed %v: must be a number in (0, %d]", errUsage, *speed, scaledclock.MaxSpeed)
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
	probe, err := daemon.AnnouncedSpeed(ctx, cfg, nil)
	if err != nil {
		return fmt.Errorf("reading the deployment's speed: %w", err)
	}
	s, err := deploymentSpeed(probe, *speed, speedSet, logger)
	if err != nil {
		return err
	}
	clock, err := scaledclock.Since(s, from, nil)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	d, err := daemon.New(cfg, daemon.Options{Logger: logger, Registerer: reg, Gatherer: reg, Clock: clock, Instance: *instance})
	if err != nil {
		return err
	}
	defer d.Close()
	logger.Info("basin daemon", "listen", cfg.Listen, "deployment", cfg.Deployment, "dry_run", cfg.DryRun, "data_dir", cfg.DataDir,
		"clock_speed", s, "store", cfg.Store.Enabled())
	return d.Run(ctx)
}

// given reports whether the command line gave the flag.
func given(fs *flagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// deploymentSpeed is the speed a reader of a deployment runs its clock at: the one its engines
// announce (collector.SpeedMetric), or override when given (override set). An override that
// disagrees with an announced speed is an error: one of the two is wrong, and every rate would
// be off by their ratio. Without an announcement the override stands (engines that announce
// nothing run in real time, which is said), and without either the speed is 1.
func deploymentSpeed(probe collector.AnnouncedSpeed, override float64, set bool, log *slog.Logger) (float64, error) {
	announced := len(probe.Announced) > 0
	switch {
	case announced && set && math.Abs(override-probe.Speed) > 1e-9*probe.Speed:
		return 0, fmt.Errorf("%w: --clock-speed %v, but the deployment announces %s %v (%s): drop the flag or make them agree",
			errUsage, override, collector.SpeedMetric, probe.Speed, strings.Join(probe.Announced, ", "))
	case announced:
		if probe.Speed != 1 {
			log.Info("the deployment announces its speed: watching it in its own time", "speed", probe.Speed,
				"metric", collector.SpeedMetric, "targets", probe.Announced)
		}
		return probe.Speed, nil
	case set:
		if probe.Answered > 0 && override != 1 {
			log.Warn("the engines announce no speed (real engines run in real time); running at --clock-speed as told",
				"clock_speed", override, "metric", collector.SpeedMetric)
		}
		return override, nil
	}
	if probe.Engines > 0 && probe.Answered == 0 {
		log.Warn("no engine answered: watching the deployment in real time; a simulated deployment that announces another speed "+
			"is refused (its scrapes fail, reason sim_speed) until the daemon is restarted", "metric", collector.SpeedMetric)
	}
	return 1, nil
}
