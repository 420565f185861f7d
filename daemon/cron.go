package daemon

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/remediate/notify"
)

// cronLogger adapts slog to cron.Logger.
type cronLogger struct{ d *Daemon }

func (l cronLogger) Info(msg string, kv ...any) { l.d.log.Debug("cron: "+msg, kv...) }
func (l cronLogger) Error(err error, msg string, kv ...any) {
	l.d.log.Error("cron: "+msg, append(kv, "err", err)...)
}

// cronJob is one scheduled job.
type cronJob struct {
	name, spec string
	run        func()
}

// startCron schedules the daily summary and the knee re-estimation.
func (d *Daemon) startCron() (stop func(), err error) {
	return d.schedule([]cronJob{
		{"daily_summary", d.cfg.Cron.DailySummary, d.DailySummary},
		{"knee_reestimate", d.cfg.Cron.KneeReestimate, d.ReestimateKnee},
	})
}

// schedule runs jobs on robfig/cron (specs with seconds, UTC; "-" skips a job). The chain is
// SkipIfStillRunning then Recover: in the other order a job that panics once never releases
// Skip's token and is skipped forever (robfig/cron#366). The innermost wrapper counts runs and
// panics before Recover logs them.
func (d *Daemon) schedule(jobs []cronJob) (stop func(), err error) {
	l := cronLogger{d}
	c := cron.New(cron.WithSeconds(), cron.WithLocation(time.UTC), cron.WithLogger(l),
		cron.WithChain(cron.SkipIfStillRunning(l), cron.Recover(l)))
	for _, j := range jobs {
		if j.spec == "-" {
			continue
		}
		counted := func() {
			d.metrics.cronRuns.WithLabelValues(j.name).Inc()
			defer func() {
				if r := recover(); r != nil {
					d.metrics.cronPanics.WithLabelValues(j.name).Inc()
					panic(r) // to Recover, which logs it
				}
			}()
			j.run()
		}
		if _, err := c.AddFunc(j.spec, counted); err != nil {
			return nil, fmt.Errorf("cron.%s: %q: %w", j.name, j.spec, err)
		}
	}
	c.Start()
	return func() { <-c.Stop().Done() }, nil
}

// Summary is the period's summary since the last one.
func (d *Daemon) Summary(now time.Time) notify.Summary {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := notify.Summary{Deployment: d.cfg.Deployment, From: d.mu.summaryFrom, To: now, TimeInState: map[string]time.Duration{},
		Incidents: d.mu.incidents, Actions: map[string]int{}}
	for st, t := range maps.All(d.mu.timeInState) {
		s.TimeInState[string(st)] = t
	}
	for _, r := range d.audit.Records(0) {
		if r.At.Before(d.mu.summaryFrom) || r.At.After(now) {
			continue
		}
		if r.Phase == "done" || r.Phase == "dry_run" {
			s.Actions[r.Kind]++
		}
	}
	if d.cfg.DryRun {
		s.Notes = append(s.Notes, "dry run: actions were recorded, not taken")
	}
	return s
}

// DailySummary posts the summary to Slack and starts a new period.
func (d *Daemon) DailySummary() {
	now := d.clock.Now()
	if _, acting := d.actingTerm(); !acting {
		return // the acting daemon posts it; the standby's period runs on
	}
	s := d.Summary(now)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.slack.PostSummary(ctx, s); err != nil {
		d.log.Warn("daily summary", "err", err)
	}
	d.mu.Lock()
	d.mu.summaryFrom, d.mu.incidents = now, 0
	d.mu.timeInState = map[detector.State]time.Duration{}
	d.mu.Unlock()
}

// ReestimateKnee fits the knee on the (W/C, hit rate) points the detector has learnt (outside
// trapped and recovering) and, when the fit found a drop and differs from the calibration file's
// by more than 0.05, writes the new knee and plateau back to the file and hands them to the
// detector. Without a calibration file there is nothing to write: the detector judges by what it
// learns all along.
func (d *Daemon) ReestimateKnee() {
	if d.cal == nil || d.cfg.Calibration == "" {
		return
	}
	pts := d.det.LearntPoints() // whole steps' worth: the detector learns under its lock
	k, err := detector.FitKnee(pts)
	if err != nil || k.BeyondRange {
		d.log.Info("knee re-estimation: not enough of the curve seen yet", "err", err)
		return
	}
	d.adoptKnee(k)
}

// adoptKnee writes a re-estimated knee that moved by 0.05 or more to the calibration file and
// hands it to the running detector, so the next step judges pressure, drift and B_ref by it.
func (d *Daemon) adoptKnee(k detector.Knee) {
	if diff := k.Ratio - d.cal.KneeRatio; diff < 0.05 && diff > -0.05 {
		return
	}
	c := *d.cal
	c.KneeRatio, c.PlateauHit = k.Ratio, k.PlateauHit
	c.Created = d.clock.Now()
	c.Source = fmt.Sprintf("%s; knee re-estimated passively by basin daemon (was %.2f)", d.cal.Source, d.cal.KneeRatio)
	if err := c.Validate(); err != nil {
		d.log.Warn("knee re-estimation", "err", err)
		return
	}
	if err := c.Save(d.cfg.Calibration); err != nil {
		d.log.Warn("knee re-estimation", "err", err)
		return
	}
	if err := d.det.Recalibrate(&c); err != nil {
		d.log.Warn("knee re-estimation: saved but not applied until a restart", "err", err)
	} else {
		d.log.Info("knee re-estimated", "from", d.cal.KneeRatio, "to", k.Ratio, "file", d.cfg.Calibration)
	}
	d.cal = &c
}
