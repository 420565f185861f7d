package sim

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"
)

// SessionCounts counts the sessions that arrived in the measurement window by outcome.
type SessionCounts struct {
	Arrived   int `json:"arrived"`
	Completed int `json:"completed"`
	Good      int `json:"good"`
	Rejected  int `json:"rejected"`
	Shed      int `json:"shed"`
	Killed    int `json:"killed"`
	// Late counts completed sessions that missed the slowdown clause (finished after
	// slo.slowdown × their unloaded time); SlowTokens those that missed the TPOT clause (fewer than
	// slo.tpot_fraction of their decode steps within slo.tpot_ms). A session can miss both, so
	// Completed − Good ≤ Late + SlowTokens.
	Late       int `json:"late"`
	SlowTokens int `json:"slow_tokens"`
}

// Result is the outcome of one run. Its JSON form is a contract: `basin sim run --json` prints it
// and later tooling reads it. Rates of an empty window are null, never zero.
type Result struct {
	Scenario string `json:"scenario"`
	Policy   Policy `json:"policy"`
	Seed     uint64 `json:"seed"`
	// GoodputPerHour counts sessions that arrived in the window and were good, per hour of window.
	GoodputPerHour float64 `json:"goodput_per_hour"`
	// NoSpikeGoodputPerHour is the same scenario's goodput without spikes or extra streams, same
	// seed; filled in by the runner that knows the scenario.
	NoSpikeGoodputPerHour *float64      `json:"no_spike_goodput_per_hour"`
	GoodputRatio          *float64      `json:"goodput_ratio_to_no_spike"`
	Sessions              SessionCounts `json:"sessions"`
	HitRateMeanWindow     *float64      `json:"hit_rate_mean_window"`
	HitRateEnd            *float64      `json:"hit_rate_end"`
	TTFTP50Window         *float64      `json:"ttft_p50_s_window"`
	FirstCallWaitP50      *float64      `json:"first_call_wait_p50_s"`
	FirstCallWaitP90      *float64      `json:"first_call_wait_p90_s"`
	// SlowdownP50 and SlowdownP90 are percentiles of the window's sessions' time in the system
	// over their unloaded time. A session that did not finish (refused, shed, killed or still
	// running when the drain ends) counts with its time until the end of the run, a lower bound
	// that is already past the SLO's slowdown for sessions the drain waited for.
	SlowdownP50       *float64 `json:"slowdown_p50"`
	SlowdownP90       *float64 `json:"slowdown_p90"`
	LiveSessionsEnd   int      `json:"live_sessions_end"`
	QueuedSessionsEnd int      `json:"queued_sessions_end"`
	WorkingSetEnd     int64    `json:"working_set_tokens_end"`
	CacheCapacityEnd  int64    `json:"cache_capacity_tokens_end"`
	PrefillBusyWindow *float64 `json:"prefill_busy_window"`
	// PrefillInstanceMinutesWindow and DecodeInstanceMinutesWindow are the GPU time each role
	// held over the window's minutes: instances starting, running or draining, integrated
	// (instances × window minutes when the run never scales).
	PrefillInstanceMinutesWindow float64 `json:"prefill_instance_minutes_window"`
	DecodeInstanceMinutesWindow  float64 `json:"decode_instance_minutes_window"`
	// FirstScaleOutMin is when an instance was first asked for (SetInstances raising a role's
	// count), in minutes from the start; absent when the run never scaled out.
	FirstScaleOutMin *float64 `json:"first_scale_out_min,omitempty"`
	CallsCompleted   int64    `json:"calls_completed"`
	MeasureFromMin   float64  `json:"measure_from_min"`
	MeasureToMin     float64  `json:"measure_to_min"`
	DurationMin      float64  `json:"duration_min"`

	// Detector is what basin's detector saw of the run, when a harness observed it (its own JSON
	// shape; see sim/harness). UtilisationAlertFirstMin is the first minute a conventional
	// utilisation alert would have fired, for comparison: null when none would have, or when no
	// detector observed the run (then detector is absent too).
	Detector                 any      `json:"detector,omitempty"`
	UtilisationAlertFirstMin *float64 `json:"utilisation_alert_first_min"`

	// Timeline has one row per simulated minute up to the duration.
	Timeline []Minute `json:"-"`
}

func ptr(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// result summarises the state at the end of the arrivals; goodput is filled in after the drain.
func (s *Sim) result() *Result {
	o := s.o
	r := &Result{Policy: o.Policy, Seed: o.Seed, LiveSessionsEnd: s.live, QueuedSessionsEnd: s.held,
		WorkingSetEnd: s.workingSet, CacheCapacityEnd: s.cacheCapacity(), CallsCompleted: s.calls,
		MeasureFromMin: o.MeasureFrom.Minutes(), MeasureToMin: o.MeasureTo.Minutes(), DurationMin: o.Duration.Minutes()}
	n := int(o.Duration / time.Minute)
	full := s.minutes
	if len(full) > n {
		full = full[:n]
	}
	r.Timeline = append([]Minute(nil), full...)
	if s.scaledOut {
		r.FirstScaleOutMin = ptr(s.firstScaleOut.Minutes())
	}
	from, to := int(o.MeasureFrom/time.Minute), int(o.MeasureTo/time.Minute)
	var prompt, hit, busy float64
	var ttft []float64
	var prefillTime, decodeTime time.Duration
	for i := from; i < to && i < len(full); i++ {
		prompt += full[i].PromptTokens
		hit += full[i].HitTokens
		busy += full[i].PrefillBusy
		ttft = append(ttft, full[i].ttftSamples...)
		prefillTime += full[i].instTime[rolePrefill]
		decodeTime += full[i].instTime[roleDecode]
	}
	r.PrefillInstanceMinutesWindow = float64(prefillTime) / float64(time.Minute)
	r.DecodeInstanceMinutesWindow = float64(decodeTime) / float64(time.Minute)
	if prompt > 0 {
		r.HitRateMeanWindow = ptr(hit / prompt)
	}
	if to > from {
		r.PrefillBusyWindow = ptr(busy / float64(min(to, len(full))-from))
	}
	r.TTFTP50Window = ptr(median(ttft))
	// End-of-run hit rate: the last five minutes, token-weighted, so one quiet minute does not
	// decide it.
	prompt, hit = 0, 0
	for i := max(0, len(full)-5); i < len(full); i++ {
		prompt += full[i].PromptTokens
		hit += full[i].HitTokens
	}
	if prompt > 0 {
		r.HitRateEnd = ptr(hit / prompt)
	}
	return r
}

// countMissed counts ss in its arrival minute's MissedArrivals when it will not be good: it
// finished outside the SLO, was refused, shed or killed, or is unfinished and already past its
// deadline. Run calls it after the drain, so a measured session is settled by then.
func (s *Sim) countMissed(r *Result, ss *session) {
	i := int(ss.arrival/time.Minute) - s.minuteBase
	if i < 0 || i >= len(r.Timeline) {
		return
	}
	switch ss.state {
	case stDone:
		if late, slow := s.missed(ss); !late && !slow {
			return
		}
	case stLive, stHeld:
		if s.now <= s.deadline(ss) {
			return // may still be good
		}
	}
	r.Timeline[i].MissedArrivals++
}

func (s *Sim) fillGoodput(r *Result) {
	var c SessionCounts
	var slow []float64
	for _, ss := range s.sessions {
		s.countMissed(r, ss)
		if !ss.measured {
			continue
		}
		c.Arrived++
		end := s.now
		if ss.state == stDone {
			end = ss.end
		}
		if ss.unloaded > 0 {
			slow = append(slow, float64(end-ss.arrival)/float64(ss.unloaded))
		}
		switch ss.state {
		case stDone:
			c.Completed++
			late, slow := s.missed(ss)
			if !late && !slow {
				c.Good++
			}
			if late {
				c.Late++
			}
			if slow {
				c.SlowTokens++
			}
		case stRejected:
			c.Rejected++
		case stShed:
			c.Shed++
		case stKilled:
			c.Killed++
		}
	}
	r.Sessions = c
	r.GoodputPerHour = float64(c.Good) / (s.o.MeasureTo - s.o.MeasureFrom).Hours()
	r.FirstCallWaitP50 = ptr(median(s.firstW))
	r.FirstCallWaitP90 = ptr(quantile(s.firstW, 0.9))
	r.SlowdownP50 = ptr(median(slow))
	r.SlowdownP90 = ptr(quantile(slow, 0.9))
}

// quantile is the q-quantile of v by linear interpolation between order statistics (NaN when v
// is empty); it sorts v.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	pos := q * float64(len(v)-1)
	i := int(pos)
	if i+1 >= len(v) {
		return v[len(v)-1]
	}
	return v[i] + (pos-float64(i))*(v[i+1]-v[i])
}

// WriteTimelineCSV writes the per-minute timeline with a header row. Empty values mean "nothing
// to measure that minute" (no prefill, no first token), not zero.
func WriteTimelineCSV(w io.Writer, tl []Minute) error {
	cw := csv.NewWriter(w)
	f := func(v float64, prec int) string {
		if math.IsNaN(v) {
			return ""
		}
		return strconv.FormatFloat(v, 'f', prec, 64)
	}
	if err := cw.Write([]string{"minute", "arrivals", "live_sessions", "live_base_sessions", "queued_sessions", "held_calls", "working_set_tokens",
		"cache_capacity_tokens", "hit_rate", "ttft_p50_s", "completions", "good_completions", "calls_completed",
		"prefill_busy", "prefill_instances", "decode_instances", "prefill_instance_minutes", "decode_instance_minutes", "missed_arrivals"}); err != nil {
		return fmt.Errorf("write timeline: %w", err)
	}
	for _, m := range tl {
		row := []string{strconv.Itoa(m.Minute), strconv.Itoa(m.Arrivals), strconv.Itoa(m.LiveSessions), strconv.Itoa(m.LiveBase),
			strconv.Itoa(m.QueuedSessions), strconv.Itoa(m.HeldCalls), strconv.FormatInt(m.WorkingSetTokens, 10),
			strconv.FormatInt(m.CacheCapacity, 10), f(m.HitRate, 4), f(m.TTFTP50, 3), strconv.Itoa(m.Completions),
			strconv.Itoa(m.GoodCompletions), strconv.Itoa(m.CallsCompleted), f(m.PrefillBusy, 4),
			strconv.Itoa(m.PrefillInstances), strconv.Itoa(m.DecodeInstances), f(m.PrefillInstanceMinutes, 3),
			f(m.DecodeInstanceMinutes, 3), strconv.Itoa(m.MissedArrivals)}
		if err := cw.Write(row); err != nil {
			return fmt.Errorf("write timeline: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write timeline: %w", err)
	}
	return nil
}
