package testclock

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestClockMovesOnlyWhenTold(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := New(t0)
	assert.Equal(t, t0, c.Now())
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { c.Advance(time.Second) })
	}
	wg.Wait()
	assert.Equal(t, t0.Add(10*time.Second), c.Now())
	assert.Equal(t, t0.Add(11*time.Second), c.Advance(time.Second))
}
