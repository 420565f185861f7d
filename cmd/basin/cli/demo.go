package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/basin-dev/basin/internal/progress"
	"github.com/basin-dev/basin/lab/demo"
	"github.com/basin-dev/basin/sim/scenario"
)

// runDemo plays a spike scenario on three simulated deployments at once — without the spike,
// with it and basin in dry run, with it and basin acting — each behind a real gateway and (two of
// them) a real daemon on loopback, and prints what the daemons did and a side-by-side table.
func runDemo(ctx context.Context, env Env, args []string) error {
	fs := newFlags(env)
	scName := fs.String("scenario", envOr(env, "BASIN_DEMO_SCENARIO", demo.DefaultScenario),
		"spike scenario (file or preset); env BASIN_DEMO_SCENARIO")
	speedDef, err := envFloat(env, "BASIN_DEMO_SPEED", demo.DefaultSpeed)
	if err != nil {
		return err
	}
	speed := fs.Float64("speed", speedDef, "virtual seconds per wall second; env BASIN_DEMO_SPEED")
	keep := fs.String("dir", env.Getenv("BASIN_DEMO_DIR"),
		"keep the runs' config files, calibration, audit logs and state here (default: a temporary directory, removed); env BASIN_DEMO_DIR")
	level := fs.String("log-level", envOr(env, "BASIN_DEMO_LOG_LEVEL", "error"),
		"the components' log level: debug, info, warn or error; env BASIN_DEMO_LOG_LEVEL")
	if err := parse(fs, args, 0); err != nil {
		return err
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("%w: --log-level: %v", errUsage, err)
	}
	sc, err := scenario.Load(*scName)
	if err != nil {
		return err
	}
	if !sc.HasSpikes() {
		return fmt.Errorf("%w: scenario %s has no spike to compare", errUsage, sc.Name)
	}
	if !(*speed > 0) {
		return fmt.Errorf("%w: --speed: must be > 0, got %v", errUsage, *speed)
	}
	dir := *keep
	if dir == "" {
		if dir, err = os.MkdirTemp("", "basin-demo-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}

	out := env.Stdout
	wall := time.Duration(float64(sc.Duration) / *speed)
	fmt.Fprintf(out, "basin demo: %s — the %s deployment, %g agent sessions/min, %s\n", sc.Name, sc.Deployment.Preset,
		sc.Arrivals.RatePerMin, spikeMinutes(sc))
	fmt.Fprintf(out, "%g minutes of traffic at %g× (%v of wall time); three runs side by side on loopback, each a\n"+
		"simulated deployment behind a basin gateway:\n", time.Duration(sc.Duration).Minutes(), *speed, wall.Round(time.Second))
	b := progress.New(env.Stderr, fmt.Sprintf("playing %v", time.Duration(sc.Duration)), time.Now, 0)
	onEvent := func(e demo.Event) {
		b.Clear()
		switch e.Kind {
		case demo.EventStarted:
			what := map[string]string{
				demo.NoSpike: "the same sessions without the spike (the reference)",
				demo.DryRun:  "the spike; the daemon watches (dry run)",
				demo.Acting:  "the spike; the daemon acts: the gateway's session budget, KV lending on the decode pool",
			}[e.Run]
			fmt.Fprintf(out, "  %-9s %s\n", e.Run, what)
			if e.Text != "" {
				fmt.Fprintf(out, "  %-9s status page: %s\n", "", e.Text)
			}
		default:
			fmt.Fprintf(out, "  %5.1f min  %-8s %s\n", e.At.Minutes(), e.Run, e.Text)
		}
	}
	first := true
	res, err := demo.Run(ctx, demo.Options{
		Scenario: sc, Speed: *speed, Dir: dir,
		OnEvent: func(e demo.Event) {
			if e.Kind != demo.EventStarted && first {
				first = false
				b.Clear()
				fmt.Fprintln(out, "\nWhat the daemons saw and did (deployment minutes since the load began):")
			}
			onEvent(e)
		},
		Progress: b.Set,
		Logger:   slog.New(slog.NewTextHandler(env.Stderr, &slog.HandlerOptions{Level: lv})),
	})
	b.Done()
	if res != nil {
		fmt.Fprintln(out)
		if ctx.Err() != nil {
			fmt.Fprintln(out, "Interrupted: what was measured until then.")
		}
		demo.Write(out, res)
		if *keep != "" {
			fmt.Fprintf(out, "The runs' configs, calibration, audit logs and state are in %s.\n", dir)
		}
		fmt.Fprintf(out, "Took %v.\n", res.Elapsed.Round(time.Second))
	}
	return err
}

// spikeMinutes describes the scenario's spikes in minutes: "arrivals ×2 in minutes 15–25".
func spikeMinutes(sc *scenario.Scenario) string {
	var parts []string
	for _, sp := range sc.Arrivals.Spikes {
		parts = append(parts, fmt.Sprintf("arrivals ×%g in minutes %g–%g", sp.Multiplier,
			time.Duration(sp.From).Minutes(), time.Duration(sp.To).Minutes()))
	}
	for _, ex := range sc.Arrivals.Extra {
		parts = append(parts, fmt.Sprintf("+%g %s sessions/min in minutes %g–%g", ex.RatePerMin, ex.Workload,
			time.Duration(ex.From).Minutes(), time.Duration(ex.To).Minutes()))
	}
	return strings.Join(parts, ", ")
}

func envOr(env Env, key, def string) string {
	if v := env.Getenv(key); v != "" {
		return v
	}
	return def
}

func envFloat(env Env, key string, def float64) (float64, error) {
	v := env.Getenv(key)
	if v == "" {
		return def, nil
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %q is not a number", errUsage, key, v)
	}
	return f, nil
}
