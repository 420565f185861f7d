package trace

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// MaxLineBytes is the longest line, not counting its line ending, that ReadBasin and ReadTraceLab
// accept. A bound keeps a corrupt file (one endless line) from being buffered whole; a real row is
// a few kilobytes even with dozens of tool events.
const MaxLineBytes = 1 << 20

// maxNameBytes bounds session IDs and tenants. JSON escaping can make a string up to six times
// longer, and WriteBasin repeats both on every row: with this bound any session the readers accept
// is written in rows that fit MaxLineBytes, so it reads back.
const maxNameBytes = 64 << 10

// checkName holds a session ID or tenant to maxNameBytes.
func checkName(s string) error {
	if len(s) > maxNameBytes {
		return fmt.Errorf("longer than %d bytes", maxNameBytes)
	}
	return nil
}

// Call is one model call of an agent session. It keeps what decides the serving cost of the call
// (how long the prompt is, how much of it a prefix cache could already hold, how much is generated)
// and how long the session idled before it, which is when its cached context is at risk of eviction.
type Call struct {
	// Start is when the call was sent.
	Start time.Time
	// End is when the last output token arrived; zero when the trace does not say.
	End time.Time
	// Prompt is the prompt length in tokens.
	Prompt int
	// Reused is how many tokens at the start of Prompt were sent before: by the previous call of the
	// session, or, for the first call, by other sessions (system prompt, tool definitions). Only
	// these can be cache hits.
	Reused int
	// Output is the number of generated tokens.
	Output int
	// GapBefore is the time between the end of the previous call and this call, spent in a tool or
	// by a person; zero for the first call. The session holds cache without using it meanwhile.
	GapBefore time.Duration
	// Human marks a gap that was a person's turn rather than a tool run: think time is longer and
	// far less predictable, so a replay or a predictor treats the two apart.
	Human bool
}

// Session is one agent session: its calls in order, and what is known about the task that started
// it. Calls are kept in order because each call's reuse and gap refer to the one before.
type Session struct {
	// ID names the session uniquely within its trace.
	ID string
	// Tenant is who the session ran for (a project or customer), so a replay can split load by
	// tenant; empty when unknown.
	Tenant string
	// TaskChars is the length of the task text in characters, an input for predicting a session's
	// peak context before it has run; zero when unknown.
	TaskChars int
	// Calls are the model calls, Calls[i] being call i.
	Calls []Call
}

// ParseError reports a bad row of a trace file. It keeps the line and field apart from the reason
// so that a tool can point at the spot; errors.As finds it under any wrapping.
type ParseError struct {
	// Line is the 1-based line number.
	Line int
	// Field is the JSON field at fault, in the file's own naming ("timing_events[2].timestamp"), or
	// empty when the line as a whole is wrong (invalid JSON, too long).
	Field string
	// Err is the reason.
	Err error
}

// Error gives "line N: field: reason", or "line N: reason" without a field.
func (e *ParseError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("line %d: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("line %d: %s: %v", e.Line, e.Field, e.Err)
}

// Unwrap gives the reason, so that errors.Is sees through to it (a *time.ParseError, for one).
func (e *ParseError) Unwrap() error { return e.Err }

// lineErr builds a *ParseError from a format and arguments.
func lineErr(line int, field, format string, args ...any) error {
	return &ParseError{Line: line, Field: field, Err: fmt.Errorf(format, args...)}
}

// scanLines calls fn for each non-blank line of r with its 1-based number. It stops at the first
// error, so errors come in line order.
func scanLines(r io.Reader, fn func(n int, line []byte) error) error {
	sc := bufio.NewScanner(r)
	// Two bytes of room for "\r\n", so that a line of exactly MaxLineBytes passes; anything longer is
	// caught either by the check below or by the scanner running out of buffer.
	sc.Buffer(make([]byte, 0, 64<<10), MaxLineBytes+2)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Bytes()
		if len(line) > MaxLineBytes {
			return tooLong(n)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if err := fn(n, line); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return tooLong(n + 1)
		}
		return fmt.Errorf("read line %d: %w", n+1, err)
	}
	return nil
}

func tooLong(line int) error {
	return lineErr(line, "", "line is longer than %d bytes (1 MiB), the most a trace row may take", MaxLineBytes)
}

// jsonErr turns an encoding/json error for one line into a *ParseError naming the field where
// encoding/json knows it.
func jsonErr(line int, err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		if typeErr.Field == "" {
			return lineErr(line, "", "row must be a JSON object, got %s", typeErr.Value)
		}
		return lineErr(line, typeErr.Field, "want %s, got %s", typeErr.Type, typeErr.Value)
	}
	// DisallowUnknownFields reports `json: unknown field "name"` and has no error type of its own.
	if _, quoted, ok := strings.Cut(err.Error(), "unknown field "); ok {
		if name, uerr := strconv.Unquote(quoted); uerr == nil {
			return lineErr(line, name, "unknown field")
		}
	}
	return &ParseError{Line: line, Err: fmt.Errorf("invalid JSON: %w", err)}
}

// parseTime reads an RFC 3339 timestamp and returns it in UTC, so that equal instants are equal
// values whatever offset the file used. It rejects instants whose UTC year has no RFC 3339 form,
// because such a Call could not be written back.
func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("invalid RFC 3339 timestamp: %w", err)
	}
	t = t.UTC()
	if err := checkYear(t); err != nil {
		return time.Time{}, err
	}
	return t, nil
}

func checkYear(t time.Time) error {
	if y := t.UTC().Year(); y < 0 || y > 9999 {
		return fmt.Errorf("year %d in UTC is outside 0000-9999", y)
	}
	return nil
}

// placed is one row of a trace file with where it belongs: its session, its index in that session,
// and the line it came from.
type placed[T any] struct {
	session string
	index   int
	line    int
	row     T
}

// groupSessions gathers rows by session, each session's rows ordered by index, and rejects a session
// whose indices do not run 0, 1, 2, ... . indexField is the index's name in the file's format, for
// the error. Sessions come in order of first appearance, which keeps the error reported stable.
// readGroups parses every line of r with parse and groups the rows by session, checking each
// session's call indices (named indexField in errors).
func readGroups[T any](r io.Reader, parse func(n int, line []byte) (placed[T], error), indexField string) ([][]placed[T], error) {
	var rows []placed[T]
	err := scanLines(r, func(n int, line []byte) error {
		row, err := parse(n, line)
		if err != nil {
			return err
		}
		rows = append(rows, row)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return groupSessions(rows, indexField)
}

func groupSessions[T any](rows []placed[T], indexField string) ([][]placed[T], error) {
	bySession := make(map[string]int)
	var groups [][]placed[T]
	for _, r := range rows {
		g, ok := bySession[r.session]
		if !ok {
			g = len(groups)
			bySession[r.session] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], r)
	}
	for _, g := range groups {
		slices.SortStableFunc(g, func(a, b placed[T]) int { return cmp.Compare(a.index, b.index) })
		for i, r := range g {
			switch {
			case r.index < i:
				return nil, lineErr(r.line, indexField, "session %q: duplicate %s %d (also on line %d)",
					r.session, indexField, r.index, g[i-1].line)
			case r.index > i:
				return nil, lineErr(r.line, indexField, "session %q: %s %d is missing (this row is %s %d)",
					r.session, indexField, i, indexField, r.index)
			}
		}
	}
	return groups, nil
}

// sortSessions puts sessions in the order they started, which is the order a replay meets them;
// the ID breaks ties so the order does not depend on the file's.
func sortSessions(sessions []Session) {
	slices.SortFunc(sessions, func(a, b Session) int {
		if c := a.Calls[0].Start.Compare(b.Calls[0].Start); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
}

// checkCall holds a call to the rules of the basin format. It returns the basin field at fault so
// that the reader can add a line number and the writer a session and call.
func checkCall(index int, c Call) (field string, err error) {
	switch {
	case checkYear(c.Start) != nil:
		return "start", checkYear(c.Start)
	case !c.End.IsZero() && checkYear(c.End) != nil:
		return "end", checkYear(c.End)
	case !c.End.IsZero() && c.End.Before(c.Start):
		return "end", fmt.Errorf("must not be before start (%s), got %s", formatTime(c.Start), formatTime(c.End))
	case c.Prompt <= 0:
		return "prompt_tokens", fmt.Errorf("must be > 0, got %d", c.Prompt)
	case c.Reused < 0:
		return "reused_tokens", fmt.Errorf("must be >= 0, got %d", c.Reused)
	case c.Reused > c.Prompt:
		return "reused_tokens", fmt.Errorf("must be <= prompt_tokens (%d), got %d", c.Prompt, c.Reused)
	case c.Output < 0:
		return "output_tokens", fmt.Errorf("must be >= 0, got %d", c.Output)
	case c.GapBefore < 0:
		return "gap_before_s", fmt.Errorf("must be >= 0, got %s", formatSeconds(c.GapBefore))
	case index == 0 && c.GapBefore != 0:
		return "gap_before_s", fmt.Errorf("must be 0 for call 0, got %s", formatSeconds(c.GapBefore))
	case index == 0 && c.Human:
		return "turn", errors.New(`call 0 is always "first", not "human"`)
	}
	return "", nil
}

// formatTime writes t the way WriteBasin does.
func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// formatSeconds writes d as exact decimal seconds ("19.291"), so that reading it back gives the
// same nanoseconds, which a float64 would not for long gaps. Negative durations only appear in
// error messages and need no such care.
func formatSeconds(d time.Duration) string {
	if d < 0 {
		return strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
	}
	s := strconv.FormatInt(int64(d/time.Second), 10)
	if frac := d % time.Second; frac != 0 {
		s += strings.TrimRight(fmt.Sprintf(".%09d", int64(frac)), "0")
	}
	return s
}

// parseSeconds reads a JSON number of seconds as a non-negative duration. Plain decimals convert
// exactly (time.ParseDuration works in integers); exponent forms go through float64 and are rounded
// to the nearest nanosecond.
func parseSeconds(num json.Number) (time.Duration, error) {
	s := num.String()
	if strings.HasPrefix(s, "-") && strings.Trim(s, "-0.eE+") != "" {
		return 0, fmt.Errorf("must be >= 0, got %s", s)
	}
	if !strings.ContainsAny(s, "eE") {
		d, err := time.ParseDuration(s + "s")
		if err != nil {
			return 0, fmt.Errorf("%s seconds is out of range", s)
		}
		return d, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	// float64(math.MaxInt64) is 2^63, one past the largest duration.
	if err != nil || f*1e9 >= 1<<63 {
		return 0, fmt.Errorf("%s seconds is out of range", s)
	}
	return time.Duration(math.Round(f * 1e9)), nil
}
