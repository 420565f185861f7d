package daemon

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/remediate"
)

// An acting daemon in an incident on a trapped deployment holds the lowest-priority live sessions'
// next calls through the gateway until the rest fit the cut budget, with the reason in words, and
// reads the live sessions only while it may hold.
func TestDaemonHoldsInATrap(t *testing.T) {
	e := newEnv(t, "")
	for i := range 10 {
		e.gw.sessions = append(e.gw.sessions, adminapi.LiveSession{ID: fmt.Sprintf("s%d", i), Admitted: time.Unix(0, 0),
			Priority: time.Unix(int64(i), 0), Context: 150_000})
	}
	d := e.daemon()
	for range 4 {
		e.step(d)
	}
	e.gw.mu.Lock()
	assert.Zero(t, e.gw.stateSessions, "healthy, nothing held: the live sessions are not listed")
	e.gw.mu.Unlock()

	e.intoIncident(d)
	since := d.StatusNow().Policy.ModeSince
	var holds []holdCall
	var listed int
	for range 2 * int(remediate.DefaultHoldAfter/stepEvery) {
		e.step(d)
		e.gw.mu.Lock()
		holds = append([]holdCall(nil), e.gw.holds...)
		listed = e.gw.stateSessions
		e.gw.mu.Unlock()
		if len(holds) > 0 {
			break
		}
	}
	assert.Positive(t, listed, "trapped: the live sessions are listed")
	require.NotEmpty(t, holds, "the daemon held sessions")
	// The cut first; the first hold once the incident has lasted HoldAfter with the trap still there.
	assert.GreaterOrEqual(t, e.deploymentClock().Now().Sub(since), remediate.DefaultHoldAfter)
	// 1.5M live, B cut to 700K: the six lowest-priority sessions, s9 first.
	assert.Equal(t, []string{"s9", "s8", "s7", "s6", "s5", "s4"}, holds[0].Hold)
	assert.Contains(t, holds[0].Reason, "holding 6 sessions' next calls so the other 4 fit the cache")
	var rec *remediate.Record
	for _, r := range done(auditLines(t, e.cfg.DataDir), "hold") {
		rec = &r
		break
	}
	require.NotNil(t, rec, "the hold is in the audit log")
	assert.Equal(t, holds[0].Hold, rec.Hold.Hold)
	assert.Contains(t, rec.Change(), "holding 6 sessions' next calls")
}
