package experiment

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParallel is the worker pool every sweep runs on, small enough for the race pass (which
// skips the sweeps themselves): each job runs once into its own slot, no more than k at a time,
// progress counts up to n, and every job's error comes back.
func TestParallel(t *testing.T) {
	const n, k = 50, 3
	slots := make([]int, n)
	var running, most atomic.Int32
	var last int
	err := parallel(n, k, func(i int) error {
		cur := running.Add(1)
		defer running.Add(-1)
		for {
			m := most.Load()
			if cur <= m || most.CompareAndSwap(m, cur) {
				break
			}
		}
		slots[i]++
		if i%10 == 0 {
			return errors.New("job failed")
		}
		return nil
	}, func(done, total int) {
		assert.Equal(t, n, total)
		assert.Equal(t, last+1, done, "progress counts one by one")
		last = done
	})
	joined, ok := err.(interface{ Unwrap() []error })
	require.True(t, ok, "the jobs' errors joined: %v", err)
	assert.Len(t, joined.Unwrap(), n/10, "jobs 0, 10, 20, 30 and 40 failed")
	for i, c := range slots {
		assert.Equal(t, 1, c, "job %d", i)
	}
	assert.LessOrEqual(t, most.Load(), int32(k))
	assert.Equal(t, n, last)
}
