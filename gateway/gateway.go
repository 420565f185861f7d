package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/exporter-toolkit/web"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/predictor"
	"github.com/basin-dev/basin/internal/ratelog"
	"github.com/basin-dev/basin/internal/secret"
)

// DefaultShutdownTimeout bounds how long a shutdown waits for calls in flight.
const DefaultShutdownTimeout = 30 * time.Second

// Intervals of the background work Run does, and of rate-limited log lines.
const (
	expireEvery = time.Second
	saveEvery   = 10 * time.Second
	logEvery    = 10 * time.Second
)

// Options are what a Gateway is built from. Only Config is required.
type Options struct {
	// Config is the validated configuration (ParseConfig or LoadConfig).
	Config *Config
	// Logger receives admissions, refusals, admin changes and errors (discarded when nil).
	Logger *slog.Logger
	// Registerer is where the gateway's metrics are registered; when nil a private registry is
	// used. Never the default registry unless the caller passes it.
	Registerer prometheus.Registerer
	// Gatherer is what /metrics on the admin listener serves: by default Registerer (which must
	// then also be a Gatherer, as a *prometheus.Registry is), or the private registry.
	Gatherer prometheus.Gatherer
	// Now is the clock (time.Now when nil). Queue waits use real timers; every timestamp the
	// admission core and the trace see comes from Now.
	Now func() time.Time
	// DeploymentClock says Now is the deployment's clock already (basin demo runs the gateway on
	// its simulated deployment's): the speed an upstream announces is shown in /admin/state but
	// not applied to the idle timeout again.
	DeploymentClock bool
	// Getenv reads the environment (os.Getenv when nil); the admin token may come from
	// AdminTokenEnv.
	Getenv func(string) string
	// ShutdownTimeout bounds the wait for calls in flight at shutdown (DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
}

// Gateway is the session-admission reverse proxy. Handler serves the OpenAI-compatible API,
// AdminHandler the admin API and /metrics, and Run the background work and the graceful
// shutdown. All are safe for concurrent use.
type Gateway struct {
	cfg             Config
	log             *slog.Logger
	now             func() time.Time
	shutdownTimeout time.Duration

	core core
	// repl is the gateway alone (single) or one replica of several (replica): everything the
	// two do differently is asked of it.
	repl replicator
	// speed is the deployment's speed as its upstream announces it (speed.go); not applied when
	// the clock is the deployment's already (Options.DeploymentClock).
	speed           speedWatch
	deploymentClock bool
	// daemonTerm is the highest Basin-Daemon-Term an admin write carried.
	daemonTerm atomic.Uint64
	pred       predictor.Predictor
	fallback   *predictor.Fallback // nil when a model is loaded
	upstreams  []*upstream
	transport  *http.Transport
	token      []byte
	gatherer   prometheus.Gatherer
	metrics    *metrics
	rec        *recorder // nil when not recording
	journal    *journal  // nil without a state file
	saveEvery  time.Duration
	readiness  readiness
	authLog    ratelog.Limiter // failed admin logins
	errLog     ratelog.Limiter // journal errors on the call path

	affinity atomic.Bool
	stopping chan struct{} // closed when shutdown begins
	stopOnce sync.Once
	running  atomic.Bool
	calls    tracker // model calls being handled
	saveMu   sync.Mutex

	handler      http.Handler
	adminHandler http.Handler

	// mu guards the waiters and the per-session routing and trace state. It is taken before the
	// core's own lock whenever both are held (the core never calls back), so that a queued call's
	// waiter is registered before any event for it can be delivered.
	mu struct {
		sync.Mutex
		waiters map[string][]*waiter
		// held are the calls of held sessions waiting for their release (hold.go), oldest
		// first; one a session in practice, as the core lets a second call of a session whose
		// call waits pass.
		held     map[string][]*waiter
		sessions map[string]*sessionInfo
		// perUpstream counts sessions by upstream, kept with sessions (addSessionLocked,
		// dropSessionLocked) so /admin/state need not walk every session.
		perUpstream []int
		// chains are the Responses calls of live sessions by response id: the session a call
		// continuing one (previous_response_id) belongs to, and that session's context after it.
		chains map[string]chainLink
	}
}

// upstream is one backend.
type upstream struct {
	url   *url.URL
	proxy *httputil.ReverseProxy
}

// New builds a Gateway: it loads the predictor model, reads the admin token, opens the trace file
// and restores the state file, failing with an error that names the file or field at fault.
func New(o Options) (*Gateway, error) {
	if o.Config == nil {
		return nil, errors.New("gateway: options: Config is required")
	}
	cfg := *o.Config
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.ShutdownTimeout <= 0 {
		o.ShutdownTimeout = DefaultShutdownTimeout
	}
	g := &Gateway{cfg: cfg, log: o.Logger, now: o.Now, deploymentClock: o.DeploymentClock, shutdownTimeout: o.ShutdownTimeout,
		stopping: make(chan struct{}), saveEvery: saveEvery, authLog: ratelog.Limiter{Every: logEvery},
		errLog: ratelog.Limiter{Every: logEvery}}
	g.mu.waiters = map[string][]*waiter{}
	g.mu.held = map[string][]*waiter{}
	g.mu.sessions = map[string]*sessionInfo{}
	g.mu.chains = map[string]chainLink{}
	g.affinity.Store(cfg.Affinity.Enabled)

	ac, err := admission.New(cfg.admissionOptions())
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	g.core = core{Core: ac}

	if cfg.Predictor.Model != "" {
		m, err := predictor.Load(cfg.Predictor.Model)
		if err != nil {
			return nil, fmt.Errorf("gateway: predictor.model %s: %w", cfg.Predictor.Model, err)
		}
		g.pred = m
	} else {
		f, err := predictor.NewFallback(predictor.FallbackOptions{})
		if err != nil {
			return nil, fmt.Errorf("gateway: predictor: %w", err)
		}
		g.pred, g.fallback = f, f
	}

	if g.token, err = adminToken(cfg.AdminTokenFile, o.Getenv); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}

	g.transport = newTransport()
	for i, raw := range cfg.Upstreams {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("gateway: upstreams[%d]: %w", i, err)
		}
		g.upstreams = append(g.upstreams, &upstream{url: u, proxy: g.newProxy(u)})
	}
	g.mu.perUpstream = make([]int, len(g.upstreams))

	reg, gath := o.Registerer, o.Gatherer
	if reg == nil {
		r := prometheus.NewRegistry()
		reg = r
		if gath == nil {
			gath = r
		}
	}
	if gath == nil {
		rg, ok := reg.(prometheus.Gatherer)
		if !ok {
			return nil, errors.New("gateway: options: Gatherer is required when Registerer is not a Gatherer (for /metrics)")
		}
		gath = rg
	}
	g.gatherer = gath
	if g.metrics, err = newMetrics(g, reg); err != nil {
		return nil, fmt.Errorf("gateway: metrics: %w", err)
	}
	if cfg.Store.Enabled() {
		r, err := newReplica(g, o, reg)
		if err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
		g.repl = r
	} else {
		g.repl = &single{}
	}
	g.core.repl = g.repl

	if err := g.restoreState(); err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if cfg.Record.Path != "" {
		if g.rec, err = openRecorder(cfg.Record.Path); err != nil {
			if g.journal != nil {
				_ = g.journal.close()
			}
			return nil, fmt.Errorf("gateway: record.path: %w", err)
		}
	}
	g.handler = g.routes()
	g.adminHandler = g.adminRoutes()
	return g, nil
}

// adminToken reads the admin bearer token from file, else from the environment.
func adminToken(file string, getenv func(string) string) ([]byte, error) {
	tok, err := secret.FileOrEnv(file, AdminTokenEnv, getenv)
	switch {
	case err != nil:
		return nil, fmt.Errorf("admin_token_file: %w", err)
	case tok != "":
		return []byte(tok), nil
	}
	return nil, fmt.Errorf("admin token: set admin_token_file in the config or the environment variable %s", AdminTokenEnv)
}

// newTransport is the upstream transport: many idle connections per upstream (agent traffic is
// many concurrent streams to few hosts), and no compression negotiated on the client's behalf, so
// that what the client receives is byte for byte what the upstream sent.
func newTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 256
	t.DisableCompression = true
	return t
}

// addSessionLocked records a session's routing state (g.mu held).
func (g *Gateway) addSessionLocked(id string, si *sessionInfo) {
	if old, ok := g.mu.sessions[id]; ok {
		g.mu.perUpstream[old.upstream]--
	}
	g.mu.sessions[id] = si
	g.mu.perUpstream[si.upstream]++
}

// dropSessionLocked forgets a session's routing state (g.mu held).
func (g *Gateway) dropSessionLocked(id string) {
	if si, ok := g.mu.sessions[id]; ok {
		g.mu.perUpstream[si.upstream]--
		delete(g.mu.sessions, id)
		for _, r := range si.responses {
			delete(g.mu.chains, r)
		}
	}
}

// Handler serves the OpenAI-compatible API: model calls through admission, everything else
// passed through.
func (g *Gateway) Handler() http.Handler { return g.handler }

// AdminHandler serves the admin API (bearer token) and /metrics (open).
func (g *Gateway) AdminHandler() http.Handler { return g.adminHandler }

// Run does the gateway's background work until ctx is done: it ends idle sessions and releases
// held calls past the hold bound every second (and writes out their journal records), and writes
// the state file every 10 s, compacting the journal into it. Then it shuts down: queued and held
// calls are answered 503 shutting_down, calls in flight may finish (bounded by
// Options.ShutdownTimeout), the state file is written and the trace closed. It does not own
// listeners (the package-level Run does); a Gateway runs once.
func (g *Gateway) Run(ctx context.Context) error {
	if !g.running.CompareAndSwap(false, true) {
		return errors.New("gateway: run: already started")
	}
	if err := g.repl.Claim(ctx); err != nil {
		g.stopOnce.Do(func() { close(g.stopping) })
		return fmt.Errorf("gateway: %w", err)
	}
	fatal := g.repl.Fatal()
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.repl.Run(rctx)
	}()
	// After the shutdown below, so that calls finishing during it are still saved; then the
	// lease is released for a successor.
	defer func() {
		cancel()
		<-done
	}()
	expire := time.NewTicker(expireEvery)
	defer expire.Stop()
	save := time.NewTicker(g.saveEvery)
	defer save.Stop()
	for {
		select {
		case <-ctx.Done():
			return g.shutdown()
		case err := <-fatal:
			return errors.Join(fmt.Errorf("gateway: %w", err), g.shutdown())
		case <-expire.C:
			g.expire()
			if g.journal != nil {
				if err := g.journal.flush(); err != nil {
					g.log.Error("writing the journal", "err", err)
				}
			}
		case <-save.C:
			if err := g.saveState(); err != nil {
				g.log.Error("writing the state file", "err", err)
			}
		}
	}
}

// expire ends idle sessions and, alone, releases the held calls that have waited the hold bound:
// the bound is kept on the injected clock, at this loop's one-second grain, which is nothing
// next to a bound of minutes.
func (g *Gateway) expire() {
	now := g.now()
	// First: a session whose held call's client gave up is idle, and must not end before its
	// call's release is delivered. Every replica releases the calls it holds at the bound.
	g.expireHolds(now)
	if g.repl.Deciding() {
		// Queued sessions past admission.start_deadline are refused by the core that queued
		// them: replicated, the leader's, which queues followers' first calls too (their refusal
		// is relayed), or a degraded replica's own.
		// Under g.mu, as a shed (serveShed): a waiter leaving in between would answer a
		// queue timeout for a session counted too late.
		g.mu.Lock()
		g.deliverLocked(g.core.ExpireQueued(now))
		g.mu.Unlock()
	}
	g.deliver(g.core.Expire(now))
}

// shutdown releases queued calls, waits for calls in flight, saves the state and closes the trace.
func (g *Gateway) shutdown() error {
	g.stopOnce.Do(func() { close(g.stopping) })
	g.log.Info("gateway shutting down", "calls_in_flight", g.calls.count())
	if !g.calls.wait(g.shutdownTimeout) {
		g.log.Warn("calls still in flight at the shutdown deadline", "calls", g.calls.count(),
			"timeout", g.shutdownTimeout)
	}
	var errs []error
	if err := g.saveState(); err != nil {
		errs = append(errs, err)
	}
	if g.journal != nil {
		if err := g.journal.close(); err != nil {
			errs = append(errs, err)
		}
	}
	if g.rec != nil {
		if err := g.rec.close(); err != nil {
			errs = append(errs, fmt.Errorf("record: %w", err))
		}
	}
	g.transport.CloseIdleConnections()
	return errors.Join(errs...)
}

func (g *Gateway) isStopping() bool {
	select {
	case <-g.stopping:
		return true
	default:
		return false
	}
}

// Run is `basin gateway`: it builds a Gateway from o, serves the OpenAI-compatible API on
// listen and the admin API on admin_listen until ctx is done, then stops accepting, answers queued
// calls 503 shutting_down, lets calls in flight finish (bounded), writes the state file and
// returns.
func Run(ctx context.Context, o Options) error {
	g, err := New(o)
	if err != nil {
		return err
	}
	// Before listening: a second replica under a running one's id does not start at all.
	if err := g.repl.Claim(ctx); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	ln, err := net.Listen("tcp", g.cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway: listen: %w", err)
	}
	aln, err := net.Listen("tcp", g.cfg.AdminListen)
	if err != nil {
		ln.Close()
		return fmt.Errorf("gateway: admin_listen: %w", err)
	}
	errLog := slog.NewLogLogger(g.log.Handler(), slog.LevelWarn)
	hs := &http.Server{Handler: g.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: errLog}
	as := &http.Server{Handler: g.AdminHandler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog}
	var redacted []string
	for _, u := range g.upstreams {
		redacted = append(redacted, u.url.Redacted())
	}
	snap := g.core.Snapshot(g.now(), false)
	g.log.Info("gateway serving", "addr", "http://"+ln.Addr().String(), "admin", "http://"+aln.Addr().String(),
		"upstreams", redacted, "mode", g.cfg.Admission.Mode, "budget_tokens", snap.Budget,
		"reference_budget_tokens", snap.ReferenceBudget, "count_only", snap.CountOnly, "affinity", g.affinity.Load())
	if snap.CountOnly {
		g.log.Info("admission counts only: every session is admitted until PUT /admin/budget sets a budget")
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	serveErr := make(chan error, 2)
	for _, f := range []string{g.cfg.WebConfigFile, g.cfg.AdminWebConfigFile} {
		if f != "" {
			if err := web.Validate(f); err != nil {
				ln.Close()
				aln.Close()
				return fmt.Errorf("gateway: web config %s: %w", f, err)
			}
		}
	}
	webLog := g.log.With("component", "web")
	go func() { serveErr <- web.Serve(ln, hs, webFlags(g.cfg.WebConfigFile), webLog) }()
	go func() { serveErr <- web.Serve(aln, as, webFlags(g.cfg.AdminWebConfigFile), webLog) }()
	runErr := make(chan error, 1)
	go func() { runErr <- g.Run(runCtx) }()

	ran := false
	select {
	case <-ctx.Done():
	case err = <-serveErr:
		err = fmt.Errorf("gateway: serve: %w", err)
	case err = <-runErr: // it stopped by itself: a replica that cannot run (its id in use)
		ran = true
	}
	cancel() // queued calls are answered while the servers drain
	sctx, stop := context.WithTimeout(context.Background(), g.shutdownTimeout+time.Second)
	defer stop()
	if e := hs.Shutdown(sctx); e != nil {
		hs.Close()
	}
	if e := as.Shutdown(sctx); e != nil {
		as.Close()
	}
	if !ran {
		if e := <-runErr; e != nil && err == nil {
			err = fmt.Errorf("gateway: shutdown: %w", e)
		}
	}
	g.log.Info("gateway stopped")
	return err
}

// webFlags points exporter-toolkit's server at a web configuration file (empty: plain HTTP).
func webFlags(file string) *web.FlagConfig {
	systemd := false
	return &web.FlagConfig{WebListenAddresses: &[]string{}, WebSystemdSocket: &systemd, WebConfigFile: &file}
}

// tracker counts model calls being handled, so that shutdown can wait for them.
type tracker struct {
	mu sync.Mutex
	n  int
}

func (t *tracker) enter() { t.mu.Lock(); t.n++; t.mu.Unlock() }
func (t *tracker) exit()  { t.mu.Lock(); t.n--; t.mu.Unlock() }

func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// wait polls until no call is in flight or the timeout passes; it reports whether all finished.
func (t *tracker) wait(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for t.count() > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}
