package trace

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSummarize(t *testing.T) {
	f, err := os.Open(traceLabSample)
	require.NoError(t, err)
	defer f.Close()
	sessions, err := ReadTraceLab(f)
	require.NoError(t, err)
	require.Len(t, sessions, 1)

	tests := []struct {
		name string
		in   Session
		want SessionStats
	}{
		{
			// Gaps by hand from the sample: tool turns 19.291 + 12.688 + 21.467 + 0.145 + 16.113 +
			// 2.521 + 0.130 + 0.187 s; round 5 a human turn of 19.913 s; the session runs from
			// 05:40:20.151 to round 9's last text at 05:43:41.835.
			name: "TraceLab sample",
			in:   sessions[0],
			want: SessionStats{
				ID:             "claude:92ee5b8a-429c-e80b-5db6-5381512f4697",
				Calls:          10,
				FirstPrompt:    32272,
				PeakContext:    48305 + 852,
				MedianPrompt:   (41589 + 42876) / 2,
				ReuseFraction:  366851.0 / 385921.0,
				FollowUpReused: 366851,
				FollowUpPrompt: 385921,
				ToolTime:       ms(72542),
				HumanTime:      ms(19913),
				Duration:       ms(201684),
			},
		},
		{
			name: "one call without end",
			in:   Session{ID: "x", Calls: []Call{{Start: at(0, 0, 0, 0), Prompt: 10, Reused: 5, Output: 3}}},
			want: SessionStats{ID: "x", Calls: 1, FirstPrompt: 10, PeakContext: 13, MedianPrompt: 10},
		},
		{
			name: "duration to the last start when its end is unknown; odd median",
			in: Session{ID: "y", Calls: []Call{
				{Start: at(0, 0, 0, 0), End: at(0, 0, 1, 0), Prompt: 10, Output: 100},
				{Start: at(0, 0, 3, 0), Prompt: 40, Reused: 10, Output: 1, GapBefore: 2 * time.Second},
				{Start: at(0, 1, 0, 0), Prompt: 20, Reused: 20, Output: 1, GapBefore: 50 * time.Second, Human: true},
			}},
			want: SessionStats{
				ID: "y", Calls: 3, FirstPrompt: 10, PeakContext: 110, MedianPrompt: 20,
				ReuseFraction: 0.5, FollowUpReused: 30, FollowUpPrompt: 60,
				ToolTime: 2 * time.Second, HumanTime: 50 * time.Second, Duration: time.Minute,
			},
		},
		{name: "no calls", in: Session{ID: "z"}, want: SessionStats{ID: "z"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Summarize(tt.in)
			assert.InDelta(t, tt.want.ReuseFraction, got.ReuseFraction, 1e-12)
			got.ReuseFraction = tt.want.ReuseFraction
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestWriteStats(t *testing.T) {
	stats := []SessionStats{
		{
			ID: "claude:1", Calls: 10, FirstPrompt: 32272, PeakContext: 49157, MedianPrompt: 42232,
			ReuseFraction: 0.9506, FollowUpReused: 900, FollowUpPrompt: 1000,
			ToolTime: ms(72542), HumanTime: ms(19913), Duration: ms(201684),
		},
		{
			ID: "b", Calls: 2, FirstPrompt: 1000, PeakContext: 2000, MedianPrompt: 1500,
			ReuseFraction: 0, FollowUpReused: 0, FollowUpPrompt: 1000,
			ToolTime: ms(49), Duration: ms(1951),
		},
		{
			ID: "c", Calls: 1, FirstPrompt: 500, PeakContext: 600, MedianPrompt: 500,
		},
	}
	var buf bytes.Buffer
	require.NoError(t, WriteStats(&buf, stats))
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, 5, "header, three sessions, all")

	var rows [][]string
	for _, l := range lines {
		rows = append(rows, strings.Fields(l))
	}
	assert.Equal(t, []string{"session", "calls", "first_prompt", "peak_context", "median_prompt", "reuse", "tool_s", "human_s", "duration_s"}, rows[0])
	assert.Equal(t, []string{"claude:1", "10", "32272", "49157", "42232", "0.951", "72.5", "19.9", "201.7"}, rows[1])
	assert.Equal(t, []string{"b", "2", "1000", "2000", "1500", "0.000", "0.0", "0.0", "2.0"}, rows[2])
	// all: 13 calls, median first prompt 1000, median peak 2000, reuse 900/2000 by tokens (not the
	// mean of 0.951 and 0), times summed.
	assert.Equal(t, []string{"all", "(3", "sessions)", "13", "1000", "2000", "-", "0.450", "72.6", "19.9", "203.6"}, rows[4])

	// Aligned: every column starts at the same offset on every line.
	for _, col := range []string{"calls", "reuse", "duration_s"} {
		off := strings.Index(lines[0], col)
		for _, l := range lines[1:] {
			require.Greater(t, len(l), off)
			assert.NotEqual(t, byte(' '), l[off], "column %s in %q", col, l)
			assert.Equal(t, byte(' '), l[off-1], "column %s in %q", col, l)
		}
	}
}

func TestWriteStatsEmpty(t *testing.T) {
	var buf bytes.Buffer
	require.NoError(t, WriteStats(&buf, nil))
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	require.Len(t, lines, 2)
	assert.Equal(t, []string{"all", "(0", "sessions)", "0", "0", "0", "-", "0.000", "0.0", "0.0", "0.0"}, strings.Fields(lines[1]))
}

func TestWriteStatsReportsWriteError(t *testing.T) {
	err := WriteStats(failWriter{}, []SessionStats{{ID: "a"}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "disk full")
}
