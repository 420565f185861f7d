package progress

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// terminal is a writer whose Stat says character device, as a terminal's *os.File does.
type terminal struct{ bytes.Buffer }

func (*terminal) Stat() (os.FileInfo, error) { return charDevice{}, nil }

type charDevice struct{ os.FileInfo }

func (charDevice) Mode() os.FileMode { return os.ModeDevice | os.ModeCharDevice | 0o620 }

func TestIsTerminal(t *testing.T) {
	assert.True(t, IsTerminal(&terminal{}))
	assert.False(t, IsTerminal(&bytes.Buffer{}), "no Stat: not a terminal")

	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	require.NoError(t, err)
	defer f.Close()
	assert.False(t, IsTerminal(f), "a regular file (stderr redirected to a file)")

	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	assert.False(t, IsTerminal(w), "a pipe (stderr captured by CI or a script)")
}

func TestBarDrawsOnlyAfterDelay(t *testing.T) {
	now := time.Unix(0, 0)
	clock := func() time.Time { return now }
	out := &terminal{}
	b := New(out, "sim", clock, time.Second)
	b.Set(0.5)
	b.Done()
	assert.Empty(t, out.String(), "work shorter than the delay draws nothing")

	now = now.Add(2 * time.Second)
	b.Set(0.5)
	b.Set(0.5)
	b.Set(1.5)
	b.Done()
	s := out.String()
	assert.Contains(t, s, " 50%")
	assert.Contains(t, s, "100%", "values above one are clamped")
	assert.Equal(t, 2, strings.Count(s, "\r"), "an unchanged percentage is not redrawn")
	assert.True(t, strings.HasSuffix(s, "\n"))

	var nilBar *Bar
	nilBar.Set(1)
	nilBar.Done()
}

func TestBarClear(t *testing.T) {
	now := time.Unix(0, 0)
	out := &terminal{}
	b := New(out, "demo", func() time.Time { return now }, 0)
	b.Clear()
	assert.Empty(t, out.String(), "nothing drawn, nothing to clear")

	b.Set(0.3)
	b.Clear()
	s := out.String()
	assert.True(t, strings.HasSuffix(s, "\r"), "the cursor is back at the start of the line: %q", s)
	blank := s[strings.Index(s, "%")+1:]
	assert.GreaterOrEqual(t, strings.Count(blank, " "), len("demo [")+width+len("] 30%"), "the whole bar is overwritten")

	b.Set(0.3)
	assert.Equal(t, 2, strings.Count(out.String(), "30%"), "the same percentage is drawn again after a clear")
	b.Done()
	b.Clear()
	assert.True(t, strings.HasSuffix(out.String(), "\n"), "a finished bar is not cleared")
}

func TestBarNote(t *testing.T) {
	now := time.Unix(0, 0)
	out := &terminal{}
	b := New(out, "calibrating", func() time.Time { return now }, 0)
	b.SetNote(0.5, "step 3/6, W/C 1.20, hit 0.93")
	assert.Contains(t, out.String(), " 50% step 3/6, W/C 1.20, hit 0.93")
	out.Reset()
	b.SetNote(0.5, "step 4/6")
	assert.Contains(t, out.String(), strings.Repeat(" ", len("step 3/6, W/C 1.20, hit 0.93")),
		"a shorter note first blanks the longer one's tail")
	assert.True(t, strings.HasSuffix(out.String(), " 50% step 4/6"))
}

// TestBarNotOnATerminal: written to a log or a pipe, the bar is plain lines — no carriage
// returns — at most one per PlainEvery, and the last state is written when the work ends.
func TestBarNotOnATerminal(t *testing.T) {
	now := time.Unix(0, 0)
	var out bytes.Buffer
	b := New(&out, "sim", func() time.Time { return now }, time.Second)
	b.Set(0.05)
	assert.Empty(t, out.String(), "short work writes nothing")

	now = now.Add(2 * time.Second)
	b.SetNote(0.1, "3 sessions")
	assert.Equal(t, "sim: 10% after 2s, 3 sessions\n", out.String())
	now = now.Add(3 * time.Second)
	b.Set(0.2)
	b.Clear()
	assert.Equal(t, "sim: 10% after 2s, 3 sessions\n", out.String(), "one line per PlainEvery at most; Clear is a no-op")
	now = now.Add(PlainEvery)
	b.Set(0.6)
	b.Set(1)
	b.Done()
	assert.Equal(t, "sim: 10% after 2s, 3 sessions\nsim: 60% after 15s\nsim: 100% after 15s\n", out.String(),
		"the end is written even within PlainEvery")
	assert.NotContains(t, out.String(), "\r")

	var quiet bytes.Buffer
	q := New(&quiet, "sim", func() time.Time { return now }, time.Second)
	q.Set(1)
	q.Done()
	assert.Empty(t, quiet.String(), "work shorter than the delay writes nothing, not even at the end")
}
