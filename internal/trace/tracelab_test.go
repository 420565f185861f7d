package trace

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const traceLabSample = "testdata/tracelab-claude-session.jsonl"

// sampleLines returns the rows of the TraceLab sample, one string each.
func sampleLines(t testing.TB) []string {
	t.Helper()
	data, err := os.ReadFile(traceLabSample)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	require.Len(t, lines, 10)
	return lines
}

// editRow decodes a sample row, lets edit change it, and encodes it again.
func editRow(t *testing.T, line string, edit func(row map[string]any)) string {
	t.Helper()
	var row map[string]any
	require.NoError(t, json.Unmarshal([]byte(line), &row))
	edit(row)
	out, err := json.Marshal(row)
	require.NoError(t, err)
	return string(out)
}

func TestReadTraceLabSample(t *testing.T) {
	f, err := os.Open(traceLabSample)
	require.NoError(t, err)
	defer f.Close()

	sessions, err := ReadTraceLab(f)
	require.NoError(t, err)
	require.Len(t, sessions, 1)
	s := sessions[0]
	require.Len(t, s.Calls, 10)

	assert.Equal(t, "claude:92ee5b8a-429c-e80b-5db6-5381512f4697", s.ID)
	assert.Equal(t, "project_4c7b8a1b", s.Tenant)
	assert.Equal(t, 146, s.TaskChars, "current_user_message_chars of round 0")

	// Round 0: opened by the user message at 05:40:20.151, last model event the tool_call at
	// 05:40:31.647.
	assert.Equal(t, Call{
		Start: at(5, 40, 20, 151e6), End: at(5, 40, 31, 647e6),
		Prompt: 32272, Reused: 27217, Output: 931,
	}, s.Calls[0])

	// Round 1 opens with the Bash result (05:40:31.696); the gap runs from round 0's last
	// tool_call (WebSearch, 05:40:31.647) to round 1's last tool_result (05:40:50.938): 19.291 s,
	// which is also the WebSearch's tool_wall_latency_ms.
	assert.Equal(t, Call{
		Start: at(5, 40, 31, 696e6), End: at(5, 41, 4, 862e6),
		Prompt: 35740, Reused: 29380, Output: 1016, GapBefore: ms(19291),
	}, s.Calls[1])

	// Round 5 opens with a user message at 05:42:43.333; round 4's last model event is the text
	// at 05:42:23.420, so the person took 19.913 s.
	assert.True(t, s.Calls[5].Human)
	assert.Equal(t, ms(19913), s.Calls[5].GapBefore)
	for i, c := range s.Calls {
		if i != 5 {
			assert.False(t, c.Human, "round %d", i)
		}
	}

	st := Summarize(s)
	assert.Greater(t, st.ReuseFraction, 0.8)
	assert.InDelta(t, 366851.0/385921.0, st.ReuseFraction, 1e-12)
}

func TestReadTraceLabMapping(t *testing.T) {
	lines := sampleLines(t)
	tests := []struct {
		name  string
		edit0 func(map[string]any) // applied to round 0
		edit1 func(map[string]any) // applied to round 1
		check func(t *testing.T, s Session)
	}{
		{
			name:  "null prefix is no reuse",
			edit1: func(r map[string]any) { r["prefix_tokens"] = nil },
			check: func(t *testing.T, s Session) { assert.Equal(t, 0, s.Calls[1].Reused) },
		},
		{
			name:  "prefix beyond the prompt is clamped",
			edit1: func(r map[string]any) { r["prefix_tokens"] = 99999999 },
			check: func(t *testing.T, s Session) { assert.Equal(t, 35740, s.Calls[1].Reused) },
		},
		{
			name:  "negative prefix is clamped",
			edit1: func(r map[string]any) { r["prefix_tokens"] = -5 },
			check: func(t *testing.T, s Session) { assert.Equal(t, 0, s.Calls[1].Reused) },
		},
		{
			name:  "reasoning tokens count as output",
			edit1: func(r map[string]any) { r["reasoning_output_tokens"] = 500 },
			check: func(t *testing.T, s Session) { assert.Equal(t, 1516, s.Calls[1].Output) },
		},
		{
			name: "timestamps win over tool latencies",
			edit0: func(r map[string]any) {
				for _, tool := range r["tools"].([]any) {
					tool.(map[string]any)["tool_wall_latency_ms"] = 5
				}
			},
			check: func(t *testing.T, s Session) { assert.Equal(t, ms(19291), s.Calls[1].GapBefore) },
		},
		{
			name: "without tool timestamps the gap is the longest tool wall latency",
			edit0: func(r map[string]any) {
				for _, ev := range r["timing_events"].([]any) {
					if ev := ev.(map[string]any); ev["event_type"] == "tool_call" {
						ev["timestamp"] = nil
					}
				}
			},
			check: func(t *testing.T, s Session) {
				assert.Equal(t, ms(19291), s.Calls[1].GapBefore, "max(860, 19291) ms")
				assert.Equal(t, at(5, 40, 29, 887e6), s.Calls[0].End, "the text event is now the last model event")
			},
		},
		{
			name: "without tool timestamps or latencies the gap runs from the previous end",
			edit0: func(r map[string]any) {
				r["tools"] = nil
				r["timing_events"] = r["timing_events"].([]any)[:3]
			},
			check: func(t *testing.T, s Session) {
				assert.Equal(t, at(5, 40, 29, 887e6), s.Calls[0].End)
				assert.Equal(t, at(5, 40, 31, 696e6).Sub(at(5, 40, 29, 887e6)), s.Calls[1].GapBefore)
			},
		},
		{
			name: "human turn from the first timing event when first_input_event_type is null",
			edit1: func(r map[string]any) {
				r["first_input_event_type"] = nil
				r["timing_events"].([]any)[0].(map[string]any)["event_type"] = "user_message"
			},
			check: func(t *testing.T, s Session) {
				assert.True(t, s.Calls[1].Human)
				// From round 0's end (05:40:31.647) to round 1's start (05:40:31.696).
				assert.Equal(t, ms(49), s.Calls[1].GapBefore)
			},
		},
		{
			name:  "round 0 is never a human turn",
			edit0: func(r map[string]any) { r["first_input_event_type"] = "user_message" },
			check: func(t *testing.T, s Session) {
				assert.False(t, s.Calls[0].Human)
				assert.Zero(t, s.Calls[0].GapBefore)
			},
		},
		{
			name:  "null project and message chars",
			edit0: func(r map[string]any) { r["project"] = nil; r["current_user_message_chars"] = nil },
			check: func(t *testing.T, s Session) {
				assert.Empty(t, s.Tenant)
				assert.Zero(t, s.TaskChars)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := slices.Clone(lines[:2])
			if tt.edit0 != nil {
				in[0] = editRow(t, in[0], tt.edit0)
			}
			if tt.edit1 != nil {
				in[1] = editRow(t, in[1], tt.edit1)
			}
			got, err := ReadTraceLab(strings.NewReader(strings.Join(in, "\n")))
			require.NoError(t, err)
			require.Len(t, got, 1)
			require.Len(t, got[0].Calls, 2)
			tt.check(t, got[0])
		})
	}
}

func TestReadTraceLabInterleaved(t *testing.T) {
	lines := sampleLines(t)
	// A second session that starts a minute earlier, its rows interleaved backwards with the
	// sample's.
	other := func(i int) string {
		return editRow(t, lines[i], func(r map[string]any) {
			r["session_id"] = "codex:other"
			for _, ev := range r["timing_events"].([]any) {
				ev := ev.(map[string]any)
				ts, err := time.Parse(time.RFC3339, ev["timestamp"].(string))
				require.NoError(t, err)
				ev["timestamp"] = ts.Add(-time.Minute).Format(time.RFC3339Nano)
			}
		})
	}
	in := []string{lines[2], other(2), lines[1], other(1), lines[0], other(0)}
	got, err := ReadTraceLab(strings.NewReader(strings.Join(in, "\n")))
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, "codex:other", got[0].ID)
	assert.Equal(t, "claude:92ee5b8a-429c-e80b-5db6-5381512f4697", got[1].ID)
	for _, s := range got {
		require.Len(t, s.Calls, 3)
		assert.Equal(t, []int{32272, 35740, 38592}, []int{s.Calls[0].Prompt, s.Calls[1].Prompt, s.Calls[2].Prompt})
		assert.Equal(t, ms(19291), s.Calls[1].GapBefore)
	}
}

func TestReadTraceLabErrors(t *testing.T) {
	lines := sampleLines(t)
	edit := func(i int, f func(map[string]any)) func(*testing.T) string {
		return func(t *testing.T) string { return editRow(t, lines[i], f) }
	}
	tests := []struct {
		name      string
		third     func(*testing.T) string // the third line, after rounds 0 and 1
		line      int
		field     string
		msgSubstr string
	}{
		{"missing input_tokens_total", edit(2, func(r map[string]any) { delete(r, "input_tokens_total") }), 3, "input_tokens_total", "missing"},
		{"null input_tokens_total", edit(2, func(r map[string]any) { r["input_tokens_total"] = nil }), 3, "input_tokens_total", "missing"},
		{"zero input_tokens_total", edit(2, func(r map[string]any) { r["input_tokens_total"] = 0 }), 3, "input_tokens_total", "must be > 0, got 0"},
		{"fractional input_tokens_total", edit(2, func(r map[string]any) { r["input_tokens_total"] = 1.5 }), 3, "input_tokens_total", "want int, got number 1.5"},
		{"missing output_tokens", edit(2, func(r map[string]any) { delete(r, "output_tokens") }), 3, "output_tokens", "missing"},
		{"negative output_tokens", edit(2, func(r map[string]any) { r["output_tokens"] = -1 }), 3, "output_tokens", "must be >= 0, got -1"},
		{"negative reasoning tokens", edit(2, func(r map[string]any) { r["reasoning_output_tokens"] = -2 }), 3, "reasoning_output_tokens", "must be >= 0, got -2"},
		{"missing session_id", edit(2, func(r map[string]any) { r["session_id"] = nil }), 3, "session_id", "missing"},
		{"long session_id", edit(2, func(r map[string]any) { r["session_id"] = strings.Repeat("s", maxNameBytes+1) }), 3, "session_id", "longer than 65536 bytes"},
		{"missing round_index", edit(2, func(r map[string]any) { delete(r, "round_index") }), 3, "round_index", "missing"},
		{
			"bad timestamp",
			edit(2, func(r map[string]any) {
				r["timing_events"].([]any)[1].(map[string]any)["timestamp"] = "2026-06-01T05:41:25"
			}),
			3, "timing_events[1].timestamp", "invalid RFC 3339 timestamp",
		},
		{"no timing events", edit(2, func(r map[string]any) { r["timing_events"] = []any{} }), 3, "timing_events", "no event with a timestamp"},
		{
			"model event before the first event",
			edit(2, func(r map[string]any) {
				r["timing_events"].([]any)[3].(map[string]any)["timestamp"] = "2026-06-01T05:00:00Z"
			}),
			3, "timing_events", "is before the first event",
		},
		{
			"latency out of range",
			edit(2, func(r map[string]any) { r["tools"].([]any)[0].(map[string]any)["tool_wall_latency_ms"] = 1e300 }),
			3, "tools[0].tool_wall_latency_ms", "out of range",
		},
		{"round gap", func(*testing.T) string { return lines[3] }, 3, "round_index", `session "claude:92ee5b8a-429c-e80b-5db6-5381512f4697": round_index 2 is missing (this row is round_index 3)`},
		{"duplicate round", func(*testing.T) string { return lines[1] }, 3, "round_index", "duplicate round_index 1 (also on line 2)"},
		{"invalid JSON", func(*testing.T) string { return lines[2][:100] }, 3, "", "invalid JSON"},
		{"over-long line", func(*testing.T) string { return strings.Repeat("x", MaxLineBytes+100) }, 3, "", "longer than 1048576 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := lines[0] + "\n" + lines[1] + "\n" + tt.third(t) + "\n"
			got, err := ReadTraceLab(strings.NewReader(in))
			require.Error(t, err)
			assert.Nil(t, got)
			assertParseError(t, err, tt.line, tt.field, tt.msgSubstr)
		})
	}
}

func TestTraceLabToBasinRoundTrip(t *testing.T) {
	f, err := os.Open(traceLabSample)
	require.NoError(t, err)
	defer f.Close()
	imported, err := ReadTraceLab(f)
	require.NoError(t, err)

	var buf bytes.Buffer
	require.NoError(t, WriteBasin(&buf, imported))
	assert.Equal(t, 10, strings.Count(buf.String(), "\n"))
	back, err := ReadBasin(&buf)
	require.NoError(t, err)
	assert.Equal(t, imported, back)
}
