package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestBarDrawsOnlyAfterDelay(t *testing.T) {
	now := time.Unix(0, 0)
	clock := func() time.Time { return now }
	var out bytes.Buffer
	b := New(&out, "sim", clock, time.Second)
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
	assert.Equal(t, 2, bytes.Count(out.Bytes(), []byte("\r")), "an unchanged percentage is not redrawn")
	assert.True(t, bytes.HasSuffix(out.Bytes(), []byte("\n")))

	var nilBar *Bar
	nilBar.Set(1)
	nilBar.Done()
}

func TestBarClear(t *testing.T) {
	now := time.Unix(0, 0)
	var out bytes.Buffer
	b := New(&out, "demo", func() time.Time { return now }, 0)
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
