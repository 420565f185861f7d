package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"time"
)

// tlRow holds the fields of a TraceLab normalized round-trace row that the import uses; the rows
// carry many more, which are ignored. Pointers because TraceLab writes null for what it does not
// know.
type tlRow struct {
	SessionID               *string   `json:"session_id"`
	RoundIndex              *int      `json:"round_index"`
	Project                 *string   `json:"project"`
	InputTokensTotal        *int      `json:"input_tokens_total"`
	PrefixTokens            *int      `json:"prefix_tokens"`
	OutputTokens            *int      `json:"output_tokens"`
	ReasoningOutputTokens   *int      `json:"reasoning_output_tokens"`
	CurrentUserMessageChars *int      `json:"current_user_message_chars"`
	FirstInputEventType     *string   `json:"first_input_event_type"`
	TimingEvents            []tlEvent `json:"timing_events"`
	Tools                   []tlTool  `json:"tools"`
}

type tlEvent struct {
	EventType string  `json:"event_type"`
	Timestamp *string `json:"timestamp"`
}

type tlTool struct {
	ToolWallLatencyMS *float64 `json:"tool_wall_latency_ms"`
}

// TraceLab event types.
const (
	tlUserMessage = "user_message"
	tlToolResult  = "tool_result"
	tlToolCall    = "tool_call"
	tlReasoning   = "reasoning"
	tlText        = "text"
)

// tlCall is a parsed TraceLab row waiting for its session: the gap before a round is measured from
// timestamps of the previous round.
type tlCall struct {
	call           Call
	human          bool          // opened by a user message; ignored for round 0
	lastToolCall   time.Time     // zero if the row has no timestamped tool_call
	lastToolResult time.Time     // zero if the row has no timestamped tool_result
	maxToolWall    time.Duration // longest tools[].tool_wall_latency_ms
	hasToolWall    bool
	tenant         string
	taskChars      int
}

// ReadTraceLab imports TraceLab "normalized round trace" rows (one row per LLM round, as in the
// TraceLab project's example sessions and public release), so that the simulator can replay real
// agent sessions. Sessions come sorted by their first call's start, then ID. The first bad row stops
// the import with a *ParseError naming its line and field; fields the import does not use are not
// checked.
func ReadTraceLab(r io.Reader) ([]Session, error) {
	groups, err := readGroups(r, parseTraceLabRow, "round_index")
	if err != nil {
		return nil, err
	}
	sessions := make([]Session, 0, len(groups))
	for _, g := range groups {
		sessions = append(sessions, assembleTraceLab(g))
	}
	sortSessions(sessions)
	return sessions, nil
}

func parseTraceLabRow(n int, line []byte) (placed[tlCall], error) {
	var none placed[tlCall]
	var row tlRow
	if err := json.Unmarshal(line, &row); err != nil {
		return none, jsonErr(n, err)
	}
	switch {
	case row.SessionID == nil:
		return none, lineErr(n, "session_id", "missing")
	case *row.SessionID == "":
		return none, lineErr(n, "session_id", "must not be empty")
	case checkName(*row.SessionID) != nil:
		return none, &ParseError{Line: n, Field: "session_id", Err: checkName(*row.SessionID)}
	case row.RoundIndex == nil:
		return none, lineErr(n, "round_index", "missing")
	case *row.RoundIndex < 0:
		return none, lineErr(n, "round_index", "must be >= 0, got %d", *row.RoundIndex)
	case *row.RoundIndex == 0 && row.Project != nil && checkName(*row.Project) != nil:
		return none, &ParseError{Line: n, Field: "project", Err: checkName(*row.Project)}
	case row.InputTokensTotal == nil:
		return none, lineErr(n, "input_tokens_total", "missing")
	case *row.InputTokensTotal <= 0:
		return none, lineErr(n, "input_tokens_total", "must be > 0, got %d", *row.InputTokensTotal)
	case row.OutputTokens == nil:
		return none, lineErr(n, "output_tokens", "missing")
	case *row.OutputTokens < 0:
		return none, lineErr(n, "output_tokens", "must be >= 0, got %d", *row.OutputTokens)
	case row.ReasoningOutputTokens != nil && *row.ReasoningOutputTokens < 0:
		return none, lineErr(n, "reasoning_output_tokens", "must be >= 0, got %d", *row.ReasoningOutputTokens)
	case row.ReasoningOutputTokens != nil && *row.ReasoningOutputTokens > math.MaxInt-*row.OutputTokens:
		return none, lineErr(n, "reasoning_output_tokens", "%d plus output_tokens %d overflows",
			*row.ReasoningOutputTokens, *row.OutputTokens)
	case *row.RoundIndex == 0 && row.CurrentUserMessageChars != nil && *row.CurrentUserMessageChars < 0:
		return none, lineErr(n, "current_user_message_chars", "must be >= 0, got %d", *row.CurrentUserMessageChars)
	}
	index := *row.RoundIndex
	tc := tlCall{}
	c := &tc.call
	c.Prompt = *row.InputTokensTotal
	// prefix_tokens is what the provider reported as a cache read; outside [0, prompt] it cannot be
	// a prefix of this prompt, so it is clamped rather than rejected.
	if row.PrefixTokens != nil {
		c.Reused = min(max(*row.PrefixTokens, 0), c.Prompt)
	}
	// Reasoning tokens are generated like any other output and occupy the KV cache the same way;
	// Codex rows count them apart from output_tokens, Claude rows leave them null.
	c.Output = *row.OutputTokens
	if row.ReasoningOutputTokens != nil {
		c.Output += *row.ReasoningOutputTokens
	}

	// Start is the first event (the user message or tool result that opened the round), End the
	// last event the model produced. When a round ran several tools, its first result comes before
	// the call could be sent, while the gap runs to the last result: Start may then be earlier than
	// the previous End plus GapBefore.
	haveStart := false
	for i, ev := range row.TimingEvents {
		if ev.Timestamp == nil {
			continue
		}
		t, err := parseTime(*ev.Timestamp)
		if err != nil {
			return none, &ParseError{Line: n, Field: fmt.Sprintf("timing_events[%d].timestamp", i), Err: err}
		}
		if !haveStart {
			haveStart, c.Start = true, t
		}
		switch ev.EventType {
		case tlToolCall:
			tc.lastToolCall = t
			c.End = t
		case tlReasoning, tlText:
			c.End = t
		case tlToolResult:
			tc.lastToolResult = t
		}
	}
	if !haveStart {
		return none, lineErr(n, "timing_events", "no event with a timestamp, so the round has no start")
	}
	if !c.End.IsZero() && c.End.Before(c.Start) {
		return none, lineErr(n, "timing_events", "last model event at %s is before the first event at %s",
			formatTime(c.End), formatTime(c.Start))
	}

	if row.FirstInputEventType != nil {
		tc.human = *row.FirstInputEventType == tlUserMessage
	} else if len(row.TimingEvents) > 0 {
		tc.human = row.TimingEvents[0].EventType == tlUserMessage
	}
	for i, tool := range row.Tools {
		if tool.ToolWallLatencyMS == nil {
			continue
		}
		ms := *tool.ToolWallLatencyMS
		if ms*1e6 >= 1<<63 || ms*1e6 <= -(1<<63) {
			return none, lineErr(n, fmt.Sprintf("tools[%d].tool_wall_latency_ms", i), "%g ms is out of range", ms)
		}
		d := time.Duration(math.Round(ms * 1e6))
		if !tc.hasToolWall || d > tc.maxToolWall {
			tc.maxToolWall = d
		}
		tc.hasToolWall = true
	}
	if row.Project != nil {
		tc.tenant = *row.Project
	}
	if row.CurrentUserMessageChars != nil {
		tc.taskChars = *row.CurrentUserMessageChars
	}
	return placed[tlCall]{session: *row.SessionID, index: index, line: n, row: tc}, nil
}

// assembleTraceLab builds a session from its rounds in order, measuring each gap from the
// previous round. Session fields come from round 0, where the task was given.
func assembleTraceLab(rows []placed[tlCall]) Session {
	s := Session{
		ID:        rows[0].session,
		Tenant:    rows[0].row.tenant,
		TaskChars: rows[0].row.taskChars,
		Calls:     make([]Call, len(rows)),
	}
	for i, r := range rows {
		c := r.row.call
		if i > 0 {
			c.Human = r.row.human
			c.GapBefore = max(0, traceLabGap(rows[i-1].row, r.row))
		}
		s.Calls[i] = c
	}
	return s
}

// traceLabGap is the idle time before round cur: for a human turn, from the previous round's last
// model event to the user's message; for a tool turn, the tools' run time, from the previous
// round's last tool call to the last tool result that cur lists. When those timestamps are missing
// it falls back to the longest tool wall latency (tools run in parallel), and then to the time
// between the rounds as the basin format's default does.
func traceLabGap(prev, cur tlCall) time.Duration {
	between := func() time.Duration {
		from := prev.call.End
		if from.IsZero() {
			from = prev.call.Start
		}
		return cur.call.Start.Sub(from)
	}
	switch {
	case cur.human:
		return between()
	case !prev.lastToolCall.IsZero() && !cur.lastToolResult.IsZero():
		return cur.lastToolResult.Sub(prev.lastToolCall)
	case prev.hasToolWall:
		return prev.maxToolWall
	default:
		return between()
	}
}
