package admission

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/predictor"
)

// A fresh gateway with the fallback predictor: the first two sessions queue with its know-nothing
// prediction (4 × the first call); then a short session ends, and later sessions, larger by their
// first calls, arrive while the budget frees up. A fallback that trusts its one observed peak
// calls every later session its first call (12K), and uncapped, the later ones are ahead for the
// next 20 minutes: the first two are still queued when the gateway answers them 503 at its
// max_queue_wait. The default fallback does not let fewer than predictor.DefaultMinObserved
// peaks call a session smaller than its know-nothing guess, so the later ones are 4 × 12K and
// queue behind; a lead capped under the queue wait gets the same order from the core's side.
func TestEarliestArrivalsAreAdmittedBeforeTheQueueWait(t *testing.T) {
	const maxQueueWait = 30 * time.Second
	cases := []struct {
		name        string
		minObserved int // of the fallback predictor; 0: its default
		maxLead     time.Duration
		// admitted: whether the first two are admitted before max_queue_wait; laterAdmitted:
		// how many of the later ones fit beside them (of the 20K left after their 80K).
		admitted      bool
		laterAdmitted int
	}{
		{"the default fallback, uncapped (the paper's order)", 0, 0, true, 0},
		{"a fallback that trusts one peak, lead capped under the queue wait", 1, maxQueueWait / 2, true, 1},
		{"a fallback that trusts one peak, uncapped", 1, 0, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				fb, err := predictor.NewFallback(predictor.FallbackOptions{MinObserved: tc.minObserved})
				require.NoError(t, err)
				c := core(t, Options{Budget: 100_000, ReferenceBudget: 1, Mode: ModePeak, MaxLead: tc.maxLead})
				admittedAt := map[string]time.Duration{}
				take := func(evs []Event) {
					for _, e := range evs {
						switch e.Kind {
						case EventAdmitted:
							admittedAt[e.ID] = e.Waited
						case EventEnded:
							fb.Observe(e.Peak)
						}
					}
				}
				arrive := func(id string, first int64) Verdict {
					d := c.Arrive(time.Now(), req(id, first, fb.PredictPeak("", 0, int(first))))
					take(d.Events)
					return d.Verdict
				}
				// Nothing has ended: the fallback predicts 4 × the first call.
				require.Equal(t, Admitted, arrive("long", 20_000)) // demand 80K
				require.Equal(t, Admitted, arrive("short", 5_000)) // 20K: 100K reserved
				require.Equal(t, Queued, arrive("early1", 10_000)) // 40K each
				time.Sleep(time.Second)
				require.Equal(t, Queued, arrive("early2", 10_000))
				time.Sleep(4 * time.Second)
				// The short session ends first, as short ones do: the predictor's one peak.
				c.Begin(time.Now(), "short", 6_000)
				take(c.Finish(time.Now(), "short", 6_000))
				take(c.End(time.Now(), "short"))
				require.Equal(t, 1, fb.Observed())
				// Later sessions, every one larger by its first call than the first two.
				var later []string
				for i := range 10 {
					time.Sleep(time.Second)
					id := fmt.Sprint("later", i)
					later = append(later, id)
					arrive(id, 12_000)
				}
				// The long session ends 20 s in: 80K free.
				time.Sleep(20*time.Second - time.Since(start))
				take(c.End(time.Now(), "long"))
				time.Sleep(maxQueueWait - time.Since(start))
				check(t, c)

				for _, id := range []string{"early1", "early2"} {
					waited, ok := admittedAt[id]
					assert.Equal(t, tc.admitted, ok && waited < maxQueueWait, "%s admitted before max_queue_wait (waited %v, admitted %t)",
						id, waited, ok)
				}
				if tc.admitted {
					n := 0
					for _, id := range later {
						if _, ok := admittedAt[id]; ok {
							n++
						}
					}
					assert.Equal(t, tc.laterAdmitted, n, "the later ones that fit in the 20K left after the early ones")
					assert.Equal(t, len(later)-n, c.Snapshot(time.Now(), false).Queued, "the rest of the later ones queue")
				}
			})
		})
	}
}

// The cap moves the priority only: a lead under it is the paper's peak/r, and it is validated.
func TestMaxLeadCapsThePriority(t *testing.T) {
	c := core(t, Options{Budget: 100, MaxLead: time.Minute})
	c.Arrive(at(0), req("blocker", 100, 0))
	assert.Equal(t, at(1+10), c.Arrive(at(1), req("small", 10, 300)).Priority, "300/30 = 10 s: under the cap")
	assert.Equal(t, at(2+60), c.Arrive(at(2), req("big", 10, 30_000)).Priority, "1000 s capped at a minute")
	assert.ErrorContains(t, Options{Budget: 1, MaxLead: -time.Second}.Validate(), "max_lead")
}
