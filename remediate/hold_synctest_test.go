package remediate

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/detector"
)

// TestHoldLifecycleOnTheBubblesClock steps the policy every 5 s on the synctest bubble's clock
// against a small model of a trapped gateway: ten sessions of 150K on a 1M cache, each active
// session finishing after 6 minutes of running, a newcomer arriving every minute, and a hit rate
// of 0.95 while the active working set fits the cache, 0.3 past it. The policy holds once the
// incident has lasted HoldAfter,
// resumes nothing while the hit rate is off its plateau, resumes at most one quota of context a
// step, never holds a session admitted after the incident began, and ends the incident only
// once nobody is held.
func TestHoldLifecycleOnTheBubblesClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		type sess struct {
			LiveSession
			ran time.Duration // time running (not held)
		}
		var live []*sess
		for i := range 10 {
			live = append(live, &sess{LiveSession: LiveSession{ID: fmt.Sprintf("s%d", i), Admitted: start.Add(-time.Hour),
				Priority: start.Add(-time.Hour + time.Duration(i)*time.Minute), Context: 150_000}})
		}
		view := func() Gateway {
			g := Gateway{Budget: 1_000_000, Reference: 1_000_000}
			for _, s := range live {
				g.Sessions = append(g.Sessions, s.LiveSession)
				g.WorkingSet += s.Context
				if s.Held {
					g.Held++
					g.HeldTokens += s.Context
				}
			}
			g.Live = len(live)
			return g
		}
		p := newPolicy(t, Options{})
		hit := 0.3
		var incidentAt time.Time
		held, resumedAll, newcomers := 0, false, 0
		var lastState detector.State
		var since time.Time
		for step := 0; step < 12*30; step++ { // 30 minutes
			now := time.Now()
			g := view()
			state := detector.Trapped
			if hit > 0.9 {
				state = detector.Recovering
			}
			if state != lastState {
				lastState, since = state, now
			}
			a := assess(now, state, hit)
			a.Since = since
			plan := p.Decide(Inputs{At: now, Assessment: a, Gateway: g, GatewayOK: true})
			if incidentAt.IsZero() && p.State().Mode == Incident {
				incidentAt = now
			}
			if h := plan.Hold; h != nil {
				if hit < 0.9 {
					assert.Empty(t, h.Resume, "step %d: nothing resumed while the hit rate is off its plateau", step)
				}
				var back int64
				byID := map[string]*sess{}
				for _, s := range live {
					byID[s.ID] = s
				}
				for _, id := range h.Hold {
					s := byID[id]
					require.NotNil(t, s)
					assert.True(t, s.Admitted.Before(incidentAt), "step %d: %s was admitted after the incident began", step, id)
					s.Held = true
				}
				for _, id := range h.Resume {
					s := byID[id]
					require.True(t, s.Held, "step %d: %s resumed without being held", step, id)
					s.Held = false
					back += s.Context
				}
				if len(h.Resume) > 1 {
					assert.LessOrEqual(t, back, part(DefaultHoldResumeFraction, 700_000), "step %d: at most a quota of context a step", step)
				}
			}
			if p.State().Mode == Normal && !incidentAt.IsZero() {
				require.Zero(t, view().Held, "step %d: the incident ended with sessions still held", step)
			}
			time.Sleep(5 * time.Second)
			// The model: active sessions run; one that has run 3 minutes ends; a newcomer a minute.
			var active int64
			kept := live[:0]
			for _, s := range live {
				if !s.Held {
					s.ran += 5 * time.Second
				}
				if s.ran >= 6*time.Minute {
					continue
				}
				kept = append(kept, s)
				if !s.Held {
					active += s.Context
				}
			}
			live = kept
			if (step+1)%12 == 0 {
				newcomers++
				now := time.Now()
				live = append(live, &sess{LiveSession: LiveSession{ID: fmt.Sprintf("n%d", newcomers), Admitted: now, Priority: now, Context: 100_000}})
				active += 100_000
			}
			hit = 0.3
			if active <= 1_000_000 {
				hit = 0.95
			}
			if g := view(); g.Held > 0 {
				held = max(held, g.Held)
			} else if held > 0 {
				resumedAll = true
			}
		}
		assert.Positive(t, held, "the policy held sessions")
		assert.True(t, resumedAll, "every held session came back within 30 minutes")
		assert.Equal(t, Normal, p.State().Mode, "the incident ended")
		assert.Zero(t, view().Held)
	})
}
