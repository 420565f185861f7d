package trace

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

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
	var wg sync.WaitGroup
	for _, id := range []string{first, again} {
		wg.Go(func() {
			for i := range 50 {
				c := Call{Start: at(2, 0, i, 0), End: at(2, 0, i, 5e8), Prompt: 100 + i, Output: 1}
				if i > 0 {
					c.GapBefore = ms(500)
				}
				assert.NoError(t, rec.Record(Row{SessionID: id, Index: i, Tenant: tenant, TaskChars: 9, Call: c, DefaultReuse: true}))
			}
		})
	}
	wg.Wait()
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
