package ratelog

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestLimiter(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	l := Limiter{Every: time.Minute}
	type step struct {
		at   time.Duration
		ok   bool
		held int
	}
	for i, s := range []step{
		{0, true, 0},                 // the first at once
		{time.Second, false, 0},      // held
		{30 * time.Second, false, 0}, // held
		{time.Minute, true, 2},       // a minute on: logged, with the two held
		{61 * time.Second, false, 0},
		{30 * time.Second, true, 1}, // the clock went back: logged at once
	} {
		ok, held := l.Allow(t0.Add(s.at))
		assert.Equal(t, s.ok, ok, "step %d", i)
		assert.Equal(t, s.held, held, "step %d", i)
	}
	var zero Limiter
	for range 3 {
		ok, _ := zero.Allow(t0)
		assert.True(t, ok, "the zero value logs every event")
	}
}
