package loadgen

import (
	"math"
	"slices"
)

// Outcome is how a session ended.
type Outcome string

// Outcomes of a session.
const (
	// Completed: every call was answered.
	Completed Outcome = "completed"
	// Rejected: refused (503 or 429) past the retry budget or the longest wait, or by a 429 with
	// Reject429Terminal.
	Rejected Outcome = "rejected"
	// Shed: refused with 529, retrying soon would not help.
	Shed Outcome = "shed"
	// Killed: its stream's KillAt passed while it was running.
	Killed Outcome = "killed"
	// Error: another status, a transport error or a broken answer.
	Error Outcome = "error"
	// Unfinished: the run was cancelled while it was running.
	Unfinished Outcome = "unfinished"
)

// Counts counts the sessions that arrived in the measurement window by outcome.
type Counts struct {
	Arrived   int `json:"arrived"`
	Completed int `json:"completed"`
	// Good is null when the run had no Unloaded function to set deadlines.
	Good       *int `json:"good"`
	Rejected   int  `json:"rejected"`
	Shed       int  `json:"shed"`
	Killed     int  `json:"killed"`
	Error      int  `json:"error"`
	Unfinished int  `json:"unfinished"`
}

// Report is the outcome of a load run. Its JSON form is what `basin loadgen` prints. Aggregates
// cover the sessions that arrived in the measurement window; rates and medians with nothing to
// measure are null, never zero. Durations are virtual seconds.
type Report struct {
	Target   string  `json:"target"`
	Scenario string  `json:"scenario"`
	Seed     uint64  `json:"seed"`
	Speed    float64 `json:"speed"`
	RunID    string  `json:"run_id"`
	// MeasureFromMin and MeasureToMin bound the window of arrivals the aggregates count.
	MeasureFromMin float64 `json:"measure_from_min"`
	MeasureToMin   float64 `json:"measure_to_min"`
	// Interrupted is set when the run was cancelled before every session ended.
	Interrupted bool `json:"interrupted"`
	// Offered is how many sessions arrived in the whole run, in the window or not.
	Offered  int    `json:"offered"`
	Sessions Counts `json:"sessions"`
	// GoodputPerHour is good sessions per hour of window; null without Unloaded, or when no
	// session arrived in the window.
	GoodputPerHour *float64 `json:"goodput_per_hour"`
	// CompletionRate is completed / arrived.
	CompletionRate *float64 `json:"completion_rate"`
	// FirstCallWaitP50 is the median, over sessions whose first call was answered, of the time
	// from the session's start (its arrival at the client) to the first call's first token, retry
	// waits included; without streaming, to the whole answer.
	FirstCallWaitP50 *float64 `json:"first_call_wait_p50_s"`
	// TTFTP50 is the median over answered streamed calls of the time from sending the answered
	// attempt to its first token; null without streaming.
	TTFTP50 *float64 `json:"ttft_p50_s"`
	// PrefixHitRate is the share of prompt tokens the server reported as cached
	// (usage.prompt_tokens_details.cached_tokens ÷ usage.prompt_tokens), over the answered calls
	// that reported both; null when none did.
	PrefixHitRate *float64 `json:"prefix_hit_rate"`
	// Retries counts the refused calls sent again.
	Retries int `json:"retries"`
	// SessionEnds counts the sessions, in the window or not, that did not end with their last
	// call and were ended at the server when they stopped (see EndTimeout).
	SessionEnds SessionEnds     `json:"session_ends"`
	PerSession  []SessionResult `json:"per_session,omitempty"`
}

// SessionResult is one session's record.
type SessionResult struct {
	ID    string `json:"id"`
	Class string `json:"class"`
	// Index is the session's index in its stream: with the seed it fixes the session's spec.
	Index uint64 `json:"index"`
	// Measured is whether it arrived in the measurement window.
	Measured bool `json:"measured"`
	// ArrivalS is its scheduled arrival; StartS and EndS when it actually began and ended.
	ArrivalS       float64  `json:"arrival_s"`
	StartS         float64  `json:"start_s"`
	EndS           float64  `json:"end_s"`
	FirstCallWaitS *float64 `json:"first_call_wait_s"`
	Outcome        Outcome  `json:"outcome"`
	Calls          int      `json:"calls"`
	CallsDone      int      `json:"calls_done"`
	Retries        int      `json:"retries"`
	TTFTP50S       *float64 `json:"ttft_p50_s"`
	// UnloadedS is Options.Unloaded's estimate; Good whether it completed within SLO.Slowdown ×
	// UnloadedS of its start. Both null without Unloaded.
	UnloadedS *float64 `json:"unloaded_s"`
	Good      *bool    `json:"good"`
	// MaxPromptError is the largest |usage.prompt_tokens − spec prompt| / spec prompt over its
	// answered calls: how far the server's token count strays from the spec's.
	MaxPromptError *float64 `json:"max_prompt_error"`
	Error          string   `json:"error,omitempty"`

	calls []callRecord
}

var nan = math.NaN()

// report summarises the sessions once they have all ended. cut says the arrivals stopped early:
// the run was interrupted then, or if a session is unfinished.
func (r *runner) report(sessions []*session, cut bool) *Report {
	so := r.so
	rep := &Report{
		Target: r.o.Target, Scenario: r.o.Scenario.Name, Seed: so.Seed, Speed: r.o.Speed, RunID: r.o.RunID,
		MeasureFromMin: so.MeasureFrom.Minutes(), MeasureToMin: so.MeasureTo.Minutes(),
		Interrupted: cut, Offered: len(sessions),
	}
	var (
		good             int
		waits, ttfts     []float64
		cached, prompted int64
	)
	c := &rep.Sessions
	for _, s := range sessions {
		rep.Interrupted = rep.Interrupted || s.outcome == Unfinished
		res := r.result(s)
		if r.o.PerSession {
			rep.PerSession = append(rep.PerSession, res)
		}
		if !s.measured {
			continue
		}
		c.Arrived++
		switch s.outcome {
		case Completed:
			c.Completed++
		case Rejected:
			c.Rejected++
		case Shed:
			c.Shed++
		case Killed:
			c.Killed++
		case Error:
			c.Error++
		default:
			c.Unfinished++
		}
		if res.Good != nil && *res.Good {
			good++
		}
		rep.Retries += s.retries
		if s.firstWait >= 0 {
			waits = append(waits, s.firstWait.Seconds())
		}
		for _, cr := range s.calls {
			if !math.IsNaN(cr.ttft) {
				ttfts = append(ttfts, cr.ttft)
			}
			// A server may count more cached than prompt tokens (SGLang's decode radix cache
			// double counts under PD); no call is more than wholly cached.
			if cr.prompt > 0 && cr.cached >= 0 {
				cached += int64(min(cr.cached, cr.prompt))
				prompted += int64(cr.prompt)
			}
		}
	}
	if prompted > 0 {
		rep.PrefixHitRate = ptr(float64(cached) / float64(prompted))
	}
	if r.o.Unloaded != nil {
		c.Good = &good
		// With no session in the window (a run cut off before it) there is nothing to measure:
		// null, not a goodput of zero.
		if c.Arrived > 0 {
			rep.GoodputPerHour = ptr(float64(good) / (so.MeasureTo - so.MeasureFrom).Hours())
		}
	}
	if c.Arrived > 0 {
		rep.CompletionRate = ptr(float64(c.Completed) / float64(c.Arrived))
	}
	rep.FirstCallWaitP50 = ptr(median(waits))
	rep.TTFTP50 = ptr(median(ttfts))
	return rep
}

// result is a session's record; it calls Unloaded.
func (r *runner) result(s *session) SessionResult {
	res := SessionResult{
		ID: s.id, Class: s.class, Index: s.of.Index, Measured: s.measured,
		ArrivalS: s.of.At.Seconds(), StartS: s.started.Seconds(), EndS: s.end.Seconds(),
		Outcome: s.outcome, Calls: len(s.spec.Calls), CallsDone: len(s.calls), Retries: s.retries,
		calls: s.calls,
	}
	if s.err != nil {
		res.Error = s.err.Error()
	}
	if s.firstWait >= 0 {
		res.FirstCallWaitS = ptr(s.firstWait.Seconds())
	}
	var ttfts []float64
	maxErr := nan
	for _, cr := range s.calls {
		if !math.IsNaN(cr.ttft) {
			ttfts = append(ttfts, cr.ttft)
		}
		if cr.prompt >= 0 && cr.specPrompt > 0 {
			e := math.Abs(float64(cr.prompt-cr.specPrompt)) / float64(cr.specPrompt)
			if math.IsNaN(maxErr) || e > maxErr {
				maxErr = e
			}
		}
	}
	res.TTFTP50S = ptr(median(ttfts))
	res.MaxPromptError = ptr(maxErr)
	if r.o.Unloaded != nil {
		u := r.o.Unloaded(s.spec)
		g := s.outcome == Completed &&
			float64(s.end-s.started) <= r.so.SLO.Slowdown*float64(u)
		res.UnloadedS, res.Good = ptr(u.Seconds()), &g
	}
	return res
}

// ptr is v's address, or nil for NaN and infinities (JSON null).
func ptr(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// median of v (sorted in place); NaN when empty.
func median(v []float64) float64 {
	if len(v) == 0 {
		return nan
	}
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}
