package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/client"
	"github.com/basin-dev/basin/internal/lease"
	"github.com/basin-dev/basin/internal/store"
	"github.com/basin-dev/basin/remediate"
)

// Roles of a daemon, as its status and logs name them.
const (
	// RoleActing is the daemon that decides and acts: the only one without a store, the lease
	// holder with one.
	RoleActing = "acting"
	// RoleStandby collects, detects and serves its API, and takes no action.
	RoleStandby = "standby"
)

// auditStreamMaxLen bounds the shared audit stream (XADD MAXLEN ~): a daemon records a few
// actions per incident and a step every few minutes at most, so ten thousand records are months
// of them, the intents a successor must reconcile are always the newest, and a takeover reads
// the whole stream (a few megabytes) in well under reloadTimeout.
const auditStreamMaxLen = 10_000

// reloadTimeout bounds a takeover's read of the shared audit and state: longer than one
// command's op_timeout, since the stream is read whole.
const reloadTimeout = 10 * time.Second

// ha is a daemon's part in active/standby: its campaign for the lease P:daemon and the term it
// acts under. Without a store the daemon has none (Daemon.ha is nil) and always acts.
//
// The term moves in two steps. Winning the lease (the campaign's OnChange) only marks the term
// won; the daemon takes over on its loop's goroutine (takeOver, under Daemon.loop), where it
// reloads the shared audit, adopts the shared policy state and reconciles its predecessor's
// intents before its first plan. Losing the lease, a 409 for a stale term or a fenced write
// ends the term at once, from whichever goroutine learns it: every write checks the term first.
type ha struct {
	client   *redis.Client
	camp     *lease.Campaign
	instance string
	stateKey string
	// prefix is the daemon's keys' prefix, P:daemon.
	prefix string
	// renewInterval is the campaign's period (the lease's TTL/3), wall time.
	renewInterval time.Duration
	log           *slog.Logger
	now           func() time.Time
	// kick wakes the loop for a takeover.
	kick chan struct{}

	mu struct {
		sync.Mutex
		// won is a term won and not yet taken over.
		won uint64
		// term is the term this daemon acts under; 0 while standby.
		term uint64
		// last is the latest term this daemon held or won (the status's term while standby).
		last   uint64
		since  time.Time
		reason string
	}
	stepDowns *prometheus.CounterVec
}

// defaultInstance names a daemon whose configuration does not: host name and pid tell two
// daemons on one host apart, and a restarted one from its earlier self.
func defaultInstance() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

// newHA connects to the store (lazily: a store down at start leaves the daemon standby until it
// answers) and prepares the campaign; it does not start it (Serve does).
func (d *Daemon) newHA(instance string, reg prometheus.Registerer) error {
	cfg := d.cfg.Store
	c, err := store.OpenLazy(cfg, os.Getenv)
	if err != nil {
		return err
	}
	if instance == "" {
		instance = d.cfg.Instance
	}
	if instance == "" {
		instance = defaultInstance()
	}
	h := &ha{client: c, instance: instance, stateKey: cfg.Prefix + ":daemon:state", prefix: cfg.Prefix + ":daemon",
		renewInterval: time.Duration(cfg.LeaseTTL) / 3, log: d.log.With("component", "ha"), now: d.clock.Now, kick: make(chan struct{}, 1)}
	h.stepDowns = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "basin_daemon_step_downs_total",
		Help:        "Times the acting daemon stopped acting, by why: lease (lost or expired), stale_term (the gateway's 409), fenced (a shared write refused), blind (handed over to a standby that sees).",
		ConstLabels: prometheus.Labels{"deployment": d.cfg.Deployment}}, []string{"reason"})
	for _, r := range []string{"lease", "stale_term", "fenced", "blind"} {
		h.stepDowns.WithLabelValues(r)
	}
	if err := reg.Register(h.stepDowns); err != nil {
		_ = c.Close()
		return fmt.Errorf("metrics: %w", err)
	}
	// The lease runs at the wall clock's rate whatever the daemon's clock: its TTL lapses in the
	// store in real milliseconds. On an accelerated clock (the demo's, the e2e tests') the
	// daemon's time would run the leader's deadline out S times too soon.
	origin := d.clock.Now()
	wallRate := func() time.Time { return origin.Add(d.clock.WallDuration(d.clock.Now().Sub(origin))) }
	h.camp, err = lease.New(c, lease.Options{Prefix: cfg.Prefix + ":daemon", Owner: instance, TTL: time.Duration(cfg.LeaseTTL),
		OnChange: d.onLease, Logger: d.log.With("component", "lease"), Registerer: reg, Now: wallRate})
	if err != nil {
		_ = c.Close()
		return fmt.Errorf("store: %w", err)
	}
	d.ha = h
	return nil
}

// onLease hears the campaign's changes (on its goroutine; it must not block).
func (d *Daemon) onLease(ch lease.Change) {
	h := d.ha
	if ch.Leader {
		h.mu.Lock()
		h.mu.won, h.mu.last = ch.Epoch, ch.Epoch
		h.mu.Unlock()
		h.log.Info("won the lease; taking over before the next plan", "term", ch.Epoch, "instance", h.instance)
		select {
		case h.kick <- struct{}{}:
		default:
		}
		return
	}
	d.stepDown(ch.Epoch, "lease", ch.Reason)
}

// stepDown ends the term at once: the current step's next write is refused (actingTerm) and the
// daemon is standby until it wins the lease again. why is the metric's label.
func (d *Daemon) stepDown(term uint64, why, reason string) {
	h := d.ha
	if h == nil || term == 0 {
		return
	}
	h.mu.Lock()
	was := h.mu.term == term || h.mu.won == term
	if was {
		h.mu.term, h.mu.won = 0, 0
		h.mu.since, h.mu.reason = h.now(), why+": "+reason
	}
	h.mu.Unlock()
	if !was {
		return
	}
	h.stepDowns.WithLabelValues(why).Inc()
	h.log.Warn("stepped down: standby until the lease is won again", "term", term, "why", why, "reason", reason)
	if why != "lease" && why != "blind" { // a blind daemon releases the lease itself (noteSight)
		// Superseded while the campaign may still believe it leads (the gateway or the store saw
		// a later term first): give the lease up so that it settles on one daemon without
		// waiting for a renewal to be refused.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(d.cfg.Store.OpTimeout))
			defer cancel()
			_ = h.camp.Release(ctx)
		}()
	}
}

// actingTerm is the term the daemon acts under: (0, true) without a store, (term, true) while it
// holds the lease it took over, (0, false) while standby.
func (d *Daemon) actingTerm() (uint64, bool) {
	h := d.ha
	if h == nil {
		return 0, true
	}
	h.mu.Lock()
	term := h.mu.term
	h.mu.Unlock()
	if term == 0 {
		return 0, false
	}
	if e, ok := h.camp.Leader(); !ok || e != term {
		return 0, false // lapsed: the campaign's OnChange follows
	}
	return term, true
}

// role is the role, term and why of the last change, for the status and metrics.
func (d *Daemon) role() (role string, term uint64, since time.Time, reason string) {
	if d.ha == nil {
		return RoleActing, 0, time.Time{}, ""
	}
	t, acting := d.actingTerm()
	h := d.ha
	h.mu.Lock()
	defer h.mu.Unlock()
	if acting {
		return RoleActing, t, h.mu.since, h.mu.reason
	}
	return RoleStandby, h.mu.last, h.mu.since, h.mu.reason
}

// takeOver makes a won term the acting one (the caller holds d.loop): the shared audit is
// reloaded, the shared policy state adopted when newer than the daemon's own, and the
// predecessor's intents without outcome reconciled against the gateway, as after a restart,
// before any new plan.
func (d *Daemon) takeOver(ctx context.Context) {
	h := d.ha
	if h == nil {
		return
	}
	h.mu.Lock()
	won := h.mu.won
	h.mu.Unlock()
	if won == 0 {
		return
	}
	if e, ok := h.camp.Leader(); !ok || e != won {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, max(reloadTimeout, time.Duration(d.cfg.Store.OpTimeout)))
	defer cancel()
	if err := d.audit.Reload(rctx); err != nil {
		h.log.Warn("taking over: the shared audit is unreadable; staying standby and retrying next step", "term", won, "err", err)
		return
	}
	p, found, err := d.loadShared(rctx)
	if err != nil {
		h.log.Warn("taking over: the shared state is unreadable; staying standby and retrying next step", "term", won, "err", err)
		return
	}
	h.mu.Lock()
	if h.mu.won != won { // stepped down meanwhile
		h.mu.Unlock()
		return
	}
	h.mu.won, h.mu.term, h.mu.since, h.mu.reason = 0, won, h.now(), "took over"
	h.mu.Unlock()
	if found && p.PolicyAt.After(d.savedAt) {
		if err := d.adopt(p); err != nil {
			h.log.Error("taking over: the shared policy state is unusable; keeping this daemon's own", "err", err)
		}
	} else {
		d.pol.Replay(d.audit.Records(0))
		d.publishPolicy()
	}
	h.log.Info("acting", "term", won, "instance", h.instance, "shared_state", found, "pending_intents", len(d.audit.Pending()))
	tctx := client.WithTerm(ctx, won)
	if tg, ok := d.gw.(termGateway); ok {
		// Fencing starts now: a predecessor that resumes (paused, partitioned) and sends a
		// write it had decided is refused even before this daemon's first action.
		if err := tg.ClaimTerm(tctx); errors.Is(err, remediate.ErrSuperseded) {
			return
		} else if err != nil {
			h.log.Warn("taking over: the gateway did not hear of the new term; its first write will carry it", "term", won, "err", err)
		}
	}
	d.reconcile(tctx)
}

// loadShared reads the acting daemon's last state, P:daemon:state.
func (d *Daemon) loadShared(ctx context.Context) (persisted, bool, error) {
	var p persisted
	b, err := d.ha.client.Get(ctx, d.ha.stateKey).Bytes()
	if errors.Is(err, redis.Nil) {
		return p, false, nil
	}
	if err != nil {
		return p, false, fmt.Errorf("store: get %s: %w", d.ha.stateKey, err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, false, fmt.Errorf("store: %s: %w", d.ha.stateKey, err)
	}
	if p.Version != stateVersion {
		return p, false, fmt.Errorf("store: %s: version %d, want %d", d.ha.stateKey, p.Version, stateVersion)
	}
	return p, true, nil
}

// adopt takes a predecessor's state: its policy, lending switch and pause, on top of which the
// shared audit is replayed. The detector's state stays this daemon's own, which has been
// watching all along (unless it has not stepped yet).
func (d *Daemon) adopt(p persisted) error {
	if _, stepped := d.det.Last(); !stepped && p.State != "" {
		if err := d.det.Resume(p.State, p.Since); err != nil {
			return err
		}
	}
	ps, lending, lendingAt := p.Policy, p.Lending, p.LendingAt
	if p.DryRun && !d.cfg.DryRun {
		ps = remediate.PolicyState{Mode: remediate.Normal, Seq: ps.Seq, ArrivalEWMA: ps.ArrivalEWMA, ArrivalAt: ps.ArrivalAt}
		lending, lendingAt = false, time.Time{}
	}
	if err := d.pol.Restore(ps); err != nil {
		return err
	}
	d.pol.Replay(d.audit.Records(0))
	d.publishPolicy()
	d.lend.Restore(lending, lendingAt)
	if now := d.clock.Now(); p.PausedUntil.After(now) {
		if err := d.exec.Pause(now, p.PausedUntil, p.PauseReason+" (taken over)"); err != nil {
			return err
		}
	}
	d.savedAt = p.PolicyAt
	return nil
}

// saveShared writes the state for a successor, fenced by the term: a daemon superseded since is
// refused and steps down.
func (d *Daemon) saveShared(b []byte) error {
	term, acting := d.actingTerm()
	if d.ha == nil || !acting {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(d.cfg.Store.OpTimeout))
	defer cancel()
	_, err := d.ha.camp.Write(ctx, term, lease.Cmd{Name: "SET", Keys: []string{d.ha.stateKey}, Args: []any{string(b)}})
	return d.fenced(term, "shared state", err)
}

// fenced turns a fenced write into a step-down and remediate.ErrSuperseded.
func (d *Daemon) fenced(term uint64, what string, err error) error {
	var fe *lease.FencedError
	if errors.As(err, &fe) {
		d.stepDown(term, "fenced", fmt.Sprintf("%s write refused: %v", what, err))
		return fmt.Errorf("%s: %w: %w", what, remediate.ErrSuperseded, err)
	}
	return err
}

// auditStream is the shared audit log, P:daemon:audit: one stream entry per record (field
// "rec", the record's JSON), appended by the acting daemon only, fenced by its term.
type auditStream struct {
	d   *Daemon
	key string
}

// Append writes recs in one fenced script, so an intent and its siblings land together or not
// at all. The term is the step's (client.WithTerm) when ctx carries one, so that an action's
// outcome is written under the term that decided it even after this daemon stepped down: the
// store alone decides, and refuses it once a successor's term has begun (the successor then
// reconciles the intent: one outcome either way). Without one (a pause) it is the acting term.
func (s auditStream) Append(ctx context.Context, recs []remediate.Record) error {
	term := client.TermFrom(ctx)
	if term == 0 {
		var acting bool
		if term, acting = s.d.actingTerm(); !acting {
			return fmt.Errorf("audit stream %s: standby: %w", s.key, remediate.ErrSuperseded)
		}
	}
	cmds := make([]lease.Cmd, 0, len(recs))
	for _, r := range recs {
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("audit record: %w", err)
		}
		cmds = append(cmds, lease.Cmd{Name: "XADD", Keys: []string{s.key}, Args: []any{"MAXLEN", "~", auditStreamMaxLen, "*", "rec", string(b)}})
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(s.d.cfg.Store.OpTimeout))
	defer cancel()
	_, err := s.d.ha.camp.Write(ctx, term, cmds...)
	if err != nil {
		return fmt.Errorf("audit stream %s: %w", s.key, s.d.fenced(term, "audit", err))
	}
	return nil
}

// Load reads the whole stream.
func (s auditStream) Load(ctx context.Context) ([]remediate.Record, error) {
	msgs, err := s.d.ha.client.XRange(ctx, s.key, "-", "+").Result()
	if err != nil {
		return nil, fmt.Errorf("audit stream %s: %w", s.key, err)
	}
	out := make([]remediate.Record, 0, len(msgs))
	for _, m := range msgs {
		v, _ := m.Values["rec"].(string)
		var r remediate.Record
		if err := json.Unmarshal([]byte(v), &r); err != nil || r.Kind == "" {
			return nil, fmt.Errorf("audit stream %s: entry %s: not a record: %v", s.key, m.ID, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// Close is a no-op: the client is the daemon's.
func (auditStream) Close() error { return nil }

// termGateway is the gateway's admin API as the acting daemon writes to it in replicated mode:
// a decorator of the admission contract (and the affinity switch) whose writes go only under the
// step's term, the gateway's 409 for a stale term ending it; reads pass through.
type termGateway struct {
	GatewayAPI
	d *Daemon
}

// guard refuses a write whose step's term is no longer the acting one.
func (g termGateway) guard(ctx context.Context) (uint64, error) {
	term := client.TermFrom(ctx)
	if cur, acting := g.d.actingTerm(); !acting || cur != term || term == 0 {
		return term, fmt.Errorf("term %d: no longer acting: %w", term, remediate.ErrSuperseded)
	}
	return term, nil
}

// stale turns the gateway's 409 into a step-down.
func (g termGateway) stale(term uint64, err error) error {
	if errors.Is(err, client.ErrStaleTerm) {
		g.d.stepDown(term, "stale_term", err.Error())
		return fmt.Errorf("%w: %w", remediate.ErrSuperseded, err)
	}
	return err
}

// termClaimer is a gateway that can be told of a new term before any action (gateway/client).
type termClaimer interface {
	ClaimTerm(ctx context.Context) (uint64, error)
}

// ClaimTerm tells the gateway of the acting term as the daemon takes over, when the gateway
// client can; a stale term steps the daemon down.
func (g termGateway) ClaimTerm(ctx context.Context) error {
	term, err := g.guard(ctx)
	if err != nil {
		return err
	}
	tc, ok := g.GatewayAPI.(termClaimer)
	if !ok {
		return nil
	}
	_, err = tc.ClaimTerm(ctx)
	return g.stale(term, err)
}

// SetBudget implements remediate.Admission under the step's term.
func (g termGateway) SetBudget(ctx context.Context, r adminapi.BudgetRequest) (adminapi.BudgetResult, error) {
	term, err := g.guard(ctx)
	if err != nil {
		return adminapi.BudgetResult{}, err
	}
	res, err := g.GatewayAPI.SetBudget(ctx, r)
	return res, g.stale(term, err)
}

// Shed implements remediate.Admission under the step's term.
func (g termGateway) Shed(ctx context.Context, r adminapi.ShedRequest) (adminapi.ShedResult, error) {
	term, err := g.guard(ctx)
	if err != nil {
		return adminapi.ShedResult{}, err
	}
	res, err := g.GatewayAPI.Shed(ctx, r)
	return res, g.stale(term, err)
}

// Hold implements remediate.Admission under the step's term.
func (g termGateway) Hold(ctx context.Context, r adminapi.HoldRequest) (adminapi.HoldResult, error) {
	term, err := g.guard(ctx)
	if err != nil {
		return adminapi.HoldResult{}, err
	}
	res, err := g.GatewayAPI.Hold(ctx, r)
	return res, g.stale(term, err)
}

// SetAffinity switches the gateway's affinity under the step's term.
func (g termGateway) SetAffinity(ctx context.Context, enabled bool, reason string) error {
	term, err := g.guard(ctx)
	if err != nil {
		return err
	}
	return g.stale(term, g.GatewayAPI.SetAffinity(ctx, enabled, reason))
}

// termScaling asks for instances only under the acting term (the backends know of no term).
type termScaling struct {
	remediate.Scaling
	d *Daemon
}

func (s termScaling) ApplyScale(ctx context.Context, seq uint64, p remediate.ScalePlan, reason string) error {
	if _, err := (termGateway{d: s.d}).guard(ctx); err != nil {
		return err
	}
	return s.Scaling.ApplyScale(ctx, seq, p, reason)
}

// termLending applies a lending plan only under the acting term (backends other than the
// gateway's affinity switch know of no term).
type termLending struct {
	remediate.Lending
	d *Daemon
}

func (l termLending) ApplyLending(ctx context.Context, p remediate.LendingPlan) error {
	if _, err := (termGateway{d: l.d}).guard(ctx); err != nil {
		return err
	}
	return l.Lending.ApplyLending(ctx, p)
}
