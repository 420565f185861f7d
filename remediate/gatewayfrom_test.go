package remediate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
)

// TestGatewayFromLeavesDormantSessionsOut: the core lists dormant sessions but counts them out of
// W and the live count; the policy's view does too, so a hold never picks one.
func TestGatewayFromLeavesDormantSessionsOut(t *testing.T) {
	s := adminapi.StateView{Live: 2, WorkingSet: 300, Dormant: 1, DormantTokens: 500,
		Sessions: []adminapi.LiveSession{
			{ID: "a", Context: 100, Admitted: t0},
			{ID: "gone", Context: 500, Admitted: t0, Dormant: true},
			{ID: "b", Context: 200, Admitted: t0.Add(time.Minute), Held: true},
		}}
	g := GatewayFrom(s)
	require.Len(t, g.Sessions, 2)
	assert.Equal(t, "a", g.Sessions[0].ID)
	assert.Equal(t, "b", g.Sessions[1].ID)
	assert.True(t, g.Sessions[1].Held)
	assert.Equal(t, g.Live, len(g.Sessions), "the listing agrees with the live count")
}

// A hold's summary counts in words: one session, or many.
func TestHoldSummaryCounts(t *testing.T) {
	for _, tc := range []struct {
		h    HoldAction
		want string
	}{
		{HoldAction{Hold: []string{"a"}, Held: 1, Active: 5}, "holding 1 session's next calls so the other 5 fit the cache (hold 1 more)"},
		{HoldAction{Hold: []string{"a", "b"}, Held: 34, Active: 58}, "holding 34 sessions' next calls so the other 58 fit the cache (hold 2 more)"},
		{HoldAction{Resume: []string{"a"}, Held: 3}, "resuming 1 held session; 3 still held"},
		{HoldAction{Resume: []string{"a", "b"}, Held: 1}, "resuming 2 held sessions; 1 still held"},
		{HoldAction{Resume: []string{"a"}}, "resuming the last held session"},
		{HoldAction{Resume: []string{"a", "b"}}, "resuming the last 2 held sessions"},
	} {
		assert.Equal(t, tc.want, tc.h.Summary())
	}
}
