package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// basinRow is one line of a basin trace as read. Pointers tell an absent field from a zero one:
// absence means an error for required fields and a computed default for some optional ones.
type basinRow struct {
	SessionID    *string         `json:"session_id"`
	Call         *int            `json:"call"`
	Start        *string         `json:"start"`
	End          *string         `json:"end"`
	PromptTokens *int            `json:"prompt_tokens"`
	ReusedTokens *int            `json:"reused_tokens"`
	OutputTokens *int            `json:"output_tokens"`
	GapBeforeS   json.RawMessage `json:"gap_before_s"` // raw, to convert decimal seconds exactly
	Turn         *string         `json:"turn"`
	Tenant       *string         `json:"tenant"`
	TaskChars    *int            `json:"task_chars"`
}

// basinCall is a parsed row waiting for its session: the defaults of reused_tokens and gap_before_s
// depend on the previous call, and the session fields must agree across rows.
type basinCall struct {
	call      Call
	hasReused bool
	hasGap    bool
	tenant    *string
	taskChars *int
}

// Turn values of the basin format.
const (
	turnFirst = "first"
	turnTool  = "tool"
	turnHuman = "human"
)

// ReadBasin reads a trace in basin's own format (see FORMAT.md), filling in the defaults of absent
// optional fields. Sessions come sorted by their first call's start, then ID. The first bad row
// stops the read with a *ParseError naming its line and field.
func ReadBasin(r io.Reader) ([]Session, error) {
	groups, err := readGroups(r, parseBasinRow, "call")
	if err != nil {
		return nil, err
	}
	sessions := make([]Session, 0, len(groups))
	for _, g := range groups {
		s, err := assembleBasin(g)
		if err != nil {
			return nil, err
		}
		sessions = append(sessions, s)
	}
	sortSessions(sessions)
	return sessions, nil
}

func parseBasinRow(n int, line []byte) (placed[basinCall], error) {
	var none placed[basinCall]
	var row basinRow
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&row); err != nil {
		return none, jsonErr(n, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return none, lineErr(n, "", "invalid JSON: more than one value on the line")
	}

	switch {
	case row.SessionID == nil:
		return none, lineErr(n, "session_id", "missing")
	case *row.SessionID == "":
		return none, lineErr(n, "session_id", "must not be empty")
	case checkName(*row.SessionID) != nil:
		return none, &ParseError{Line: n, Field: "session_id", Err: checkName(*row.SessionID)}
	case row.Tenant != nil && checkName(*row.Tenant) != nil:
		return none, &ParseError{Line: n, Field: "tenant", Err: checkName(*row.Tenant)}
	case row.Call == nil:
		return none, lineErr(n, "call", "missing")
	case *row.Call < 0:
		return none, lineErr(n, "call", "must be >= 0, got %d", *row.Call)
	case row.Start == nil:
		return none, lineErr(n, "start", "missing")
	case row.PromptTokens == nil:
		return none, lineErr(n, "prompt_tokens", "missing")
	case row.OutputTokens == nil:
		return none, lineErr(n, "output_tokens", "missing")
	case row.TaskChars != nil && *row.TaskChars < 0:
		return none, lineErr(n, "task_chars", "must be >= 0, got %d", *row.TaskChars)
	}
	index := *row.Call
	bc := basinCall{tenant: row.Tenant, taskChars: row.TaskChars}
	c := &bc.call
	var err error
	if c.Start, err = parseTime(*row.Start); err != nil {
		return none, &ParseError{Line: n, Field: "start", Err: err}
	}
	if row.End != nil {
		if c.End, err = parseTime(*row.End); err != nil {
			return none, &ParseError{Line: n, Field: "end", Err: err}
		}
	}
	c.Prompt = *row.PromptTokens
	c.Output = *row.OutputTokens
	if row.ReusedTokens != nil {
		bc.hasReused = true
		c.Reused = *row.ReusedTokens
	}
	if raw := row.GapBeforeS; len(raw) > 0 && string(raw) != "null" {
		if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
			return none, lineErr(n, "gap_before_s", "want a number of seconds, got %s", raw)
		}
		bc.hasGap = true
		if c.GapBefore, err = parseSeconds(json.Number(raw)); err != nil {
			return none, &ParseError{Line: n, Field: "gap_before_s", Err: err}
		}
	}
	if row.Turn != nil {
		switch turn := *row.Turn; {
		case turn != turnFirst && turn != turnTool && turn != turnHuman:
			return none, lineErr(n, "turn", "must be %q, %q or %q, got %q", turnFirst, turnTool, turnHuman, turn)
		case index == 0 && turn != turnFirst:
			return none, lineErr(n, "turn", "call 0 must be %q, got %q", turnFirst, turn)
		case index > 0 && turn == turnFirst:
			return none, lineErr(n, "turn", "%q is only for call 0, this is call %d", turnFirst, index)
		default:
			c.Human = turn == turnHuman
		}
	}
	// Absent reused_tokens and gap_before_s are still 0 here, which always passes; their defaults
	// are filled in once the previous call is known.
	if field, err := checkCall(index, *c); err != nil {
		return none, &ParseError{Line: n, Field: field, Err: err}
	}
	return placed[basinCall]{session: *row.SessionID, index: index, line: n, row: bc}, nil
}

// assembleBasin builds a session from its rows in call order, filling the defaults that depend on
// the previous call and checking that rows stating tenant or task_chars agree.
func assembleBasin(rows []placed[basinCall]) (Session, error) {
	s := Session{ID: rows[0].session, Calls: make([]Call, len(rows))}
	tenantLine, charsLine := 0, 0
	for i, r := range rows {
		if t := r.row.tenant; t != nil {
			if tenantLine == 0 {
				s.Tenant, tenantLine = *t, r.line
			} else if *t != s.Tenant {
				return Session{}, lineErr(r.line, "tenant", "session %q: %q differs from %q on line %d",
					s.ID, *t, s.Tenant, tenantLine)
			}
		}
		if tc := r.row.taskChars; tc != nil {
			if charsLine == 0 {
				s.TaskChars, charsLine = *tc, r.line
			} else if *tc != s.TaskChars {
				return Session{}, lineErr(r.line, "task_chars", "session %q: %d differs from %d on line %d",
					s.ID, *tc, s.TaskChars, charsLine)
			}
		}
		c := r.row.call
		if i > 0 {
			prev := s.Calls[i-1]
			if !r.row.hasReused {
				c.Reused = minSum(c.Prompt, prev.Prompt, prev.Output)
			}
			if !r.row.hasGap {
				from := prev.End
				if from.IsZero() {
					from = prev.Start
				}
				c.GapBefore = max(0, c.Start.Sub(from))
			}
		}
		s.Calls[i] = c
	}
	return s, nil
}

// minSum returns min(limit, a+b) for non-negative a and b without overflowing.
func minSum(limit, a, b int) int {
	if a >= limit || b >= limit-a {
		return limit
	}
	return a + b
}

// WriteBasin writes sessions in basin's own format, one row per call, sessions in the given order,
// every field explicit except an unknown end. It checks all sessions against the format's rules
// before writing anything, so that whatever it writes ReadBasin reads back equal (given sessions in
// ReadBasin's order), and a bad session leaves no half-written file.
func WriteBasin(w io.Writer, sessions []Session) error {
	seen := make(map[string]bool, len(sessions))
	for i, s := range sessions {
		switch {
		case s.ID == "":
			return fmt.Errorf("write basin trace: session %d: empty ID", i)
		case checkName(s.ID) != nil:
			return fmt.Errorf("write basin trace: session %d: ID %w", i, checkName(s.ID))
		case checkName(s.Tenant) != nil:
			return fmt.Errorf("write basin trace: session %q: tenant %w", s.ID, checkName(s.Tenant))
		case seen[s.ID]:
			return fmt.Errorf("write basin trace: session %q appears twice", s.ID)
		case len(s.Calls) == 0:
			return fmt.Errorf("write basin trace: session %q has no calls", s.ID)
		case s.TaskChars < 0:
			return fmt.Errorf("write basin trace: session %q: task_chars: must be >= 0, got %d", s.ID, s.TaskChars)
		}
		seen[s.ID] = true
		for j, c := range s.Calls {
			if field, err := checkCall(j, c); err != nil {
				return fmt.Errorf("write basin trace: session %q call %d: %s: %w", s.ID, j, field, err)
			}
		}
	}

	bw := bufio.NewWriter(w)
	enc := newRowEncoder(bw)
	for _, s := range sessions {
		for j, c := range s.Calls {
			if err := enc.Encode(sessionRow(s, j, c).out()); err != nil {
				return fmt.Errorf("write basin trace: session %q call %d: %w", s.ID, j, err)
			}
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write basin trace: %w", err)
	}
	return nil
}

// sessionRow places call j of s in a row.
func sessionRow(s Session, j int, c Call) Row {
	return Row{SessionID: s.ID, Index: j, Tenant: s.Tenant, TaskChars: s.TaskChars, Call: c}
}
