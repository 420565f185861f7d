// Package daemon is `basin daemon`: the collector, the detector and the remediation loop run
// against a live deployment, with the audit log and state in a data directory, the Alertmanager
// webhook, Slack, cron jobs and the HTTP API. It wires packages; the decisions are theirs
// (detector.Detector, remediate.Policy, lender.Lender), the same code the simulator's harness runs.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/client"
	"github.com/basin-dev/basin/internal/atomicfile"
	"github.com/basin-dev/basin/internal/ratelog"
	"github.com/basin-dev/basin/internal/secret"
	"github.com/basin-dev/basin/lender"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/remediate/alerts"
	"github.com/basin-dev/basin/remediate/notify"
	"github.com/basin-dev/basin/scaler"
)

// GatewayAPI is what the daemon needs of the gateway's admin API (gateway/client implements it):
// the admission contract the executor acts through, and the affinity switch the lending backend
// flips.
type GatewayAPI interface {
	remediate.Admission
	SetAffinity(ctx context.Context, enabled bool, reason string) error
}

// Clock is the daemon's one time base: every timestamp (the collector's scrapes, the detector's
// holds, the policy's steps, the audit log, pauses, the state file, the history, the API and the
// alerts it receives) is read from it, and rates are per second of it. Against real engines it is
// the wall clock; a simulated deployment served S times faster than real time (`basin demo`,
// tests) is watched on its own clock, internal/scaledclock, so that thresholds keep their meaning
// in the deployment's time without the daemon knowing of any speed.
type Clock interface {
	Now() time.Time
	// WallDuration is how long d of the clock's time lasts on the wall clock: the daemon's loop
	// waits on a real timer.
	WallDuration(d time.Duration) time.Duration
	// Wall is the wall clock's time: the Alertmanager webhook's alerts carry the sender's wall
	// times (startsAt, endsAt) and live for wall minutes, whatever the deployment's speed.
	Wall() time.Time
}

// wallClock is the wall clock, the daemon's clock unless Options.Clock is set.
type wallClock struct{}

func (wallClock) Now() time.Time                             { return time.Now() }
func (wallClock) WallDuration(d time.Duration) time.Duration { return d }
func (wallClock) Wall() time.Time                            { return time.Now() }

// Options are what New needs besides the configuration.
type Options struct {
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Gatherer serves /metrics (the registry Registerer writes to).
	Gatherer prometheus.Gatherer
	// Clock is the daemon's time (the wall clock when nil).
	Clock Clock
	// Gateway overrides the admin client built from the configuration (tests).
	Gateway GatewayAPI
	// HTTPClient scrapes and calls out (the collector's and the gateway client's own when nil).
	HTTPClient *http.Client
	// Instance names this daemon in the store's lease, over the configuration's instance key
	// (`basin daemon --instance`); only with a store.
	Instance string
}

// Daemon is one running basin daemon.
type Daemon struct {
	cfg *Config
	// loop serialises the loop's state (policy) between Step and the other goroutines that must
	// read or save it consistently (pause, cron).
	loop sync.Mutex

	closeOnce sync.Once
	closeErr  error
	// unlock releases the data directory's lock (see lockDataDir).
	unlock func() error
	log    *slog.Logger
	clock  Clock
	token  string

	col    *collector.Collector
	det    *detector.Detector
	pol    *remediate.Policy
	exec   *remediate.Executor
	audit  *remediate.Audit
	lend   *lender.Lender
	lendBE lender.Backend
	// scale asks for instances through scaleBE; both nil unless scaling is configured.
	scale   *scaler.Policy
	scaleBE scaler.Backend
	// rem is the remediation step the simulator's harness runs too: pol, lend (when lendBE is
	// set), scale and exec.
	rem   *remediate.Loop
	rcv   *alerts.Receiver
	slack *notify.Notifier
	gw    GatewayAPI
	// cal is the calibration the detector judges by; the cron job re-estimates its knee from what
	// the detector learnt (detector.LearntPoints).
	cal *detector.Calibration

	metrics *metrics
	gather  prometheus.Gatherer

	// ha is the daemon's campaign for the lease and its term (nil without a store: it acts).
	ha *ha
	// savedAt is when the policy state this daemon holds was saved (its own, or the one it
	// adopted on a takeover); a takeover adopts the shared state only when it is newer. The
	// loop's (under loop).
	savedAt time.Time

	// blindSince is when the daemon last began to be blind (zero while it sees), for the
	// handover of the lease (noteSight); the loop's (under loop).
	blindSince time.Time

	// gwLog rate-limits the log of an unreachable gateway admin API; Step owns it (under loop).
	gwLog failureLog
	// authFailures rate-limits the log of refused control-API calls.
	authFailures ratelog.Limiter
	// hist persists the status page's history; histLog rate-limits its write errors (Step's).
	hist    *historyFile
	histLog failureLog

	mu struct {
		sync.Mutex
		// last is the latest assessment, set as soon as the step makes it (the step's Slack
		// posts describe it); shown is the one the published policy state was decided on.
		last        detector.Assessment
		shown       detector.Assessment
		lastPlan    remediate.Plan
		gateway     *adminapi.StateView
		gatewayErr  string
		ready       bool
		stepErr     string
		timeInState map[detector.State]time.Duration
		incidents   int
		summaryFrom time.Time
		lastStep    time.Time
		history     []HistoryPoint
		// unseen is what the last step could not see (see unseenOf); empty when it saw everything.
		unseen []string
		// need is what the deployment needs in instances of each role as of the last step, needErr
		// why it could not be sized ("" when it was).
		need    scaler.Need
		needErr string
		// policy is the policy's state as of the last step. Readers on other goroutines (status,
		// metrics) take it with shown, never with last: between the assessment and the end of
		// the step they would pair a new assessment with the previous step's policy (on the
		// first step, an empty B_ref next to a complete assessment).
		policy remediate.PolicyState
	}
}

// statePath and auditPath are the daemon's files in the data directory.
func statePath(dir string) string { return filepath.Join(dir, "state.json") }
func auditPath(dir string) string { return filepath.Join(dir, "audit.jsonl") }

// persisted is the daemon's state file.
type persisted struct {
	Version int            `json:"version"`
	SavedAt time.Time      `json:"saved_at"`
	State   detector.State `json:"detector_state"`
	Since   time.Time      `json:"detector_since"`
	// DryRun is whether the daemon that saved the file only recorded what it would do: then the
	// policy's target and mode and the lending switch are decisions never applied, and a daemon
	// that acts must not take them for the gateway's state (see restore).
	DryRun bool                  `json:"dry_run,omitempty"`
	Policy remediate.PolicyState `json:"policy"`
	// PolicyAt is when the policy's state was last saved by a daemon that acted on it; a
	// standby's saves keep it (with a store, a takeover adopts the shared state only when its
	// PolicyAt is newer than the daemon's own).
	PolicyAt    time.Time    `json:"policy_saved_at,omitzero"`
	Lending     bool         `json:"lending_enabled"`
	LendingAt   time.Time    `json:"lending_since"`
	Alerts      alerts.State `json:"alerts"`
	PausedUntil time.Time    `json:"paused_until,omitzero"`
	PauseReason string       `json:"pause_reason,omitempty"`
	// Scaling is the scaling policy's state per role: what it last asked and when.
	Scaling map[scaler.Role]scaler.RoleState `json:"scaling,omitempty"`
}

const stateVersion = 1

// CollectorDefaults are collector.timeout and collector.window when unset, for a loop interval,
// derived as the collector derives its own: a scrape times out within one interval, and a rate
// window holds at least two scrapes.
func CollectorDefaults(interval time.Duration) (timeout, window time.Duration) {
	return min(collector.DefaultTimeout, interval), max(collector.DefaultWindow, 2*interval)
}

// New builds the daemon from a validated configuration: it reads the secrets, the calibration,
// the audit log and the state, and fails on anything it cannot use rather than start half-blind.
func New(cfg *Config, o Options) (*Daemon, error) {
	d := &Daemon{cfg: cfg, log: o.Logger, clock: o.Clock, gather: o.Gatherer}
	reg := d.fillDefaults(o.Registerer)
	if err := d.readFiles(); err != nil {
		return nil, err
	}
	if err := d.newObserver(o.HTTPClient, reg); err != nil {
		return nil, err
	}
	var err error
	if d.pol, err = remediate.NewPolicy(cfg.Remediate); err != nil {
		return nil, err
	}
	if d.gw, err = newGateway(cfg.Gateway, o.Gateway, o.HTTPClient); err != nil {
		return nil, err
	}
	if err := d.joinStore(o.Instance, reg); err != nil {
		return nil, err
	}
	if err := d.newScaling(); err != nil {
		return nil, err
	}
	if err := d.newLending(); err != nil {
		return nil, err
	}
	if err := d.newOutlets(reg); err != nil {
		return nil, err
	}
	// Everything the configuration names has been read and checked: only now is anything created,
	// so a configuration that does not validate leaves no data directory or lock behind.
	if err := d.openDataDir(reg); err != nil {
		return nil, err
	}
	return d, nil
}

// fillDefaults gives the daemon what its caller may leave out — a logger that discards, the wall
// clock, a registry of its own that it also gathers — so that an embedder or a test passes only
// what it cares about. It returns the registerer to register on.
func (d *Daemon) fillDefaults(reg prometheus.Registerer) prometheus.Registerer {
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.clock == nil {
		d.clock = wallClock{}
	}
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, d.gather = r, r
	}
	return reg
}

// readFiles reads the files the configuration names besides the targets: the control API's token
// (without one the API would be open), the web configuration (checked here so that a typo fails
// at start, not at the first request) and the calibration, whose absence is said with the way to
// fix it rather than taken as a reason to guess the knee.
func (d *Daemon) readFiles() error {
	cfg := d.cfg
	var err error
	if d.token, err = secret.FileOrEnv(cfg.TokenFile, TokenEnv, os.Getenv); err != nil {
		return fmt.Errorf("token_file: %w", err)
	}
	if d.token == "" {
		return fmt.Errorf("token_file: no control API token (set token_file or %s)", TokenEnv)
	}
	if f := cfg.WebConfigFile; f != "" {
		if err := web.Validate(f); err != nil {
			return fmt.Errorf("web_config_file %s: %w", f, err)
		}
	}
	if cfg.Calibration != "" {
		if d.cal, err = detector.LoadCalibration(cfg.Calibration); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				// Named but absent: not a reason to guess the knee quietly, but say what to do.
				return fmt.Errorf("calibration: %w (write it with `basin calibrate -o %s`, "+
					"or remove the key to learn the knee passively)", err, cfg.Calibration)
			}
			return fmt.Errorf("calibration: %w", err)
		}
	}
	return nil
}

// newObserver builds what the daemon sees with: the collector, told what the detector needs so
// that a target that cannot provide it is named at start, and the detector.
func (d *Daemon) newObserver(hc *http.Client, reg prometheus.Registerer) error {
	cfg := d.cfg
	// The collector reads its counters against the daemon's clock, so rates are per second of it;
	// a zero timeout or window is derived from the interval by the collector (CollectorDefaults).
	var err error
	d.col, err = collector.New(collector.Options{Targets: cfg.Collector.Targets, TargetFile: cfg.Collector.TargetFile,
		Interval: time.Duration(cfg.Interval), Timeout: time.Duration(cfg.Collector.Timeout), Window: time.Duration(cfg.Collector.Window),
		HTTPClient: hc, Logger: d.log.With("component", "collector"), Registerer: reg,
		Now: d.clock.Now, WallDuration: d.clock.WallDuration})
	if err != nil {
		return err // the collector's errors name it
	}
	if err := d.col.Declare("detector", detector.Needs()...); err != nil {
		return fmt.Errorf("collector: %w", err)
	}
	// Said once at start, before the first step: a signal no configured target can provide
	// shows otherwise only as a detector that stays blind, with no hint of which target is missing.
	for _, p := range d.col.Check() {
		d.log.Warn("collector: the configured targets cannot provide a signal the detector needs", "problem", p.String())
	}
	d.det, err = detector.New(detector.Options{Calibration: d.cal, OverloadHold: time.Duration(cfg.Detector.OverloadHold)})
	return err
}

// newGateway is the gateway's admin API the daemon acts through: the one the caller gave (a test's
// fake, an embedder's), else a client of gateway.admin_url, else none (the daemon then watches
// and decides, and acts on nothing that needs the gateway).
func newGateway(cfg GatewayConfig, given GatewayAPI, hc *http.Client) (GatewayAPI, error) {
	if given != nil || cfg.AdminURL == "" {
		return given, nil
	}
	tok, err := secret.FileOrEnv(cfg.TokenFile, GatewayTokenEnv, os.Getenv)
	if err != nil {
		return nil, fmt.Errorf("gateway.token_file: %w", err)
	}
	// Shedding takes one session at a time: the queue's tail is enough, whatever its length.
	c, err := client.New(client.Options{BaseURL: cfg.AdminURL, Token: tok, HTTPClient: hc, QueueTail: 16})
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	return c, nil
}

// joinStore enters the campaign for the store's lease when there is a store, and makes every write
// to the gateway carry the step's term so that a 409 for a stale one ends it. An instance name
// without a store names nothing and is refused rather than ignored.
func (d *Daemon) joinStore(instance string, reg prometheus.Registerer) error {
	if !d.cfg.Store.Enabled() {
		if instance != "" {
			return errors.New("instance: needs store.url: it names this daemon in the store's lease")
		}
		return nil
	}
	if err := d.newHA(instance, reg); err != nil {
		return err
	}
	if d.gw != nil {
		d.gw = termGateway{GatewayAPI: d.gw, d: d}
	}
	return nil
}

// newLending builds the lender and, when one is configured, the backend that applies its switch;
// the affinity backend switches the gateway's affinity, so it needs a gateway.
func (d *Daemon) newLending() error {
	cfg := d.cfg.Lending
	var err error
	if d.lend, err = lender.New(lender.Options{MaxFraction: cfg.MaxFraction, MinDwell: time.Duration(cfg.MinDwell)}); err != nil {
		return fmt.Errorf("lending: %w", err)
	}
	be := cfg.Backend
	if be.Kind == "" {
		return nil
	}
	var wire lender.Wiring
	if be.Kind == lender.KindAffinity {
		if d.gw == nil {
			return errors.New("lending.backend: affinity needs gateway.admin_url")
		}
		wire.Affinity = d.gw
	}
	if d.lendBE, err = lender.NewBackend(be, wire); err != nil {
		return fmt.Errorf("lending.backend: %w", err)
	}
	return nil
}

// newScaling builds the scaling policy and its backend when one is configured.
func (d *Daemon) newScaling() error {
	cfg := d.cfg.Scaling
	if !cfg.Enabled() {
		return nil
	}
	var err error
	if d.scale, err = scaler.New(cfg.Options(d.cfg.Capacity.Need())); err != nil {
		return fmt.Errorf("scaling: %w", err)
	}
	if d.scaleBE, err = scaler.NewBackend(cfg.Backend, scaler.Wiring{}); err != nil {
		return fmt.Errorf("scaling.backend: %w", err)
	}
	return nil
}

// openDataDir creates and locks the data directory, opens the audit log and the history in it,
// builds what acts (metrics, executor, remediation loop) and restores the state saved there. On
// failure it releases the lock and the store's client it holds, so that a New that failed leaves
// the directory to the next one.
func (d *Daemon) openDataDir(reg prometheus.Registerer) (err error) {
	if err := os.MkdirAll(d.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data_dir: %w", err)
	}
	if d.unlock, err = lockDataDir(d.cfg.DataDir); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = d.unlock()
			if d.ha != nil {
				_ = d.ha.client.Close()
			}
		}
	}()
	if err := d.openLogs(); err != nil {
		return err
	}
	defer func() {
		if err != nil { // New failed after opening the logs
			_ = d.hist.close()
			_ = d.audit.Close()
		}
	}()
	if err := d.newActing(reg); err != nil {
		return err
	}
	d.initLoop()
	return d.restore()
}

// openLogs opens the audit log and the status page's history, saying what either had to skip; a
// history that fails closes the audit log again.
func (d *Daemon) openLogs() error {
	audit, warn, err := d.openAudit()
	if err != nil {
		return err
	}
	if warn != "" {
		d.log.Warn(warn)
	}
	hist, pts, warn, err := openHistory(historyPath(d.cfg.DataDir))
	if err != nil {
		_ = audit.Close()
		return err
	}
	if warn != "" {
		d.log.Warn(warn)
	}
	d.audit, d.hist, d.mu.history = audit, hist, pts
	return nil
}

// newActing registers the daemon's metrics and builds the executor, wired to the gateway and the
// lending backend there are, and the remediation loop: lending is decided only when there is a
// backend to apply it.
func (d *Daemon) newActing(reg prometheus.Registerer) error {
	d.metrics = newMetrics(d)
	if err := reg.Register(d.metrics); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	ex := remediate.ExecutorOptions{Audit: d.audit, DryRun: d.cfg.DryRun, Notify: d.notifyAction, Registerer: reg,
		Logger: d.log.With("component", "executor")}
	if d.gw != nil {
		ex.Gateway = d.gw
	}
	if d.lendBE != nil {
		ex.Lending = remediate.BackendLending{Backend: d.lendBE}
		if d.ha != nil {
			ex.Lending = termLending{Lending: ex.Lending, d: d}
		}
	}
	if d.scaleBE != nil {
		ex.Scaling = remediate.BackendScaling{Backend: d.scaleBE, Deployment: d.cfg.Deployment}
		if d.ha != nil {
			ex.Scaling = termScaling{Scaling: ex.Scaling, d: d}
		}
	}
	var err error
	if d.exec, err = remediate.NewExecutor(ex); err != nil {
		return err
	}
	var lend *lender.Lender
	if d.lendBE != nil {
		lend = d.lend
	}
	if d.rem, err = remediate.NewLoop(d.pol, lend, d.exec); err != nil {
		return err
	}
	d.rem.Scaler = d.scale
	return nil
}

// initLoop sets the loop's starting bookkeeping: the rate limits of its logs, and a summary
// period that starts now with no time in any state.
func (d *Daemon) initLoop() {
	d.authFailures.Every = authLogEvery
	d.gwLog = failureLog{down: "unreachable; basin is blind to it and takes no action that needs it"}
	d.histLog = failureLog{down: "not written; the status page's history will miss these steps after a restart"}
	d.mu.timeInState = map[detector.State]time.Duration{}
	d.mu.summaryFrom = d.clock.Now()
}

// openAudit opens audit.jsonl in the data directory: the audit log itself, or with a store the
// local copy of the shared stream P:daemon:audit, which is what a takeover reconciles.
func (d *Daemon) openAudit() (*remediate.Audit, string, error) {
	if d.ha == nil {
		return remediate.OpenAudit(auditPath(d.cfg.DataDir))
	}
	f, recs, warn, err := remediate.OpenAuditFile(auditPath(d.cfg.DataDir))
	if err != nil {
		return nil, "", err
	}
	a, err := remediate.NewAudit(remediate.AuditOptions{Store: auditStream{d: d, key: d.cfg.Store.Prefix + ":daemon:audit"},
		Records: recs, Copy: f, OnCopyError: func(err error) {
			d.log.Error("the local copy of the audit missed a record the shared stream has", "err", err)
		}})
	if err != nil {
		_ = f.Close()
		return nil, "", err
	}
	return a, warn, nil
}

// newOutlets builds the webhook receiver and the Slack notifier.
func (d *Daemon) newOutlets(reg prometheus.Registerer) error {
	cfg := d.cfg
	// The receiver keeps wall time whatever the deployment's speed: Alertmanager's startsAt and
	// endsAt are its wall clock's, and an alert's lifetime without endsAt (alerts.DefaultMaxAge)
	// is measured against the route's repeat_interval, also wall time. On the deployment's clock
	// at 60× an alert expired 10 s after it fired.
	ao := alerts.Options{Matchers: cfg.Alerts.Matchers, Token: d.token, Logger: d.log.With("component", "alerts"),
		Registerer: reg, Now: d.clock.Wall, OnChange: func(in alerts.Incident) {
			d.log.Info("alert incident", "active", in.Active, "alerts", len(in.Alerts))
		}}
	if cfg.Alerts.BasicUser != "" {
		pw, err := secret.FileOrEnv(cfg.Alerts.BasicPasswordFile, "", os.Getenv)
		if err != nil || pw == "" {
			if err == nil {
				err = errors.New("empty")
			}
			return fmt.Errorf("alerts.basic_password_file: required with basic_user: %w", err)
		}
		ao.BasicUser, ao.BasicPassword = cfg.Alerts.BasicUser, pw
	}
	var err error
	if d.rcv, err = alerts.New(ao); err != nil {
		return fmt.Errorf("alerts: %w", err)
	}
	s := cfg.Slack
	var tok, hook string
	if s.BotTokenFile != "" || s.Channel != "" {
		if tok, err = secret.FileOrEnv(s.BotTokenFile, SlackTokenEnv, os.Getenv); err != nil {
			return fmt.Errorf("slack.bot_token_file: %w", err)
		}
	}
	if s.WebhookURLFile != "" {
		if hook, err = secret.FileOrEnv(s.WebhookURLFile, SlackWebhookEnv, os.Getenv); err != nil {
			return fmt.Errorf("slack.webhook_url_file: %w", err)
		}
	} else if tok == "" {
		hook = os.Getenv(SlackWebhookEnv)
	}
	if tok == "" && hook == "" {
		return nil // no Slack: a nil notifier ignores events
	}
	d.slack, err = notify.New(notify.Options{BotToken: tok, Channel: s.Channel, WebhookURL: hook, APIURL: s.APIURL,
		DashboardURL: s.DashboardURL, StatusURL: s.StatusURL, Logger: d.log.With("component", "slack"), Registerer: reg, Now: d.clock.Now})
	if err != nil {
		return fmt.Errorf("slack: %w", err)
	}
	return nil
}

// restore resumes the persisted state, if any. An unreadable state file is an error: starting
// fresh mid-incident would loosen a budget the incident needs.
func (d *Daemon) restore() error {
	b, err := os.ReadFile(statePath(d.cfg.DataDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	var p persisted
	if err := json.Unmarshal(b, &p); err != nil {
		return fmt.Errorf("state file %s: %w (move it aside to start afresh)", statePath(d.cfg.DataDir), err)
	}
	if p.Version != stateVersion {
		return fmt.Errorf("state file %s: version %d, want %d", statePath(d.cfg.DataDir), p.Version, stateVersion)
	}
	if p.State != "" {
		if err := d.det.Resume(p.State, p.Since); err != nil {
			return fmt.Errorf("state file: %w", err)
		}
		d.mu.Lock()
		d.mu.last = detector.Assessment{State: p.State, Since: p.Since}
		d.mu.shown = d.mu.last
		d.mu.Unlock()
	}
	ps, lending, lendingAt, scaling := p.Policy, p.Lending, p.LendingAt, p.Scaling
	if p.DryRun && !d.cfg.DryRun {
		// What a dry run decided was never applied: the gateway still has its own budget and
		// lending switch. Keep the observations (the arrival rate, the plan numbers) and drop the
		// decisions, so the first step takes the gateway's budget as it is and the lender switches
		// for real instead of believing it already did.
		ps = remediate.PolicyState{Mode: remediate.Normal, Seq: ps.Seq, ArrivalEWMA: ps.ArrivalEWMA, ArrivalAt: ps.ArrivalAt}
		lending, lendingAt, scaling = false, time.Time{}, nil
		d.log.Info("dry run ended: the dry run's budget, mode and lending decisions were never applied; "+
			"starting from what the gateway has", "dry_run_target_tokens", p.Policy.Target, "dry_run_mode", p.Policy.Mode,
			"dry_run_lending", p.Lending)
	}
	if err := d.pol.Restore(ps); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	d.pol.Replay(d.audit.Records(0))
	d.publishPolicy()
	d.lend.Restore(lending, lendingAt)
	if d.scale != nil {
		d.scale.Restore(scaling)
	}
	if err := d.rcv.Restore(p.Alerts); err != nil {
		return fmt.Errorf("state file: alerts: %w", err)
	}
	// With a store the daemon starts standby: a pause is the acting daemon's, and comes with the
	// shared state on a takeover.
	if now := d.clock.Now(); p.PausedUntil.After(now) && d.ha == nil {
		if err := d.exec.Pause(now, p.PausedUntil, p.PauseReason+" (resumed after a restart)"); err != nil {
			return err
		}
	}
	d.savedAt = p.PolicyAt
	d.log.Info("state restored", "detector", p.State, "since", p.Since, "mode", p.Policy.Mode, "target_tokens", p.Policy.Target)
	return nil
}

// save writes the state atomically.
func (d *Daemon) save() error {
	last, ok := d.det.Last()
	if !ok { // not stepped since a restart: the resumed state
		d.mu.Lock()
		last = d.mu.last
		d.mu.Unlock()
	}
	enabled, since := d.lend.State()
	now := d.clock.Now()
	_, until, why := d.exec.Paused(now)
	if _, acting := d.actingTerm(); acting {
		d.savedAt = now
	}
	p := persisted{Version: stateVersion, SavedAt: now, PolicyAt: d.savedAt, DryRun: d.cfg.DryRun, State: last.State, Since: last.Since, Policy: d.pol.State(),
		Lending: enabled, LendingAt: since, Alerts: d.rcv.State(), PausedUntil: until, PauseReason: why}
	if d.scale != nil {
		p.Scaling = d.scale.State()
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(statePath(d.cfg.DataDir), append(b, '\n'), 0o600); err != nil {
		return err
	}
	return d.saveShared(b)
}

// Run serves the API and runs the loop until ctx ends. Before the first step it reconciles the
// actions a previous run may have left half done.
func (d *Daemon) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	return d.Serve(ctx, ln)
}

// Serve is Run on a listener the caller opened (tests pick a free port).
func (d *Daemon) Serve(ctx context.Context, ln net.Listener) error {
	if f := d.cfg.WebConfigFile; f != "" {
		if err := web.Validate(f); err != nil {
			return fmt.Errorf("web_config_file %s: %w", f, err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = d.col.Run(ctx) })
	wg.Go(func() { _ = d.rcv.Run(ctx) })
	if d.slack != nil {
		wg.Go(func() { _ = d.slack.Run(ctx) })
	}
	var kick chan struct{}
	if d.ha != nil {
		kick = d.ha.kick
		wg.Go(func() { d.campaign(ctx, d.ha.renewInterval) })
	}
	stopCron, err := d.startCron()
	if err != nil {
		return err
	}
	defer stopCron()
	srvErr := make(chan error, 1)
	wg.Go(func() {
		systemd, file := false, d.cfg.WebConfigFile
		flags := &web.FlagConfig{WebListenAddresses: &[]string{}, WebSystemdSocket: &systemd, WebConfigFile: &file}
		if err := web.Serve(ln, srv, flags, d.log.With("component", "web")); err != nil && !errors.Is(err, http.ErrServerClosed) {
			srvErr <- err
		}
	})
	if d.ha == nil {
		// With a store the daemon starts standby; it reconciles when it takes over.
		d.loop.Lock()
		d.reconcile(ctx)
		d.loop.Unlock()
	}
	t := time.NewTicker(d.clock.WallDuration(time.Duration(d.cfg.Interval)))
	defer t.Stop()
	var loopErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-srvErr:
			loopErr = fmt.Errorf("serve: %w", err)
			break loop
		case <-t.C:
			d.Step(ctx)
		case <-kick:
			d.loop.Lock()
			d.takeOver(ctx)
			d.loop.Unlock()
		}
	}
	shut, c := context.WithTimeout(context.Background(), 5*time.Second)
	defer c()
	// Shutdown leaves a connection that never sent a request (a client's cancelled dial) open
	// until it is five seconds old; Close ends what it left, so nothing outlives Serve.
	if srv.Shutdown(shut) != nil {
		_ = srv.Close()
	}
	cancel()
	wg.Wait()
	if err := d.save(); err != nil {
		d.log.Error("saving state at exit", "err", err)
	}
	return errors.Join(loopErr, d.Close())
}

// Close releases the audit log and the data directory's lock. Serve closes it on return; a daemon
// built with New and never served must be closed by its owner.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() {
		d.closeErr = errors.Join(d.audit.Close(), d.hist.close(), d.unlock())
		if d.ha != nil {
			d.closeErr = errors.Join(d.closeErr, d.ha.client.Close())
		}
	})
	return d.closeErr
}

// reconcile finishes what a crash interrupted, reading the gateway's actual budget and queue.
func (d *Daemon) reconcile(ctx context.Context) {
	if len(d.audit.Pending()) == 0 {
		return
	}
	obs := remediate.Observed{}
	if d.gw != nil {
		if st, err := d.gw.State(ctx); err == nil {
			obs.Budget, obs.BudgetOK = st.Budget, true
			queued := map[string]bool{}
			for _, q := range st.Queue {
				queued[q.ID] = true
			}
			obs.Queued = func(id string) bool { return queued[id] }
		}
	}
	if err := d.exec.Reconcile(ctx, d.clock.Now(), obs); err != nil {
		d.log.Warn("reconciling after a restart", "err", err)
	}
	// What reconciliation finished is the policy's state now, whatever the state file said.
	d.pol.Replay(d.audit.Records(0))
	d.publishPolicy()
	if err := d.save(); err != nil {
		d.log.Error("saving state after reconciling", "err", err)
	}
}

// publishPolicy copies the policy's state for readers on other goroutines (status, metrics).
func (d *Daemon) publishPolicy() {
	st := d.pol.State()
	d.mu.Lock()
	d.mu.policy = st
	d.mu.Unlock()
}

// decodeKept is the fewest decode instances the exported sizing counts lent cache from
// (scaler.NeedInputs.DecodeKept): basin's own scaling's decode floor where it scales decode, as its
// policy sizes; else capacity.decode_floor. Sized on every decode instance serving while an
// autoscaler scales decode down to its need, the prefill need would rise as the lent KV went, and
// the two pools would trade instances back and forth.
func (d *Daemon) decodeKept() int {
	if d.scale != nil {
		if o := d.scale.Options(); slices.Contains(o.Roles, scaler.RoleDecode) {
			return o.Floor[scaler.RoleDecode]
		}
	}
	return d.cfg.Capacity.DecodeFloor
}

// Step is one pass of the loop: snapshot, assess, read the gateway, decide, act.
func (d *Daemon) Step(ctx context.Context) {
	d.loop.Lock()
	defer d.loop.Unlock()
	d.takeOver(ctx)
	term, acting := d.actingTerm()
	snap := d.col.SnapshotAt(d.clock.Now())
	now := snap.At
	a := d.det.Step(snap)
	// The need is a signal for autoscalers: sized every step, standby, paused or dry run alike.
	need, needErr := d.pol.SizeFrom(snap, a, d.cfg.Capacity.Need(), d.decodeKept())
	if tr := a.Transition; tr != nil && acting { // the standby watches too; one daemon posts
		d.log.Info("state", "from", tr.From, "to", tr.To, "reasons", tr.Reasons)
		d.slack.Notify(notify.Event{Kind: notify.KindTransition, At: tr.At, Deployment: d.cfg.Deployment,
			From: string(tr.From), To: string(tr.To), WorkingSetOverCache: a.WorkingSetOverCache, KneeRatio: a.Knee.Ratio,
			HitRate: a.HitRate, Plateau: a.Plateau, Reasons: tr.Reasons})
	}
	var view *adminapi.StateView
	var gwErr string
	if d.gw != nil {
		read := d.gw.State
		if d.mayHold(a, acting) {
			read = d.gw.StateSessions
		}
		st, err := read(ctx)
		if err != nil {
			gwErr = err.Error()
		} else {
			view = &st
		}
		d.gwLog.observe(d.log, now, "gateway admin API", err, "url", d.cfg.Gateway.AdminURL)
	}
	unseen := unseenOf(a, d.gw != nil, gwErr)
	if d.noteSight(ctx, now, unseen, term, acting) {
		term, acting = 0, false
	}
	d.mu.Lock()
	if !d.mu.lastStep.IsZero() {
		d.mu.timeInState[d.mu.last.State] += now.Sub(d.mu.lastStep)
	}
	d.mu.last, d.mu.gateway, d.mu.gatewayErr, d.mu.lastStep, d.mu.unseen = a, view, gwErr, now, unseen
	d.mu.need, d.mu.needErr = need, ""
	if needErr != nil {
		d.mu.need, d.mu.needErr = scaler.Need{}, needErr.Error()
	}
	var budget, reserved int64
	if view != nil {
		budget, reserved = view.Budget, view.Reserved
	}
	point := historyPoint(a, budget, reserved)
	d.recordLocked(point)
	d.mu.Unlock()
	err := d.hist.append(point, func() []HistoryPoint {
		d.mu.Lock()
		defer d.mu.Unlock()
		return append([]HistoryPoint(nil), d.mu.history...)
	})
	d.histLog.observe(d.log, d.clock.Now(), "history file", err, "path", d.hist.path)

	if !acting {
		// Standby: watching only, no plan; the detector's state is kept for a restart.
		errMsg := ""
		if err := d.save(); err != nil {
			errMsg = "saving state: " + err.Error()
		}
		d.finishStep(a, nil, errMsg)
		return
	}
	if d.ha != nil {
		ctx = client.WithTerm(ctx, term) // every write of this step carries its term
	}
	if paused, _, _ := d.exec.Paused(now); paused {
		// Observing only; the detector's state still moves and must survive a restart.
		errMsg := ""
		if err := d.save(); err != nil {
			errMsg = "saving state: " + err.Error()
		}
		d.finishStep(a, nil, errMsg)
		return
	}
	// Actions a crash (or a pause at start) left between intent and outcome are finished before
	// anything new is decided.
	if len(d.audit.Pending()) > 0 {
		d.reconcile(ctx)
	}
	in := remediate.StepInputs{Inputs: remediate.Inputs{At: now, Assessment: a, DryRun: d.cfg.DryRun}, Snapshot: snap}
	in.ArrivalRate, in.ArrivalOK = snap.Get(collector.ArrivalRate)
	if view != nil {
		in.GatewayOK = true
		in.Gateway = remediate.GatewayFrom(*view)
	}
	for _, al := range d.rcv.Incident().Alerts {
		in.Alerts = append(in.Alerts, al.Name)
	}
	if d.lendBE != nil {
		d.adoptAffinity(view) // the lender's switch must be the gateway's before it decides
		in.Decode = decodePool(snap)
	}
	res := d.rem.Step(ctx, in, d.save)
	if res.IncidentStarted {
		d.mu.Lock()
		d.mu.incidents++
		d.mu.Unlock()
	}
	var errMsg string
	if res.Err != nil {
		errMsg = res.Err.Error()
		if !res.Plan.Empty() {
			d.log.Warn("plan", "seq", res.Plan.Seq, "err", res.Err)
		}
	}
	d.finishStep(a, &res.Plan, errMsg)
}

// finishStep publishes the step: the assessment a and the policy state decided on it, together.
func (d *Daemon) finishStep(a detector.Assessment, plan *remediate.Plan, errMsg string) {
	st := d.pol.State()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.mu.shown, d.mu.policy = a, st
	if plan != nil && !plan.Empty() {
		d.mu.lastPlan = *plan
	}
	d.mu.stepErr = errMsg
	d.mu.ready = true
}

// adoptAffinity makes the lender's switch the gateway's affinity switch when the affinity backend
// is the lending switch and the daemon acts: the gateway is the truth. It differs after the gateway
// restarted with its configured affinity, after someone switched it by hand, and on the first step
// after a dry run (whose switch was never applied). Without this the lender would believe lending
// on while the gateway routes without affinity, and never switch it again. The dwell starts afresh:
// it guards against basin's own flapping, not against a change it did not make.
func (d *Daemon) adoptAffinity(view *adminapi.StateView) {
	if d.cfg.DryRun || view == nil || d.cfg.Lending.Backend.Kind != lender.KindAffinity {
		return
	}
	enabled, _ := d.lend.State()
	if enabled == view.Affinity.Enabled {
		return
	}
	d.log.Warn("lending: the gateway's affinity switch is not the one basin last set; taking the gateway's",
		"basin", enabled, "gateway", view.Affinity.Enabled)
	d.lend.Restore(view.Affinity.Enabled, time.Time{})
}

// decodePool is the decode instances as the lender sees them, one per decode target, so that its
// grants (which the http and exec backends pass on per instance) and its reclaim under one
// instance's pressure are per instance: an instance whose last reading is stale or incomplete is
// passed without numbers, and the lender holds for it. Without decode targets (the pool known
// only through sums) the pool is one instance.
func decodePool(s collector.Snapshot) []lender.Instance {
	if len(s.Decode) > 0 {
		out := make([]lender.Instance, 0, len(s.Decode))
		for _, d := range s.Decode {
			if d.State != collector.OK || !d.Complete {
				out = append(out, lender.Instance{Name: d.Name}) // unusable: the lender holds for it
				continue
			}
			// Free excludes lent KV: SGLang versions differ on whether "available" counts the
			// retained (evictable) pages that sticky routing makes lent, so take the smaller.
			free := min(d.FreeTokens, max(0, d.CapacityTokens-d.ReservedTokens-d.LentTokens))
			out = append(out, lender.Instance{Name: d.Name, CapacityTokens: d.CapacityTokens, FreeTokens: free,
				ReservedTokens: d.ReservedTokens, LentTokens: d.LentTokens, Waiting: d.Waiting})
		}
		return out
	}
	capacity, ok1 := s.Get(collector.DecodeCapacity)
	free, ok2 := s.Get(collector.DecodeFree)
	reserved, ok3 := s.Get(collector.DecodeReserved)
	if !ok1 || !ok2 || !ok3 {
		return []lender.Instance{{Name: "decode"}} // unusable: the lender holds its switch
	}
	return []lender.Instance{{Name: "decode", CapacityTokens: capacity, FreeTokens: free, ReservedTokens: reserved}}
}

// mayHold says whether this step reads the gateway's live sessions for the hold rule: only
// while the rule can act — the detector drifting or trapped, or sessions already held — since
// the listing grows with the live sessions, and only on the acting daemon (a standby plans
// nothing). A replicated deployment holds as a single gateway does: its admission leader keeps
// the hold list, whichever replica the admin URL reaches, and every replica enforces it.
func (d *Daemon) mayHold(a detector.Assessment, acting bool) bool {
	if !acting || d.cfg.Remediate.DisableHolds {
		return false
	}
	if a.State == detector.Drifting || a.State == detector.Trapped {
		return true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.gateway != nil && d.mu.gateway.Held > 0
}

// notifyAction tells Slack about a recorded action.
func (d *Daemon) notifyAction(r remediate.Record) {
	ev := notify.Event{Kind: notify.KindAction, At: r.At, Deployment: d.cfg.Deployment, Action: r.Kind, Reasons: r.Reasons,
		DryRun: r.Phase == remediate.PhaseDryRun}
	d.mu.Lock()
	a := d.mu.last
	d.mu.Unlock()
	ev.WorkingSetOverCache, ev.KneeRatio, ev.HitRate, ev.Plateau, ev.To = a.WorkingSetOverCache, a.Knee.Ratio, a.HitRate, a.Plateau, string(a.State)
	switch {
	case r.Budget != nil:
		ev.Before, ev.After = fmt.Sprintf("%d tokens", r.Budget.From), fmt.Sprintf("%d tokens", r.Budget.To)
	case r.Shed != nil:
		ev.After = fmt.Sprintf("shed %v", r.Shed.IDs)
	case r.Hold != nil:
		ev.After = r.Hold.Summary()
	case r.Lending != nil:
		ev.After = fmt.Sprintf("lending enabled=%t", r.Lending.Enabled)
	case r.Scale != nil:
		ev.After = r.Scale.Summary()
	}
	if r.Phase == remediate.PhaseFailed {
		ev.Reasons = append(ev.Reasons, "FAILED: "+r.Error)
	}
	if r.Phase == remediate.PhaseIntent {
		return // the outcome follows
	}
	d.slack.Notify(ev)
}
