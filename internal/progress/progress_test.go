package progress

import (
	"bytes"
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
