package demo

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"time"

	"github.com/basin-dev/basin/daemon"
	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/gateway/client"
	"github.com/basin-dev/basin/internal/scaledclock"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/sim/scenario"
	"github.com/basin-dev/basin/sim/serve"
)

// The configuration files a run is started from. They are the demo's "default config": written
// into the run's directory and loaded by gateway.LoadConfig and daemon.LoadConfig, as `basin
// gateway --config` and `basin daemon --config` would load them.
var (
	//go:embed gateway.yaml.tmpl
	gatewayTemplate string
	//go:embed daemon.yaml.tmpl
	daemonTemplate string
)

type stackSpec struct {
	name        string
	daemon      bool
	dryRun      bool
	calibration string
	// clock is the deployment's time, o.Speed times the wall clock's: the gateway's and the
	// daemon's one time base.
	clock *scaledclock.Clock
}

// stack is one run's servers: the simulated deployment, the gateway and (optionally) the daemon.
type stack struct {
	name      string
	load      *scenario.Scenario
	apiURL    string
	statusURL string
	g         *client.Client
	d         *daemon.Daemon
	http      *http.Client

	stops []func() error // in reverse order of start

	mu struct {
		sync.Mutex
		state           string
		states, actions int
		seen            map[string]bool // the audit outcomes reported, by plan and kind
	}
}

// startStack starts a run's servers. On error, whatever was started has been stopped.
func startStack(o Options, sp stackSpec) (_ *stack, err error) {
	s := &stack{name: sp.name, http: &http.Client{Timeout: 5 * time.Second}}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.stop())
		}
	}()
	dir := filepath.Join(o.Dir, runID(sp.name))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	log := o.Logger.With("run", sp.name)

	// The simulated deployment, with no traffic of its own: the load generator is its client.
	so, err := o.Scenario.Options("")
	if err != nil {
		return nil, err
	}
	so.Streams = nil
	srv, err := serve.New(serve.Options{Sim: so, Speed: o.Speed, Logger: log.With("component", "sim")})
	if err != nil {
		return nil, err
	}
	simCtx, stopSim := context.WithCancel(context.Background())
	simDone := make(chan error, 1)
	go func() { simDone <- srv.Run(simCtx) }()
	s.stops = append(s.stops, func() error {
		stopSim()
		if err := <-simDone; err != nil {
			return fmt.Errorf("simulated deployment: %w", err)
		}
		return nil
	})
	ln, err := listen(o.Listen)
	if err != nil {
		return nil, err
	}
	s.stops = append(s.stops, noErr(serveHTTP(ln, srv.Handler())))
	simURL := "http://" + ln.Addr().String()

	// The gateway.
	gwToken := token()
	if err := writeSecret(dir, "admin-token", gwToken); err != nil {
		return nil, err
	}
	gwPath := filepath.Join(dir, "gateway.yaml")
	// The gateway runs on the deployment's clock: its admission core's times (idle timeout, stale
	// sessions, the queue waits the daemon reads) are the deployment's. A queued call's wait is a
	// real timer, so max_queue_wait is written in wall time.
	if err := writeTemplate(gwPath, gatewayTemplate, map[string]any{
		"Upstream": simURL, "QueueWait": sp.clock.WallDuration(o.QueueWait).Round(time.Millisecond).String(),
	}); err != nil {
		return nil, err
	}
	gcfg, err := gateway.LoadConfig(gwPath)
	if err != nil {
		return nil, err
	}
	g, err := gateway.New(gateway.Options{Config: gcfg, Registerer: newRegistry(), Logger: log.With("component", "gateway"),
		ShutdownTimeout: 2 * time.Second, Now: sp.clock.Now, DeploymentClock: true})
	if err != nil {
		return nil, err
	}
	gwCtx, stopGw := context.WithCancel(context.Background())
	gwDone := make(chan error, 1)
	go func() { gwDone <- g.Run(gwCtx) }()
	s.stops = append(s.stops, func() error {
		stopGw()
		if err := <-gwDone; err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
		return nil
	})
	apiLn, err := listen(o.Listen)
	if err != nil {
		return nil, err
	}
	s.stops = append(s.stops, noErr(serveHTTP(apiLn, wallRetryAfter(g.Handler(), sp.clock))))
	adminLn, err := listen(o.Listen)
	if err != nil {
		return nil, err
	}
	s.stops = append(s.stops, noErr(serveHTTP(adminLn, g.AdminHandler())))
	s.apiURL = "http://" + apiLn.Addr().String()
	adminURL := "http://" + adminLn.Addr().String()
	if s.g, err = client.New(client.Options{BaseURL: adminURL, Token: gwToken, QueueTail: 1}); err != nil {
		return nil, err
	}
	if !sp.daemon {
		return s, nil
	}

	// The daemon.
	if err := writeSecret(dir, "daemon-token", token()); err != nil {
		return nil, err
	}
	dPath := filepath.Join(dir, "daemon.yaml")
	if err := writeTemplate(dPath, daemonTemplate, map[string]any{
		"Deployment": "demo-" + runID(sp.name), "DryRun": sp.dryRun,
		"Interval": o.Interval.String(), "Calibration": sp.calibration,
		"Prefill": simURL + "/metrics/prefill-0", "Decode": simURL + "/metrics/decode-0",
		"GatewayMetrics": adminURL + "/metrics", "GatewayAdmin": adminURL,
		"LendingSwitch": simURL + "/admin/lending/decision",
	}); err != nil {
		return nil, err
	}
	dcfg, err := daemon.LoadConfig(dPath)
	if err != nil {
		return nil, err
	}
	s.d, err = daemon.New(dcfg, daemon.Options{Logger: log.With("component", "daemon"), Registerer: newRegistry(), Clock: sp.clock})
	if err != nil {
		return nil, err
	}
	dLn, err := listen(o.Listen)
	if err != nil {
		_ = s.d.Close()
		return nil, err
	}
	dCtx, stopD := context.WithCancel(context.Background())
	dDone := make(chan error, 1)
	go func() { dDone <- s.d.Serve(dCtx, dLn) }()
	s.stops = append(s.stops, func() error {
		stopD()
		if err := <-dDone; err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
		return nil
	})
	s.statusURL = "http://" + dLn.Addr().String() + "/"
	return s, nil
}

// stop stops the run's servers, last started first, and reports what failed.
func (s *stack) stop() error {
	var errs []error
	for i := len(s.stops) - 1; i >= 0; i-- {
		errs = append(errs, s.stops[i]())
	}
	s.stops = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stopping the %s run: %w", s.name, err)
	}
	return nil
}

// watch polls the daemon's API until ctx ends and reports its transitions and actions. Polling
// the API (rather than reading the daemon's memory) shows what a user of the daemon sees.
func (s *stack) watch(ctx context.Context, virtual func(time.Time) time.Duration, emit func(Event)) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.poll(ctx, virtual, emit)
		}
	}
}

type statusView struct {
	Now        time.Time `json:"now"`
	Assessment struct {
		State   string    `json:"state"`
		Since   time.Time `json:"since"`
		Reasons []string  `json:"reasons"`
	} `json:"assessment"`
}

// poll reads the daemon's status and events once. Times are converted from the daemon's clock
// (which runs at the deployment's speed) to the time since the load began, through the status's
// own "now".
func (s *stack) poll(ctx context.Context, virtual func(time.Time) time.Duration, emit func(Event)) {
	base := strings.TrimSuffix(s.statusURL, "/")
	var st statusView
	seenAt := time.Now()
	if s.getJSON(ctx, base+"/api/v1/status", &st) != nil || st.Now.IsZero() {
		return
	}
	var ev struct {
		Events []remediate.Record `json:"events"`
	}
	if s.getJSON(ctx, base+"/api/v1/events?limit=1000", &ev) != nil {
		return
	}
	at := func(t time.Time) time.Duration { return max(0, virtual(seenAt)-st.Now.Sub(t)) }

	s.mu.Lock()
	defer s.mu.Unlock()
	if a := st.Assessment; a.State != "" && a.State != s.mu.state {
		from := s.mu.state
		s.mu.state = a.State
		if from != "" { // the first state seen is where the daemon started, not a transition
			s.mu.states++
			emit(Event{Run: s.name, Kind: EventState, At: at(a.Since),
				Text: fmt.Sprintf("detector %s → %s%s", from, a.State, reasons(a.Reasons))})
		}
	}
	for _, r := range ev.Events {
		if r.Phase != remediate.PhaseDone && r.Phase != remediate.PhaseDryRun && r.Phase != remediate.PhaseFailed {
			continue
		}
		// A plan's budget and lending outcomes share its sequence number.
		key := fmt.Sprintf("%d/%s", r.Seq, r.Kind)
		if s.mu.seen[key] {
			continue
		}
		if s.mu.seen == nil {
			s.mu.seen = map[string]bool{}
		}
		s.mu.seen[key] = true
		if r.Budget != nil && r.Budget.From == r.Budget.To && r.Error == "" {
			continue // only B_ref moved (the gateway's reference budget): not worth a line
		}
		s.mu.actions++
		emit(Event{Run: s.name, Kind: EventAction, At: at(r.At), Text: describe(r)})
	}
}

func (s *stack) getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// describe is one line for an audited action.
func describe(r remediate.Record) string {
	verb := ""
	switch r.Phase {
	case remediate.PhaseDryRun:
		verb = "would "
	case remediate.PhaseFailed:
		verb = "failed to "
	}
	var what string
	switch {
	case r.Budget != nil:
		from := Tokens(r.Budget.From)
		if r.Budget.FromCountOnly {
			from = "count only"
		}
		what = fmt.Sprintf("%sset the session budget %s → %s tokens", verb, from, Tokens(r.Budget.To))
	case r.Shed != nil:
		what = fmt.Sprintf("%sshed queued session %s", verb, strings.Join(r.Shed.IDs, ", "))
	case r.Hold != nil:
		what = map[string]string{"": "", "would ": "would be ", "failed to ": "failed: "}[verb] + r.Hold.Summary()
	case r.Lending != nil:
		what = fmt.Sprintf("%sswitch KV lending on the decode pool %s", verb, map[bool]string{true: "on", false: "off"}[r.Lending.Enabled])
	default:
		what = verb + r.Kind
	}
	if r.Mode != "" {
		what += fmt.Sprintf(" (%s mode)", r.Mode)
	}
	if r.Error != "" {
		what += ": " + r.Error
	}
	return what
}

func reasons(rs []string) string {
	if len(rs) == 0 {
		return ""
	}
	return ": " + rs[0]
}

// Tokens writes a token count as the daemon's reasons do (remediate.FormatTokens); a budget out
// of reach — the gateways' starting one — is "∞".
func Tokens(n int64) string {
	if n >= unreachable {
		return "∞"
	}
	return remediate.FormatTokens(n)
}

// unreachable is where a budget counts as out of reach (the gateways start at 10^12).
const unreachable = 1e11

func writeSecret(dir, name, v string) error {
	return os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o600)
}

func writeTemplate(path, text string, data any) error {
	t, err := template.New(filepath.Base(path)).Option("missingkey=error").Parse(text)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	var b strings.Builder
	if err := t.Execute(&b, data); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return os.WriteFile(path, []byte(b.String()), 0o600)
}

// wallRetryAfter serves h with the Retry-After of its answers converted from seconds of the
// deployment's clock, which the gateway runs on, to wall seconds, which the load generator — like
// any client — waits (with decimals: at 90× a second of the deployment's is 11 ms).
func wallRetryAfter(h http.Handler, c *scaledclock.Clock) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&retryAfterWriter{ResponseWriter: w, clock: c}, r)
	})
}

// retryAfterWriter rewrites Retry-After as the header is written.
type retryAfterWriter struct {
	http.ResponseWriter
	clock   *scaledclock.Clock
	written bool
}

func (w *retryAfterWriter) WriteHeader(code int) {
	if !w.written && code >= http.StatusOK {
		w.written = true
		if v := w.Header().Get("Retry-After"); v != "" {
			if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
				wall := w.clock.WallDuration(time.Duration(s * float64(time.Second)))
				w.Header().Set("Retry-After", strconv.FormatFloat(wall.Seconds(), 'f', 3, 64))
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *retryAfterWriter) Write(b []byte) (int, error) {
	if !w.written {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the server's writer (flushes of streamed answers).
func (w *retryAfterWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func noErr(f func()) func() error { return func() error { f(); return nil } }
