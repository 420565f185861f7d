package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/enginemetrics"
)

// A simulated deployment announces its speed — virtual seconds per wall second — so that what
// watches it (basin's daemon, gateway, risk) converts the deployment's rates and windows, while
// its own timeouts stay in wall time. A real engine sends neither: its readers take speed 1.
const (
	// SpeedMetric is the gauge every /metrics/{instance} exports, without labels.
	SpeedMetric = "basin_sim_speed"
	// SpeedHeader is on every HTTP answer, the speed in decimal ("60").
	SpeedHeader = "X-Basin-Sim-Speed"
	speedHelp   = "Simulated seconds per wall-clock second of this simulated engine; real engines do not export it"
)

// Defaults of Options.
const (
	DefaultIdleTimeout  = 10 * time.Minute
	DefaultModelName    = enginemetrics.DefaultModelName
	DefaultMaxBodyBytes = 8 << 20
	// DefaultOutputTokens is a call's output when the request gives neither max_completion_tokens
	// nor max_tokens.
	DefaultOutputTokens = 256
)

const (
	// maxTick bounds how long the run loop sleeps, so that the virtual clock, streams and idle
	// sessions never lag the wall clock by more than this.
	maxTick = 20 * time.Millisecond
	// minTick keeps the loop from spinning when the next event is a few nanoseconds of wall time
	// away (or when an injected clock stands still).
	minTick = time.Millisecond
	// maxVirtual caps the virtual clock, far beyond any run, so that adding a timeout to it
	// cannot overflow.
	maxVirtual = time.Duration(1 << 62)
	// never is an expiry that does not come.
	never = time.Duration(math.MaxInt64)
	// outputStream tells the answers' random stream from the simulator's, which share the seed
	// ("outp" in ASCII).
	outputStream = 0x6f75_7470
)

// Options configure a served simulation. The zero value of every field but Sim and Speed has a
// default.
type Options struct {
	// Sim is the simulated deployment and engine policy. External is forced true; Streams, if set,
	// add the scenario's own generated traffic next to the HTTP clients'. A zero Duration makes the
	// run open-ended (the Streams never stop); a zero MeasureTo means Duration. A Gate or
	// Controller is called with the server's lock held and must not call back into the Server.
	Sim sim.Options
	// Speed is how many virtual seconds pass per wall second (60: an hour of traffic in a
	// minute). It must be > 0.
	Speed float64
	// IdleTimeout ends a session that has had no call in flight for this long, in virtual time
	// (DefaultIdleTimeout when zero): agents rarely say when they are done, and a forgotten
	// session would hold its prefix in the working set forever.
	IdleTimeout time.Duration
	// ModelName is the one model served (/v1/models, responses and the model_name label of the
	// engine metrics); DefaultModelName when empty.
	ModelName string
	// MaxBodyBytes bounds request bodies (DefaultMaxBodyBytes when zero); larger ones get 413.
	MaxBodyBytes int64
	// Now is the wall clock (time.Now when nil); it is called from several goroutines. Virtual
	// time is (Now() − the time of New) × Speed.
	Now func() time.Time
	// Logger receives call aborts, lending switches and session expiries (discarded when nil).
	Logger *slog.Logger
	// Workload, when set, gives the answers their lengths, as a model stops at its end of turn
	// whatever limit the client set: a session's calls take the output lengths of a session drawn
	// from it (its i-th call the drawn session's i-th call's; once those run out, another
	// session's), each at most the request's limit (max_completion_tokens, else max_tokens or
	// max_output_tokens, else what is left of the context), which ends it with finish_reason
	// "length" (Messages: stop_reason "max_tokens"; Responses: status "incomplete"). `basin sim
	// serve` passes the scenario's workload. Nil: every answer is exactly the request's limit
	// (DefaultOutputTokens without one) and ends with "stop", for tests that size calls exactly.
	// Either way, ignore_eos: true (SGLang's and vLLM's sampling parameter) asks for exactly the
	// limit, ended by it. Draws come from a random stream seeded with Sim.Seed.
	Workload sim.Workload
}

// withDefaults fills zero fields, and the simulator options a served simulation always takes.
func (o Options) withDefaults() Options {
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.ModelName == "" {
		o.ModelName = DefaultModelName
	}
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	o.Sim.External = true
	o.Sim.Forget = true // a served simulation runs for as long as it is up: keep memory flat
	if o.Sim.Duration == 0 {
		o.Sim.Duration = maxVirtual
	}
	if o.Sim.MeasureTo == 0 {
		o.Sim.MeasureTo = o.Sim.Duration
	}
	return o
}

// Validate reports every option New refuses, naming each; zero fields stand for their defaults.
// The simulated deployment itself is checked by New (sim.New).
func (o Options) Validate() error {
	o = o.withDefaults()
	var errs []error
	if !(o.Speed > 0) || math.IsInf(o.Speed, 0) {
		errs = append(errs, fmt.Errorf("speed: must be a finite number > 0, got %v", o.Speed))
	}
	if o.IdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("idle_timeout: must be > 0, got %v", o.IdleTimeout))
	}
	if !utf8.ValidString(o.ModelName) {
		errs = append(errs, fmt.Errorf("model_name: not valid UTF-8: %q", o.ModelName))
	}
	if o.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("max_body_bytes: must be > 0, got %d", o.MaxBodyBytes))
	}
	return errors.Join(errs...)
}

// Server runs one simulation against the wall clock and serves it over HTTP. Run drives the
// virtual clock; Handler serves the endpoints. Both are safe for concurrent use.
type Server struct {
	o         Options
	wallStart time.Time
	handler   http.Handler
	instances []string                // engine instances, in the simulator's order
	metrics   map[string]http.Handler // by instance
	maxTokens int                     // prompt + output must fit one decode instance's KV
	// speedHeader is Speed as SpeedHeader carries it on every answer.
	speedHeader string

	wake    chan struct{} // a Submit or a lever changed the next event; cap 1
	stopped chan struct{} // closed when Run returns
	running atomic.Bool
	ids     atomic.Uint64 // response ids

	// mu guards the simulator, which is single-threaded, and what the server keeps beside it.
	// Notify callbacks run on whichever goroutine drives the simulator, so always with mu held.
	mu struct {
		sync.Mutex
		sim        *sim.Sim
		sessions   map[string]*session // external sessions by simulator key
		pendingEnd []string            // sessions to end once their call is done
		nextExpiry time.Duration       // earliest idle expiry (virtual); never when none
		streaming  int                 // streaming calls that are decoding
		anon       uint64              // one-call sessions so far
		// chains are the Responses answers of live sessions by id, for the calls that continue
		// them (previous_response_id).
		chains map[string]chainLink
		// rng draws the workload's sessions whose output lengths the answers take.
		rng *rand.Rand
	}
}

// chainLink is a Responses answer a later call may continue: its session's key, and the
// conversation's length in tokens once it was written.
type chainLink struct {
	key     string
	context int
}

// session is an external session as the server sees it.
type session struct {
	key       string        // the simulator's key
	id        string        // the client's id; empty for a one-call session
	call      *call         // in flight; nil between calls
	idleSince time.Duration // virtual time its last call ended
	// endAfterCall ends the session when the call in flight is done (one-call sessions and
	// x-session-end).
	endAfterCall bool
	// responses are the ids of its Responses answers, forgotten with it.
	responses []string
	// calls counts the calls submitted; outputs are the lengths the workload gives its calls,
	// drawn as needed (Options.Workload).
	calls   int
	outputs []int
}

// New builds a server; the virtual clock starts now. It fails, naming the fields, if an option or
// the simulated deployment is invalid.
func New(o Options) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("serve options: %w", err)
	}
	o = o.withDefaults()
	sm, err := sim.New(o.Sim)
	if err != nil {
		return nil, fmt.Errorf("serve options: sim: %w", err)
	}
	s := &Server{
		o:         o,
		wallStart: o.Now(),
		maxTokens: o.Sim.Deployment.Decode.KVTokens,
		wake:      make(chan struct{}, 1),
		stopped:   make(chan struct{}),
		metrics:   map[string]http.Handler{},
	}
	s.mu.sim = sm
	s.mu.sessions = map[string]*session{}
	s.mu.chains = map[string]chainLink{}
	s.mu.nextExpiry = never
	s.mu.rng = rand.New(rand.NewPCG(o.Sim.Seed, outputStream))
	for _, st := range sm.Stats() {
		s.instances = append(s.instances, st.Name)
	}
	regs, err := enginemetrics.Registries(s.stats, s.instances, enginemetrics.Options{ModelName: o.ModelName})
	if err != nil {
		return nil, fmt.Errorf("serve: engine metrics: %w", err)
	}
	speed := prometheus.NewGauge(prometheus.GaugeOpts{Name: SpeedMetric, Help: speedHelp})
	speed.Set(o.Speed)
	for name, reg := range regs {
		if err := reg.Register(speed); err != nil {
			return nil, fmt.Errorf("serve: engine metrics of %s: %w", name, err)
		}
		s.metrics[name] = enginemetrics.Handler(reg)
	}
	s.speedHeader = strconv.FormatFloat(o.Speed, 'f', -1, 64)
	s.handler = s.routes()
	return s, nil
}

// Handler serves the endpoints listed in the package documentation. Calls make progress only
// while Run is running.
func (s *Server) Handler() http.Handler { return s.handler }

// Run drives the virtual clock until ctx is done, then returns nil; calls still waiting get 503.
// A server runs once: a second Run returns an error.
func (s *Server) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("serve: run: already started")
	}
	defer close(s.stopped)
	s.o.Logger.Info("simulator serving", "speed", s.o.Speed, "model", s.o.ModelName,
		"instances", s.instances, "idle_timeout", s.o.IdleTimeout)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		wait := s.tick()
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			s.mu.Lock()
			now := s.mu.sim.Now()
			s.mu.Unlock()
			s.o.Logger.Info("simulator stopped", "virtual_now", now)
			return nil
		case <-s.wake:
		case <-timer.C:
		}
	}
}

// tick brings the simulator up to the wall clock and says how long to sleep: until the wall time
// of the next event or idle expiry, within [minTick, maxTick].
func (s *Server) tick() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.virtualNow()
	s.advanceLocked(now)
	wait := maxTick
	if s.mu.streaming > 0 {
		// The simulator reports decode progress only when a batch changes; Stats brings every
		// decode instance up to now (as a metrics scrape does) and so emits Progress for each
		// running call, which paces the streams at most maxTick apart.
		s.mu.sim.Stats()
	}
	if next, ok := s.mu.sim.NextEvent(); ok {
		wait = min(wait, s.wallFor(next-now))
	}
	if s.mu.nextExpiry != never {
		wait = min(wait, s.wallFor(s.mu.nextExpiry-now))
	}
	return max(wait, minTick)
}

// kick wakes the run loop after something may have scheduled an earlier event.
func (s *Server) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// virtualNow is the virtual time matching the wall clock now.
func (s *Server) virtualNow() time.Duration {
	el := s.o.Now().Sub(s.wallStart)
	if el <= 0 {
		return 0
	}
	v := float64(el) * s.o.Speed
	if v >= float64(maxVirtual) {
		return maxVirtual
	}
	return time.Duration(v)
}

// wallFor converts a virtual interval to wall time.
func (s *Server) wallFor(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(math.Min(float64(d)/s.o.Speed, float64(maxTick)))
}

// advanceLocked runs the simulator up to t. It stops at every event time and idle expiry on the
// way so that sessions end at the virtual instant they should: right after their last call, or
// when their idle timeout runs out.
func (s *Server) advanceLocked(t time.Duration) {
	for {
		step := t
		if next, ok := s.mu.sim.NextEvent(); ok && next < step {
			step = next
		}
		step = min(step, s.mu.nextExpiry)
		s.mu.sim.RunUntil(step)
		s.flushEndsLocked()
		if s.mu.nextExpiry <= step {
			s.expireLocked(step)
		}
		if step >= t {
			return
		}
	}
}

// flushEndsLocked ends the sessions whose last call just finished.
func (s *Server) flushEndsLocked() {
	for len(s.mu.pendingEnd) > 0 {
		key := s.mu.pendingEnd[0]
		s.mu.pendingEnd = s.mu.pendingEnd[1:]
		if ss, ok := s.mu.sessions[key]; ok && ss.call == nil {
			s.endLocked(key)
		}
	}
	s.mu.pendingEnd = nil
}

// expireLocked ends the sessions idle for IdleTimeout at t and finds the next expiry.
func (s *Server) expireLocked(t time.Duration) {
	next := never
	for key, ss := range s.mu.sessions {
		if ss.call != nil || ss.endAfterCall {
			continue
		}
		exp := addSat(ss.idleSince, s.o.IdleTimeout)
		if exp <= t {
			s.endLocked(key)
			s.o.Logger.Info("session idle; ended", "session", ss.id, "idle_since", ss.idleSince, "virtual_now", t)
			continue
		}
		next = min(next, exp)
	}
	s.mu.nextExpiry = next
}

// endLocked ends a session in the server and in the simulator, aborting a call in flight.
func (s *Server) endLocked(key string) bool {
	ss, ok := s.mu.sessions[key]
	if !ok {
		return false
	}
	for _, id := range ss.responses {
		delete(s.mu.chains, id)
	}
	delete(s.mu.sessions, key)
	s.mu.sim.EndSession(key)
	return true
}

// addSat adds two non-negative durations, saturating at never.
func addSat(a, b time.Duration) time.Duration {
	if a > never-b {
		return never
	}
	return a + b
}

// stats is the engine metrics' source: the simulator's instance stats, current.
func (s *Server) stats() []sim.InstanceStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked(s.virtualNow())
	return s.mu.sim.Stats()
}

// call is one external call in flight and the events the simulator reported for it.
type call struct {
	srv    *Server
	sess   *session
	stream bool

	// Guarded by srv.mu (notify runs with it held).
	decoding bool
	finished bool

	evMu   sync.Mutex
	events []sim.CallEvent
	ready  chan struct{} // events were added; cap 1
}

func newCall(s *Server, stream bool) *call {
	return &call{srv: s, stream: stream, ready: make(chan struct{}, 1)}
}

// notify is the call's sim.ExternalCall.Notify. The simulator calls it with srv.mu held, so it
// updates the server's books directly; it must not call back into the simulator, so ending a
// session after its call is left to flushEndsLocked.
func (c *call) notify(ev sim.CallEvent) {
	if c.finished {
		return // the simulator may report progress of a call it is aborting
	}
	s := c.srv
	switch ev.Kind {
	case sim.FirstToken:
		c.decoding = true
		if c.stream {
			s.mu.streaming++
		}
	case sim.Done, sim.Aborted:
		c.finished = true
		if c.decoding && c.stream {
			s.mu.streaming--
		}
		if ss := c.sess; ss.call == c {
			ss.call = nil
			ss.idleSince = ev.At
			switch {
			case ev.Kind == sim.Aborted:
			case ss.endAfterCall:
				s.mu.pendingEnd = append(s.mu.pendingEnd, ss.key)
			default:
				s.mu.nextExpiry = min(s.mu.nextExpiry, addSat(ev.At, s.o.IdleTimeout))
			}
		}
	}
	c.evMu.Lock()
	c.events = append(c.events, ev)
	c.evMu.Unlock()
	select {
	case c.ready <- struct{}{}:
	default:
	}
}

// take returns the events reported since the last take.
func (c *call) take() []sim.CallEvent {
	c.evMu.Lock()
	defer c.evMu.Unlock()
	ev := c.events
	c.events = nil
	return ev
}
