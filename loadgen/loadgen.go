package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/basin-dev/basin/sim"
)

// errKilled is the cause a session's context is cancelled with at its stream's KillAt.
var errKilled = errors.New("killed at the stream's kill_at")

// runner is one Run: options, the wall time it started, and the sessions under way.
type runner struct {
	o      Options
	so     sim.Options
	client *http.Client
	start  time.Time // wall
	ends   *ender

	// counts are the sessions so far by how they ended, for Progress; ended counts them all.
	counts struct {
		arrived, ended, completed, refused, failed, unfinished atomic.Int64
	}

	mu struct {
		sync.Mutex
		// killed marks the streams whose KillAt has passed; live holds each stream's sessions
		// still running, to cancel at KillAt.
		killed []bool
		live   []map[*session]struct{}
	}
}

// session is one offered session and, once it ends, what it got. The session's goroutine owns it
// until it returns.
type session struct {
	n        int
	id       string
	of       sim.Arrival
	class    string
	spec     sim.SessionSpec
	measured bool
	conv     *conversation
	jitter   *rand.Rand
	cancel   context.CancelCauseFunc
	// sent is set once a call has gone out: from then on the server may hold the session.
	sent bool

	started   time.Duration // virtual
	firstWait time.Duration // virtual; -1 until the first call's first token
	end       time.Duration // virtual
	outcome   Outcome
	retries   int
	waited    time.Duration // wall, on Retry-After
	calls     []callRecord
	err       error
}

// callRecord is what one successful call got.
type callRecord struct {
	specPrompt int
	prompt     int     // usage.prompt_tokens; -1 if the server sent no usage
	cached     int     // usage.prompt_tokens_details.cached_tokens; -1 if absent
	ttft       float64 // virtual seconds from sending to the first token; NaN if unknown
}

// Run drives the scenario's sessions against the target and reports them. It returns when every
// session that arrived has ended, or, once ctx is done, as soon as the calls in flight have been
// cancelled: the report then marks the run interrupted and counts those sessions unfinished, and
// sessions not yet arrived are not in it. The error is for bad options only.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("loadgen options: %w", err)
	}
	o = o.withDefaults()
	so, err := o.Scenario.Options("")
	if err != nil {
		return nil, fmt.Errorf("loadgen options: scenario %s: %w", o.Scenario.Name, err)
	}
	ofs, err := offers(so, o.MaxSessions)
	if err != nil {
		return nil, fmt.Errorf("loadgen options: scenario %s: %w", o.Scenario.Name, err)
	}
	r := &runner{o: o, so: so, client: o.HTTPClient}
	if r.client == nil {
		tr := newTransport()
		defer tr.CloseIdleConnections()
		r.client = &http.Client{Transport: tr}
	}
	r.ends = newEnder(r)
	r.mu.killed = make([]bool, len(so.Streams))
	r.mu.live = make([]map[*session]struct{}, len(so.Streams))
	for i := range so.Streams {
		r.mu.live[i] = map[*session]struct{}{}
	}
	o.Logger.Info("load run starting", "target", o.Target, "scenario", o.Scenario.Name, "seed", so.Seed,
		"speed", o.Speed, "sessions_offered", len(ofs), "run_id", o.RunID)
	r.start = o.Now()

	// Progress is reported until the sessions are done, then once more with the end.
	progCtx, stopProgress := context.WithCancel(ctx)
	progDone := make(chan struct{})
	go func() {
		defer close(progDone)
		if o.Progress == nil {
			return
		}
		for o.Sleep(progCtx, o.ProgressEvery) == nil && progCtx.Err() == nil {
			o.Progress(r.progress(len(ofs)))
		}
	}()

	// KillAt timers run until their time or the end of the run.
	killCtx, stopKills := context.WithCancel(ctx)
	var kills sync.WaitGroup
	for i, st := range so.Streams {
		if st.KillAt > 0 {
			kills.Go(func() { r.killAt(killCtx, i, st.KillAt) })
		}
	}

	// Ends that find no server are asked again until the sessions are done or ctx is.
	endCtx, stopEnds := context.WithCancel(ctx)
	endsDone := make(chan struct{})
	go func() {
		defer close(endsDone)
		r.ends.retry(endCtx)
	}()

	var (
		sessions []*session
		wg       sync.WaitGroup
		systems  = map[int]string{} // system prompts by Shared, built once
		cut      bool               // arrivals stopped early
	)
	for k, of := range ofs {
		if err := o.Sleep(ctx, r.wallFor(of.At)-o.Now().Sub(r.start)); err != nil || ctx.Err() != nil {
			cut = true
			break
		}
		s := r.newSession(k+1, of, systems)
		sessions = append(sessions, s)
		r.counts.arrived.Add(1)
		sctx, cancel := context.WithCancelCause(ctx)
		s.cancel = cancel
		wg.Go(func() {
			defer cancel(nil)
			r.runSession(sctx, s)
		})
	}
	wg.Wait()
	stopEnds()
	<-endsDone
	ends := r.ends.final(ctx)
	stopKills()
	kills.Wait()
	stopProgress()
	<-progDone
	if o.Progress != nil {
		o.Progress(r.progress(len(ofs)))
	}
	rep := r.report(sessions, cut)
	rep.SessionEnds = ends
	o.Logger.Info("load run done", "arrived", rep.Sessions.Arrived, "completed", rep.Sessions.Completed,
		"rejected", rep.Sessions.Rejected, "shed", rep.Sessions.Shed, "killed", rep.Sessions.Killed,
		"error", rep.Sessions.Error, "unfinished", rep.Sessions.Unfinished, "interrupted", rep.Interrupted,
		"sessions_ended", ends.Ended, "sessions_not_ended", ends.Failed)
	return rep, nil
}

// Progress is how a load run is going: virtual time and sessions so far.
type Progress struct {
	// Elapsed is the virtual time since the run began; Duration the scenario's.
	Elapsed, Duration time.Duration
	// Offered is how many sessions the scenario offers in all; Arrived how many have started, Live
	// those still running.
	Offered, Arrived, Live int
	// Completed, Refused (rejected or shed), Failed (errors, killed) and Unfinished (cut by an
	// interruption) count the sessions that ended, by how.
	Completed, Refused, Failed, Unfinished int
}

// count books a session's end for Progress.
func (r *runner) count(o Outcome) {
	switch o {
	case Completed:
		r.counts.completed.Add(1)
	case Rejected, Shed:
		r.counts.refused.Add(1)
	case Unfinished:
		r.counts.unfinished.Add(1)
	default:
		r.counts.failed.Add(1)
	}
	r.counts.ended.Add(1)
}

func (r *runner) progress(offered int) Progress {
	c := &r.counts
	arrived := int(c.arrived.Load())
	return Progress{
		Elapsed: min(r.virtual(r.o.Now()), r.so.Duration), Duration: r.so.Duration, Offered: offered,
		Arrived: arrived, Live: arrived - int(c.ended.Load()), Completed: int(c.completed.Load()),
		Refused: int(c.refused.Load()), Failed: int(c.failed.Load()), Unfinished: int(c.unfinished.Load()),
	}
}

// newTransport is the default client's transport: many sessions talk to one host at once, so keep
// as many idle connections as there may be sessions in flight.
func newTransport() *http.Transport {
	var tr *http.Transport
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		tr = dt.Clone()
	} else {
		tr = &http.Transport{}
	}
	tr.MaxIdleConns = 1024
	tr.MaxIdleConnsPerHost = 1024
	return tr
}

// virtual is the virtual time of a wall instant.
func (r *runner) virtual(t time.Time) time.Duration {
	return time.Duration(float64(t.Sub(r.start)) * r.o.Speed)
}

// wallFor is the wall duration of a virtual one.
func (r *runner) wallFor(v time.Duration) time.Duration {
	return time.Duration(float64(v) / r.o.Speed)
}

func (r *runner) newSession(n int, of sim.Arrival, systems map[int]string) *session {
	st := r.so.Streams[of.Stream]
	s := &session{
		n: n, id: r.o.RunID + "-" + strconv.Itoa(n), of: of, class: st.Class,
		spec:      st.Workload.Session(sim.SessionRNG(r.so.Seed, of.Stream, of.Index)),
		measured:  of.At >= r.so.MeasureFrom && of.At < r.so.MeasureTo,
		jitter:    jitterRNG(r.so.Seed, of.Stream, of.Index),
		firstWait: -1,
	}
	sys, ok := systems[s.spec.Shared]
	if !ok {
		sys = systemPrompt(s.spec.Shared)
		systems[s.spec.Shared] = sys
	}
	s.conv = newConversation(s.id, sys)
	return s
}

// killAt cancels, at the stream's KillAt, its sessions still running.
func (r *runner) killAt(ctx context.Context, stream int, at time.Duration) {
	if r.o.Sleep(ctx, r.wallFor(at)-r.o.Now().Sub(r.start)) != nil || ctx.Err() != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.killed[stream] = true
	n := 0
	for s := range r.mu.live[stream] {
		// One that arrived at or after KillAt but started before this timer fired lives on, as
		// in the simulator.
		if s.of.At < at {
			s.cancel(errKilled)
			n++
		}
	}
	r.o.Logger.Info("stream killed", "stream", r.so.Streams[stream].Class, "sessions", n)
}

// register adds a starting session to its stream's live set; false means it arrived before its
// stream's KillAt but starts after the kill, so it counts as killed at once.
func (r *runner) register(s *session) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.killed[s.of.Stream] && s.of.At < r.so.Streams[s.of.Stream].KillAt {
		return false
	}
	r.mu.live[s.of.Stream][s] = struct{}{}
	return true
}

func (r *runner) unregister(s *session) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.mu.live[s.of.Stream], s)
}

// runSession sends the session's calls in order and records how it ends. A session that sent a
// call and did not complete is then ended at the server (see ender), whatever stopped it.
func (r *runner) runSession(ctx context.Context, s *session) {
	s.started = r.virtual(r.o.Now())
	defer func() {
		s.end = r.virtual(r.o.Now())
		r.count(s.outcome)
		r.o.Logger.Debug("session ended", "session", s.id, "class", s.class, "outcome", s.outcome,
			"calls_done", len(s.calls), "calls", len(s.spec.Calls), "retries", s.retries, "err", s.err)
		if s.sent && s.outcome != Completed {
			r.ends.end(ctx, s.id)
		}
	}()
	if !r.register(s) {
		s.outcome, s.err = Killed, errKilled
		return
	}
	defer r.unregister(s)
	answer := ""
	for i, c := range s.spec.Calls {
		if i > 0 && c.GapBefore > 0 {
			if err := r.o.Sleep(ctx, r.wallFor(c.GapBefore)); err != nil || ctx.Err() != nil {
				r.fail(ctx, s, errors.New("tool pause interrupted"))
				return
			}
		}
		body, err := json.Marshal(r.request(s.conv.prompt(i, answer, c.Prompt), c.Output))
		if err != nil {
			s.outcome, s.err = Error, fmt.Errorf("call %d: encode request: %w", i, err)
			return
		}
		a, ok := r.call(ctx, s, i, body)
		if !ok {
			return
		}
		rec := callRecord{specPrompt: c.Prompt, prompt: -1, cached: -1, ttft: nan}
		if !a.first.IsZero() {
			if !r.o.NoStream {
				rec.ttft = (r.virtual(a.first) - r.virtual(a.sent)).Seconds()
			}
			if i == 0 {
				s.firstWait = r.virtual(a.first) - s.started
			}
		} else if i == 0 {
			s.firstWait = r.virtual(r.o.Now()) - s.started
		}
		if u := a.usage; u != nil {
			rec.prompt = u.PromptTokens
			if u.PromptTokensDetails != nil {
				rec.cached = u.PromptTokensDetails.CachedTokens
			}
		}
		s.calls = append(s.calls, rec)
		answer = a.content
	}
	s.outcome = Completed
}

// sentAttempt is an attempt with the wall time its request went out.
type sentAttempt struct {
	attempt
	sent time.Time
}

// call sends call i until it is answered, retrying deferrals within the session's budget. False
// means the session is over (its outcome is set).
func (r *runner) call(ctx context.Context, s *session, i int, body []byte) (sentAttempt, bool) {
	last := i == len(s.spec.Calls)-1
	for {
		sent := r.o.Now()
		s.sent = true
		a := r.send(ctx, s.id, last, body)
		if ctx.Err() != nil && a.verdict != vOK {
			r.fail(ctx, s, fmt.Errorf("call %d: %w", i, a.err))
			return sentAttempt{}, false
		}
		switch a.verdict {
		case vOK:
			return sentAttempt{a, sent}, true
		case vShed:
			s.outcome, s.err = Shed, fmt.Errorf("call %d: %w", i, a.err)
			return sentAttempt{}, false
		case vReject:
			s.outcome, s.err = Rejected, fmt.Errorf("call %d: %w", i, a.err)
			return sentAttempt{}, false
		case vError:
			s.outcome, s.err = Error, fmt.Errorf("call %d: %w", i, a.err)
			return sentAttempt{}, false
		}
		wait := time.Duration(float64(a.retryAfter) * (1 + r.o.JitterFraction*s.jitter.Float64()))
		switch {
		case s.retries >= r.o.RetryBudget:
			s.outcome, s.err = Rejected, fmt.Errorf("call %d: %w; retry budget of %d spent", i, a.err, r.o.RetryBudget)
			return sentAttempt{}, false
		case s.waited+wait > r.o.MaxRetryWait:
			s.outcome, s.err = Rejected, fmt.Errorf("call %d: %w; waiting %v more would pass max_retry_wait %v",
				i, a.err, wait.Round(time.Millisecond), r.o.MaxRetryWait)
			return sentAttempt{}, false
		}
		s.retries++
		s.waited += wait
		if err := r.o.Sleep(ctx, wait); err != nil || ctx.Err() != nil {
			r.fail(ctx, s, fmt.Errorf("call %d: retry wait interrupted", i))
			return sentAttempt{}, false
		}
	}
}

// fail ends a session whose context is done: killed at KillAt, or unfinished when the run was
// cancelled.
func (r *runner) fail(ctx context.Context, s *session, err error) {
	if errors.Is(context.Cause(ctx), errKilled) {
		s.outcome, s.err = Killed, errKilled
		return
	}
	if ctx.Err() != nil {
		s.outcome, s.err = Unfinished, context.Cause(ctx)
		return
	}
	s.outcome, s.err = Error, err
}
