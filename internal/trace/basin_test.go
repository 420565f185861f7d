package trace

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// at returns 2026-06-01 hh:mm:ss.nanos UTC, the day of the sample traces.
func at(hh, mm, ss, nanos int) time.Time {
	return time.Date(2026, 6, 1, hh, mm, ss, nanos, time.UTC)
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func TestReadBasinSample(t *testing.T) {
	f, err := os.Open("testdata/basin-sample.jsonl")
	require.NoError(t, err)
	defer f.Close()

	got, err := ReadBasin(f)
	require.NoError(t, err)

	want := []Session{
		{
			ID: "s1", Tenant: "acme", TaskChars: 146,
			Calls: []Call{
				{Start: at(5, 40, 20, 151e6), End: at(5, 40, 31, 647e6), Prompt: 32272, Reused: 27217, Output: 931},
				{Start: at(5, 40, 50, 938e6), End: at(5, 41, 4, 862e6), Prompt: 35740, Reused: 29380, Output: 1016, GapBefore: ms(19291)},
				// Defaults: reused = min(38592, 35740+1016), gap = start - previous end.
				{Start: at(5, 41, 40, 0), Prompt: 38592, Reused: 36756, Output: 2475, GapBefore: ms(35138), Human: true},
			},
		},
		{ID: "s2", Calls: []Call{{Start: at(5, 40, 25, 0), Prompt: 12000, Output: 300}}},
	}
	assert.Equal(t, want, got)
}

// The sample is the example of FORMAT.md, so the documented example is known to parse as described.
func TestFormatDocExampleIsTheSample(t *testing.T) {
	doc, err := os.ReadFile("FORMAT.md")
	require.NoError(t, err)
	sample, err := os.ReadFile("testdata/basin-sample.jsonl")
	require.NoError(t, err)
	assert.Contains(t, string(doc), "```jsonl\n"+string(sample)+"```\n")
}

func TestReadBasinDefaults(t *testing.T) {
	tests := []struct {
		name  string
		lines []string
		want  []Call
	}{
		{
			name: "gap from previous start when its end is unknown",
			lines: []string{
				`{"session_id":"a","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":100,"output_tokens":10}`,
				`{"session_id":"a","call":1,"start":"2026-06-01T00:00:07.5Z","prompt_tokens":300,"output_tokens":10}`,
			},
			want: []Call{
				{Start: at(0, 0, 0, 0), Prompt: 100, Output: 10},
				{Start: at(0, 0, 7, 5e8), Prompt: 300, Reused: 110, Output: 10, GapBefore: ms(7500)},
			},
		},
		{
			name: "gap clamped at 0 and reused capped at the prompt",
			lines: []string{
				`{"session_id":"a","call":0,"start":"2026-06-01T00:00:00Z","end":"2026-06-01T00:00:09Z","prompt_tokens":100,"output_tokens":50}`,
				`{"session_id":"a","call":1,"start":"2026-06-01T00:00:05Z","prompt_tokens":120,"output_tokens":10}`,
			},
			want: []Call{
				{Start: at(0, 0, 0, 0), End: at(0, 0, 9, 0), Prompt: 100, Output: 50},
				{Start: at(0, 0, 5, 0), Prompt: 120, Reused: 120, Output: 10},
			},
		},
		{
			name: "stated values win over defaults; offsets become UTC; exponent seconds",
			lines: []string{
				`{"session_id":"a","call":0,"start":"2026-06-01T02:00:00+02:00","prompt_tokens":100,"reused_tokens":40,"output_tokens":0,"turn":"first"}`,
				"",
				`  {"session_id":"a","call":1,"start":"2026-06-01T00:01:00Z","prompt_tokens":150,"reused_tokens":0,"output_tokens":1,"gap_before_s":1.5e1,"turn":"tool"}  `,
				`{"session_id":"a","call":2,"start":"2026-06-01T00:02:00Z","prompt_tokens":150,"output_tokens":1,"gap_before_s":0.000000001,"turn":"human"}`,
			},
			want: []Call{
				{Start: at(0, 0, 0, 0), Prompt: 100, Reused: 40, Output: 0},
				{Start: at(0, 1, 0, 0), Prompt: 150, Reused: 0, Output: 1, GapBefore: 15 * time.Second},
				{Start: at(0, 2, 0, 0), Prompt: 150, Reused: 150, Output: 1, GapBefore: time.Nanosecond, Human: true},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadBasin(strings.NewReader(strings.Join(tt.lines, "\n")))
			require.NoError(t, err)
			require.Len(t, got, 1)
			assert.Equal(t, tt.want, got[0].Calls)
		})
	}
}

func TestReadBasinInterleavedSorted(t *testing.T) {
	// Sessions b and c start at the same time (ID breaks the tie), a starts last; rows of each are
	// shuffled and interleaved.
	in := strings.Join([]string{
		`{"session_id":"a","call":1,"start":"2026-06-01T00:00:20Z","prompt_tokens":20,"output_tokens":1}`,
		`{"session_id":"c","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":30,"output_tokens":1}`,
		`{"session_id":"b","call":2,"start":"2026-06-01T00:00:12Z","prompt_tokens":12,"output_tokens":1}`,
		`{"session_id":"a","call":0,"start":"2026-06-01T00:00:05Z","prompt_tokens":10,"output_tokens":1}`,
		`{"session_id":"b","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":10,"output_tokens":1}`,
		`{"session_id":"b","call":1,"start":"2026-06-01T00:00:11Z","prompt_tokens":11,"output_tokens":1}`,
	}, "\n")
	got, err := ReadBasin(strings.NewReader(in))
	require.NoError(t, err)

	var ids []string
	var prompts [][]int
	for _, s := range got {
		ids = append(ids, s.ID)
		var p []int
		for _, c := range s.Calls {
			p = append(p, c.Prompt)
		}
		prompts = append(prompts, p)
	}
	assert.Equal(t, []string{"b", "c", "a"}, ids)
	assert.Equal(t, [][]int{{10, 11, 12}, {30}, {10, 20}}, prompts)
}

// row0 is a valid call 0 of session "a"; the error cases put their bad row after it.
const row0 = `{"session_id":"a","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":100,"output_tokens":10}`

func TestReadBasinErrors(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		line      int
		field     string
		msgSubstr string
	}{
		{
			name: "unknown field",
			in:   row0 + "\n" + `{"session_id":"a","call":1,"start":"2026-06-01T00:00:01Z","prompt_tokens":100,"output_tokens":10,"promt_tokens":5}`,
			line: 2, field: "promt_tokens", msgSubstr: "unknown field",
		},
		{
			name: "missing prompt_tokens",
			in:   row0 + "\n\n" + `{"session_id":"a","call":1,"start":"2026-06-01T00:00:01Z","output_tokens":10}`,
			line: 3, field: "prompt_tokens", msgSubstr: "missing",
		},
		{
			name: "zero prompt_tokens",
			in:   `{"session_id":"a","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":0,"output_tokens":10}`,
			line: 1, field: "prompt_tokens", msgSubstr: "must be > 0, got 0",
		},
		{
			name: "prompt_tokens of the wrong type",
			in:   `{"session_id":"a","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":"100","output_tokens":10}`,
			line: 1, field: "prompt_tokens", msgSubstr: "want int, got string",
		},
		{
			name: "negative output",
			in:   row0 + "\n" + `{"session_id":"a","call":1,"start":"2026-06-01T00:00:01Z","prompt_tokens":100,"output_tokens":-1}`,
			line: 2, field: "output_tokens", msgSubstr: "must be >= 0, got -1",
		},
		{
			name: "reused greater than prompt",
			in:   row0 + "\n" + `{"session_id":"a","call":1,"start":"2026-06-01T00:00:01Z","prompt_tokens":100,"reused_tokens":101,"output_tokens":1}`,
			line: 2, field: "reused_tokens", msgSubstr: "must be <= prompt_tokens (100), got 101",
		},
		{
			name: "end before start",
			in:   `{"session_id":"a","call":0,"start":"2026-06-01T00:00:10Z","end":"2026-06-01T00:00:09.5Z","prompt_tokens":100,"output_tokens":10}`,
			line: 1, field: "end", msgSubstr: "must not be before start",
		},
		{
			name: "bad start timestamp",
			in:   row0 + "\n" + `{"session_id":"a","call":1,"start":"2026-06-01 00:00:01","prompt_tokens":100,"output_tokens":10}`,
			line: 2, field: "start", msgSubstr: "invalid RFC 3339 timestamp",
		},
		{
			name: "bad end timestamp",
			in:   `{"session_id":"a","call":0,"start":"2026-06-01T00:00:00Z","end":"soon","prompt_tokens":100,"output_tokens":10}`,
			line: 1, field: "end", msgSubstr: "invalid RFC 3339 timestamp",
		},
		{
			name: "timestamp outside RFC 3339 years once in UTC",
			in:   `{"session_id":"a","call":0,"start":"0000-01-01T00:00:00+01:00","prompt_tokens":100,"output_tokens":10}`,
			line: 1, field: "start", msgSubstr: "outside 0000-9999",
		},
		{
			name: "duplicate call",
			in:   row0 + "\n" + `{"session_id":"b","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":100,"output_tokens":10}` + "\n" + row0,
			line: 3, field: "call", msgSubstr: `session "a": duplicate call 0 (also on line 1)`,
		},
		{
			name: "index gap",
			in:   row0 + "\n" + `{"session_id":"a","call":2,"start":"2026-06-01T00:00:02Z","prompt_tokens":100,"output_tokens":10}`,
			line: 2, field: "call", msgSubstr: `session "a": call 1 is missing (this row is call 2)`,
		},
		{
			name: "session without call 0",
			in:   `{"session_id":"z","call":1,"start":"2026-06-01T00:00:02Z","prompt_tokens":100,"output_tokens":10}`,
			line: 1, field: "call", msgSubstr: `session "z": call 0 is missing`,
		},
		{
			name: "session_id over 64 KiB",
			in:   `{"session_id":"` + strings.Repeat("s", maxNameBytes+1) + `","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":100,"output_tokens":10}`,
			line: 1, field: "session_id", msgSubstr: "longer than 65536 bytes",
		},
		{
			name: "tenant over 64 KiB",
			in:   `{"session_id":"a","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":100,"output_tokens":10,"tenant":"` + strings.Repeat("t", maxNameBytes+1) + `"}`,
			line: 1, field: "tenant", msgSubstr: "longer than 65536 bytes",
		},
		{
			name: "negative call",
			in:   `{"session_id":"a","call":-1,"start":"2026-06-01T00:00:00Z","prompt_tokens":100,"output_tokens":10}`,
			line: 1, field: "call", msgSubstr: "must be >= 0, got -1",
		},
		{
			name: "empty session_id",
			in:   `{"session_id":"","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":100,"output_tokens":10}`,
			line: 1, field: "session_id", msgSubstr: "must not be empty",
		},
		{
			name: "invalid JSON",
			in:   row0 + "\n" + `{"session_id":"a","call":1,`,
			line: 2, field: "", msgSubstr: "invalid JSON",
		},
		{
			name: "two values on a line",
			in:   row0 + " " + row0,
			line: 1, field: "", msgSubstr: "invalid JSON: more than one value",
		},
		{
			name: "not an object",
			in:   `[1,2]`,
			line: 1, field: "", msgSubstr: "row must be a JSON object, got array",
		},
		{
			name: "negative gap",
			in:   row0 + "\n" + `{"session_id":"a","call":1,"start":"2026-06-01T00:00:01Z","prompt_tokens":100,"output_tokens":10,"gap_before_s":-0.5}`,
			line: 2, field: "gap_before_s", msgSubstr: "must be >= 0, got -0.5",
		},
		{
			name: "gap as a string",
			in:   row0 + "\n" + `{"session_id":"a","call":1,"start":"2026-06-01T00:00:01Z","prompt_tokens":100,"output_tokens":10,"gap_before_s":"1"}`,
			line: 2, field: "gap_before_s", msgSubstr: "want a number of seconds",
		},
		{
			name: "gap out of range",
			in:   row0 + "\n" + `{"session_id":"a","call":1,"start":"2026-06-01T00:00:01Z","prompt_tokens":100,"output_tokens":10,"gap_before_s":1e300}`,
			line: 2, field: "gap_before_s", msgSubstr: "out of range",
		},
		{
			name: "gap on call 0",
			in:   `{"session_id":"a","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":100,"output_tokens":10,"gap_before_s":3}`,
			line: 1, field: "gap_before_s", msgSubstr: "must be 0 for call 0",
		},
		{
			name: "unknown turn",
			in:   row0 + "\n" + `{"session_id":"a","call":1,"start":"2026-06-01T00:00:01Z","prompt_tokens":100,"output_tokens":10,"turn":"user"}`,
			line: 2, field: "turn", msgSubstr: `got "user"`,
		},
		{
			name: "human call 0",
			in:   `{"session_id":"a","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":100,"output_tokens":10,"turn":"human"}`,
			line: 1, field: "turn", msgSubstr: `call 0 must be "first"`,
		},
		{
			name: "first after call 0",
			in:   row0 + "\n" + `{"session_id":"a","call":1,"start":"2026-06-01T00:00:01Z","prompt_tokens":100,"output_tokens":10,"turn":"first"}`,
			line: 2, field: "turn", msgSubstr: `"first" is only for call 0`,
		},
		{
			name: "negative task_chars",
			in:   `{"session_id":"a","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":100,"output_tokens":10,"task_chars":-3}`,
			line: 1, field: "task_chars", msgSubstr: "must be >= 0, got -3",
		},
		{
			name: "tenants disagree",
			in: `{"session_id":"a","call":1,"start":"2026-06-01T00:00:01Z","prompt_tokens":100,"output_tokens":10,"tenant":"y"}` + "\n" +
				`{"session_id":"a","call":0,"start":"2026-06-01T00:00:00Z","prompt_tokens":100,"output_tokens":10,"tenant":"x"}`,
			line: 1, field: "tenant", msgSubstr: `session "a": "y" differs from "x" on line 2`,
		},
		{
			name: "line over 1 MiB",
			in:   row0 + "\n" + strings.Repeat(" ", MaxLineBytes+1) + "\n" + row0,
			line: 2, field: "", msgSubstr: "longer than 1048576 bytes (1 MiB)",
		},
		{
			name: "line far over 1 MiB, at the end without newline",
			in:   row0 + "\n\n" + `{"session_id":"` + strings.Repeat("x", 2*MaxLineBytes) + `"}`,
			line: 3, field: "", msgSubstr: "longer than 1048576 bytes (1 MiB)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ReadBasin(strings.NewReader(tt.in))
			require.Error(t, err)
			assert.Nil(t, got)
			assertParseError(t, err, tt.line, tt.field, tt.msgSubstr)
		})
	}
}

// assertParseError checks that err is a *ParseError for line and field whose message names both.
func assertParseError(t *testing.T, err error, line int, field, msgSubstr string) {
	t.Helper()
	var pe *ParseError
	require.True(t, errors.As(err, &pe), "error %q is not a *ParseError", err)
	assert.Equal(t, line, pe.Line, "line of %q", err)
	assert.Equal(t, field, pe.Field, "field of %q", err)
	msg := err.Error()
	prefix := "line " + strconv.Itoa(line) + ": "
	if field != "" {
		prefix += field + ": "
	}
	assert.True(t, strings.HasPrefix(msg, prefix), "message %q does not start with %q", msg, prefix)
	assert.Contains(t, msg, msgSubstr)
}

func TestReadBasinLineOfExactlyMaxLength(t *testing.T) {
	// A row padded with spaces to exactly MaxLineBytes, with a CRLF ending, is still accepted.
	padded := row0 + strings.Repeat(" ", MaxLineBytes-len(row0))
	require.Len(t, padded, MaxLineBytes)
	got, err := ReadBasin(strings.NewReader(padded + "\r\n"))
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, 100, got[0].Calls[0].Prompt)
}

// sessionsForRoundTrip exercise everything the writer has to keep: unknown ends, nanosecond
// timestamps, human turns, gaps far beyond float64 precision in nanoseconds, reuse on call 0, and
// characters JSON escapes. They are in ReadBasin's order.
func sessionsForRoundTrip() []Session {
	return []Session{
		{
			ID: "claude:1", Tenant: "acme <&> \u2028", TaskChars: 146,
			Calls: []Call{
				{Start: at(5, 40, 20, 151e6), End: at(5, 40, 31, 647e6), Prompt: 32272, Reused: 27217, Output: 931},
				{Start: at(5, 40, 31, 696e6), End: at(5, 41, 4, 862e6), Prompt: 35740, Reused: 29380, Output: 1016, GapBefore: ms(19291)},
				{Start: at(5, 42, 43, 333e6), Prompt: 42876, Reused: 41587, Output: 0, GapBefore: ms(19913), Human: true},
				{Start: at(5, 43, 0, 1), End: at(5, 43, 0, 1), Prompt: 1, Reused: 0, Output: 7, GapBefore: 0},
			},
		},
		{
			ID: "long\nidle",
			Calls: []Call{
				{Start: at(6, 0, 0, 0), Prompt: 10, Output: 1},
				{Start: at(6, 0, 0, 0), Prompt: 20, Reused: 11, Output: 1, GapBefore: 100*24*time.Hour + 123456789},
			},
		},
	}
}

func TestBasinRoundTrip(t *testing.T) {
	in := sessionsForRoundTrip()
	var buf bytes.Buffer
	require.NoError(t, WriteBasin(&buf, in))

	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, 6, "one row per call")
	assert.Equal(t,
		`{"session_id":"claude:1","call":2,"start":"2026-06-01T05:42:43.333Z","prompt_tokens":42876,"reused_tokens":41587,"output_tokens":0,"gap_before_s":19.913,"turn":"human","tenant":"acme <&> \u2028","task_chars":146}`,
		lines[2], "every field explicit, end omitted when unknown")
	assert.Contains(t, lines[5], `"gap_before_s":8640000.123456789,`)

	out, err := ReadBasin(&buf)
	require.NoError(t, err)
	assert.Equal(t, in, out)
}

// The longest ID and tenant the readers accept still fit a row after JSON escaping has made them
// six times longer.
func TestBasinRoundTripLongestNames(t *testing.T) {
	in := []Session{{
		ID:     strings.Repeat("\x01", maxNameBytes),
		Tenant: strings.Repeat("\x1f", maxNameBytes),
		Calls:  []Call{{Start: at(0, 0, 0, 0), End: at(0, 0, 1, 0), Prompt: 1, Output: 1}},
	}}
	var buf bytes.Buffer
	require.NoError(t, WriteBasin(&buf, in))
	assert.Greater(t, buf.Len(), 2*6*maxNameBytes, "each byte escaped to six")
	out, err := ReadBasin(&buf)
	require.NoError(t, err)
	assert.Equal(t, in, out)
}

func TestWriteBasinRejects(t *testing.T) {
	valid := func() Session {
		return Session{ID: "a", Calls: []Call{
			{Start: at(0, 0, 0, 0), Prompt: 10, Output: 1},
			{Start: at(0, 0, 1, 0), Prompt: 20, Reused: 11, Output: 1, GapBefore: time.Second},
		}}
	}
	tests := []struct {
		name   string
		mutate func([]Session) []Session
		msg    string
	}{
		{"empty ID", func(s []Session) []Session { s[0].ID = ""; return s }, "session 0: empty ID"},
		{"duplicate ID", func(s []Session) []Session { return append(s, valid()) }, `session "a" appears twice`},
		{"long ID", func(s []Session) []Session { s[0].ID = strings.Repeat("i", maxNameBytes+1); return s }, "session 0: ID longer than 65536 bytes"},
		{"long tenant", func(s []Session) []Session { s[0].Tenant = strings.Repeat("t", maxNameBytes+1); return s }, `session "a": tenant longer than 65536 bytes`},
		{"no calls", func(s []Session) []Session { s[0].Calls = nil; return s }, `session "a" has no calls`},
		{"negative task chars", func(s []Session) []Session { s[0].TaskChars = -1; return s }, "task_chars: must be >= 0"},
		{"reused over prompt", func(s []Session) []Session { s[0].Calls[1].Reused = 21; return s }, `session "a" call 1: reused_tokens: must be <= prompt_tokens (20), got 21`},
		{"zero prompt", func(s []Session) []Session { s[0].Calls[1].Prompt = 0; return s }, "call 1: prompt_tokens: must be > 0"},
		{"end before start", func(s []Session) []Session { s[0].Calls[0].End = at(0, 0, 0, 0).Add(-1); return s }, "call 0: end: must not be before start"},
		{"negative gap", func(s []Session) []Session { s[0].Calls[1].GapBefore = -ms(1500); return s }, "call 1: gap_before_s: must be >= 0, got -1.5"},
		{"gap on call 0", func(s []Session) []Session { s[0].Calls[0].GapBefore = 1; return s }, "call 0: gap_before_s: must be 0 for call 0"},
		{"human call 0", func(s []Session) []Session { s[0].Calls[0].Human = true; return s }, "call 0: turn:"},
		{"year beyond 9999", func(s []Session) []Session {
			s[0].Calls[1].Start = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
			return s
		}, "call 1: start: year 10000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := WriteBasin(&buf, tt.mutate([]Session{valid()}))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.msg)
			assert.Zero(t, buf.Len(), "nothing written for a bad input")
		})
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteBasinReportsWriteError(t *testing.T) {
	err := WriteBasin(failWriter{}, sessionsForRoundTrip())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "disk full")
}

// Rows written one at a time are the lines WriteBasin writes for the same sessions: one encoding
// for the recorder and the simulator's side.
func TestWriteRowIsWriteBasin(t *testing.T) {
	in := sessionsForRoundTrip()
	var whole, rows bytes.Buffer
	require.NoError(t, WriteBasin(&whole, in))
	for _, s := range in {
		for j, c := range s.Calls {
			require.NoError(t, WriteRow(&rows, Row{SessionID: s.ID, Index: j, Tenant: s.Tenant, TaskChars: s.TaskChars, Call: c}))
		}
	}
	assert.Equal(t, whole.String(), rows.String())
}

// A row that leaves the reuse to the default omits reused_tokens, and the reader fills in the
// previous prompt plus output.
func TestWriteRowDefaultReuse(t *testing.T) {
	var buf bytes.Buffer
	calls := []Call{
		{Start: at(1, 0, 0, 0), End: at(1, 0, 2, 0), Prompt: 100, Reused: 99, Output: 10},
		{Start: at(1, 0, 5, 5e8), End: at(1, 0, 7, 0), Prompt: 150, Reused: 3, Output: 20, GapBefore: ms(3500), Human: true},
	}
	for i, c := range calls {
		require.NoError(t, WriteRow(&buf, Row{SessionID: "9f86d081884c7d65", Index: i, Call: c, DefaultReuse: true}))
	}
	assert.Equal(t,
		`{"session_id":"9f86d081884c7d65","call":1,"start":"2026-06-01T01:00:05.5Z","end":"2026-06-01T01:00:07Z","prompt_tokens":150,"output_tokens":20,"gap_before_s":3.5,"turn":"human","tenant":"","task_chars":0}`,
		strings.Split(buf.String(), "\n")[1])
	got, err := ReadBasin(&buf)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, 0, got[0].Calls[0].Reused, "call 0 shares nothing by default")
	assert.Equal(t, 110, got[0].Calls[1].Reused, "the previous prompt and output")
	assert.True(t, got[0].Calls[1].Human)
	assert.Equal(t, ms(3500), got[0].Calls[1].GapBefore)
}

func TestWriteRowRejects(t *testing.T) {
	valid := func() Row {
		return Row{SessionID: "a", Index: 1, Call: Call{Start: at(0, 0, 1, 0), Prompt: 20, Reused: 11, Output: 1, GapBefore: time.Second}}
	}
	tests := []struct {
		name   string
		mutate func(*Row)
		msg    string
	}{
		{"empty ID", func(r *Row) { r.SessionID = "" }, "call 1: session_id: must not be empty"},
		{"long ID", func(r *Row) { r.SessionID = strings.Repeat("i", maxNameBytes+1) }, "call 1: session_id: longer than 65536 bytes"},
		{"negative index", func(r *Row) { r.Index = -1 }, `session "a": call: must be >= 0, got -1`},
		{"long tenant", func(r *Row) { r.Tenant = strings.Repeat("t", maxNameBytes+1) }, `session "a" call 1: tenant: longer than`},
		{"negative task chars", func(r *Row) { r.TaskChars = -1 }, `session "a" call 1: task_chars: must be >= 0, got -1`},
		{"reused over prompt", func(r *Row) { r.Call.Reused = 21 }, `session "a" call 1: reused_tokens: must be <= prompt_tokens (20), got 21`},
		{"negative gap", func(r *Row) { r.Call.GapBefore = -ms(1500) }, "call 1: gap_before_s: must be >= 0, got -1.5"},
		{"gap on call 0", func(r *Row) { r.Index = 0 }, "call 0: gap_before_s: must be 0 for call 0"},
		{"end before start", func(r *Row) { r.Call.End = r.Call.Start.Add(-1) }, "call 1: end: must not be before start"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := valid()
			tt.mutate(&r)
			var buf bytes.Buffer
			err := WriteRow(&buf, r)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.msg)
			assert.Zero(t, buf.Len(), "nothing written for a bad row")
		})
	}
	// With the default reuse, Reused is not written and so not checked.
	r := valid()
	r.Call.Reused, r.DefaultReuse = 21, true
	assert.NoError(t, WriteRow(&bytes.Buffer{}, r))
}

// countingWriter counts Write calls, to show a row goes out in one.
type countingWriter struct {
	bytes.Buffer
	writes int
}

func (w *countingWriter) Write(p []byte) (int, error) { w.writes++; return w.Buffer.Write(p) }

func TestWriteRowOneWrite(t *testing.T) {
	var w countingWriter
	require.NoError(t, WriteRow(&w, Row{SessionID: "a", Call: Call{Start: at(0, 0, 0, 0), Prompt: 1}}))
	assert.Equal(t, 1, w.writes)
	assert.True(t, strings.HasSuffix(w.String(), "}\n"))
	assert.Error(t, WriteRow(failWriter{}, Row{SessionID: "a", Call: Call{Start: at(0, 0, 0, 0), Prompt: 1}}))
}

// A recorded file never holds a raw id or tenant, reads back as the calls recorded, and a session
// id admitted twice becomes two trace sessions.
func TestRecorder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "calls.jsonl")
	rec, err := OpenRecorder(path)
	require.NoError(t, err)

	first, again := rec.SessionID("secret-session"), rec.SessionID("secret-session")
	assert.Len(t, first, 16)
	assert.NotEqual(t, first, again, "a new admission is a new trace session")
	tenant := rec.Tenant("acme-corp")
	assert.Len(t, tenant, 16)
	assert.Equal(t, tenant, rec.Tenant("acme-corp"), "a tenant keeps its name across sessions")
	assert.Empty(t, rec.Tenant(""))

	// Calls finish concurrently; each session's rows still read back in order.
	done := make(chan struct{})
	for _, id := range []string{first, again} {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 50 {
				c := Call{Start: at(2, 0, i, 0), End: at(2, 0, i, 5e8), Prompt: 100 + i, Output: 1}
				if i > 0 {
					c.GapBefore = ms(500)
				}
				assert.NoError(t, rec.Record(Row{SessionID: id, Index: i, Tenant: tenant, TaskChars: 9, Call: c, DefaultReuse: true}))
			}
		}()
	}
	<-done
	<-done
	require.NoError(t, rec.Close())
	require.NoError(t, rec.Close(), "closing twice is harmless")
	assert.ErrorContains(t, rec.Record(Row{SessionID: first, Call: Call{Start: at(0, 0, 0, 0), Prompt: 1}}), "closed")

	data, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.NotContains(t, string(data), "secret")
	assert.NotContains(t, string(data), "acme")
	sessions, err := ReadBasin(bytes.NewReader(data))
	require.NoError(t, err)
	require.Len(t, sessions, 2)
	for _, s := range sessions {
		assert.Equal(t, tenant, s.Tenant)
		assert.Equal(t, 9, s.TaskChars)
		require.Len(t, s.Calls, 50)
		assert.Equal(t, 149, s.Calls[49].Prompt)
		assert.Equal(t, 148+1, s.Calls[49].Reused, "the default: previous prompt plus output")
	}

	// A second recorder draws another salt: recordings cannot be joined on hashed ids.
	rec2, err := OpenRecorder(path)
	require.NoError(t, err)
	defer rec2.Close()
	assert.NotEqual(t, tenant, rec2.Tenant("acme-corp"))
}

type closeFailer struct{ bytes.Buffer }

func (*closeFailer) Close() error { return errors.New("close failed") }

func TestRecorderErrors(t *testing.T) {
	_, err := OpenRecorder(filepath.Join(t.TempDir(), "missing", "calls.jsonl"))
	assert.ErrorContains(t, err, "open trace recorder")

	w := &closeFailer{}
	rec, err := NewRecorder(w)
	require.NoError(t, err)
	err = rec.Record(Row{SessionID: "a", Call: Call{Start: at(0, 0, 0, 0), Prompt: 0}})
	assert.ErrorContains(t, err, `session "a" call 0: prompt_tokens: must be > 0`)
	assert.Zero(t, w.Len())
	assert.EqualError(t, rec.Close(), "close failed")
}
