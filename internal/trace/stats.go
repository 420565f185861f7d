package trace

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"
)

// SessionStats summarizes a session by the numbers that decide its cache footprint: how large its
// context grows, how much of each prompt a prefix cache can serve, and how long it sits idle
// holding cache. They are what one checks first when choosing a trace to replay.
type SessionStats struct {
	// ID is the session's ID.
	ID string
	// Calls is the number of model calls.
	Calls int
	// FirstPrompt is the prompt of call 0, mostly the shared system prompt and tool definitions.
	FirstPrompt int
	// PeakContext is the largest prompt+output of any call: the KV cache the session needs at most.
	PeakContext int
	// MedianPrompt is the median prompt length; with an even number of calls, the mean of the two
	// middle ones, rounded down.
	MedianPrompt int
	// ReuseFraction is FollowUpReused/FollowUpPrompt: the share of the later prompts a prefix cache
	// could serve. Call 0 is left out, since its reuse depends on other sessions.
	ReuseFraction float64
	// FollowUpReused and FollowUpPrompt are the sums of Reused and Prompt over the calls after the
	// first. They are kept so that WriteStats can weigh sessions by tokens when combining them.
	FollowUpReused, FollowUpPrompt int
	// ToolTime is the sum of the gaps spent in tools, HumanTime of those that were human turns.
	ToolTime, HumanTime time.Duration
	// Duration runs from the first call's start to the last call's end (its start if the end is
	// unknown).
	Duration time.Duration
}

// Summarize computes the statistics of one session. A session without calls gives zeros.
func Summarize(s Session) SessionStats {
	st := SessionStats{ID: s.ID, Calls: len(s.Calls)}
	if len(s.Calls) == 0 {
		return st
	}
	prompts := make([]int, len(s.Calls))
	for i, c := range s.Calls {
		prompts[i] = c.Prompt
		st.PeakContext = max(st.PeakContext, c.Prompt+c.Output)
		if i == 0 {
			continue
		}
		st.FollowUpReused += c.Reused
		st.FollowUpPrompt += c.Prompt
		if c.Human {
			st.HumanTime += c.GapBefore
		} else {
			st.ToolTime += c.GapBefore
		}
	}
	st.FirstPrompt = s.Calls[0].Prompt
	st.MedianPrompt = median(prompts)
	st.ReuseFraction = fraction(st.FollowUpReused, st.FollowUpPrompt)
	last := s.Calls[len(s.Calls)-1]
	end := last.End
	if end.IsZero() {
		end = last.Start
	}
	st.Duration = end.Sub(s.Calls[0].Start)
	return st
}

// WriteStats prints stats as an aligned table, one row per session and a final "all" row: the
// number of sessions, total calls, the median first prompt, the median peak context, reuse weighted
// by tokens (FollowUpReused and FollowUpPrompt), and total times. Times are in seconds, rounded to
// 0.1 s.
func WriteStats(w io.Writer, stats []SessionStats) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "session\tcalls\tfirst_prompt\tpeak_context\tmedian_prompt\treuse\ttool_s\thuman_s\tduration_s")
	var (
		all                  SessionStats
		firstPrompts, peaks  []int
		reusedSum, promptSum int
	)
	for _, st := range stats {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.3f\t%s\t%s\t%s\n", st.ID, st.Calls, st.FirstPrompt,
			st.PeakContext, st.MedianPrompt, st.ReuseFraction, seconds(st.ToolTime), seconds(st.HumanTime),
			seconds(st.Duration))
		all.Calls += st.Calls
		all.ToolTime += st.ToolTime
		all.HumanTime += st.HumanTime
		all.Duration += st.Duration
		firstPrompts = append(firstPrompts, st.FirstPrompt)
		peaks = append(peaks, st.PeakContext)
		reusedSum += st.FollowUpReused
		promptSum += st.FollowUpPrompt
	}
	label := fmt.Sprintf("all (%d sessions)", len(stats))
	if len(stats) == 1 {
		label = "all (1 session)"
	}
	fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t-\t%.3f\t%s\t%s\t%s\n", label, all.Calls, median(firstPrompts),
		median(peaks), fraction(reusedSum, promptSum), seconds(all.ToolTime), seconds(all.HumanTime),
		seconds(all.Duration))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write stats: %w", err)
	}
	return nil
}

// median returns the middle value, the mean of the two middle ones rounded down for an even count,
// and 0 for none.
func median(xs []int) int {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	a, b := s[m-1], s[m]
	return a + (b-a)/2
}

func fraction(num, den int) float64 {
	if den == 0 {
		return 0
	}
	return float64(num) / float64(den)
}

func seconds(d time.Duration) string {
	return fmt.Sprintf("%.1f", d.Round(100*time.Millisecond).Seconds())
}
