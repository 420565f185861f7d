package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// addSeeds seeds f with a sample file whole and line by line.
func addSeeds(f *testing.F, path string) {
	data, err := os.ReadFile(path)
	require.NoError(f, err)
	f.Add(data)
	for line := range strings.Lines(string(data)) {
		f.Add([]byte(line))
	}
}

func FuzzReadBasin(f *testing.F) {
	addSeeds(f, "testdata/basin-sample.jsonl")
	f.Add([]byte(row0 + "\n" + `{"session_id":"a","call":1,"start":"2026-06-01T00:00:01+05:30","end":"2026-06-01T00:00:02.000000001Z","prompt_tokens":120,"reused_tokens":7,"output_tokens":0,"gap_before_s":1.25e-3,"turn":"human","tenant":"t","task_chars":3}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		sessions, err := ReadBasin(bytes.NewReader(data))
		if err != nil {
			var pe *ParseError
			assert.ErrorAs(t, err, &pe, "every read error names a line")
			return
		}
		checkSessions(t, sessions)
	})
}

func FuzzReadTraceLab(f *testing.F) {
	addSeeds(f, traceLabSample)
	f.Fuzz(func(t *testing.T, data []byte) {
		sessions, err := ReadTraceLab(bytes.NewReader(data))
		if err != nil {
			var pe *ParseError
			assert.ErrorAs(t, err, &pe, "every read error names a line")
			return
		}
		checkSessions(t, sessions)
	})
}

// checkSessions asserts what every successful read promises, and that basin's format keeps it.
func checkSessions(t *testing.T, sessions []Session) {
	t.Helper()
	for i, s := range sessions {
		require.NotEmpty(t, s.ID)
		require.NotEmpty(t, s.Calls, "session %q", s.ID)
		assert.GreaterOrEqual(t, s.TaskChars, 0)
		if i > 0 {
			prev := sessions[i-1]
			order := prev.Calls[0].Start.Compare(s.Calls[0].Start)
			assert.True(t, order < 0 || order == 0 && prev.ID < s.ID, "sessions %q, %q out of order", prev.ID, s.ID)
		}
		for j, c := range s.Calls {
			assert.Positive(t, c.Prompt)
			assert.GreaterOrEqual(t, c.Reused, 0)
			assert.LessOrEqual(t, c.Reused, c.Prompt)
			assert.GreaterOrEqual(t, c.Output, 0)
			assert.GreaterOrEqual(t, c.GapBefore, time.Duration(0))
			assert.True(t, c.End.IsZero() || !c.End.Before(c.Start), "end before start")
			if j == 0 {
				assert.Zero(t, c.GapBefore)
				assert.False(t, c.Human)
			}
		}
	}

	var buf bytes.Buffer
	require.NoError(t, WriteBasin(&buf, sessions))
	written := buf.Bytes()

	// The rows come out session by session with calls 0, 1, 2, ...
	type place struct {
		SessionID string `json:"session_id"`
		Call      int    `json:"call"`
	}
	var rows []place
	sc := bufio.NewScanner(bytes.NewReader(written))
	sc.Buffer(nil, 2*MaxLineBytes)
	for sc.Scan() {
		var row place
		require.NoError(t, json.Unmarshal(sc.Bytes(), &row))
		rows = append(rows, row)
	}
	require.NoError(t, sc.Err())
	k := 0
	for _, s := range sessions {
		for j := range s.Calls {
			require.Less(t, k, len(rows))
			assert.Equal(t, s.ID, rows[k].SessionID)
			assert.Equal(t, j, rows[k].Call)
			k++
		}
	}
	assert.Equal(t, k, len(rows))

	back, err := ReadBasin(bytes.NewReader(written))
	require.NoError(t, err, "reading back:\n%s", written)
	require.Equal(t, sessions, back)
}
