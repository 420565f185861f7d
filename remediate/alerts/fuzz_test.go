package alerts

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzDecode feeds arbitrary bodies to the decoder. It must never panic; a rejection names a
// field (or the body) at the start of its message; an accepted payload satisfies everything the
// receiver relies on, re-encodes to an accepted payload, and applied to a tracker (twice, as a
// duplicate delivery) leaves consistent state.
func FuzzDecode(f *testing.F) {
	for _, name := range []string{"firing.json", "resolved.json"} {
		f.Add(readTestdata(f, name))
	}
	f.Add([]byte(`{"version":"4","status":"firing","alerts":[{"status":"firing","labels":{"alertname":"BasinTrapped"},"startsAt":"2025-06-03T14:00:00Z"}]}`))
	f.Add([]byte(`{"version":"4","status":"resolved","alerts":[{"status":"resolved","labels":{"alertname":"BasinTrapped"},"startsAt":"2025-06-03T14:00:00Z","endsAt":"2025-06-03T13:00:00Z"}]}`))
	f.Add([]byte(`{"version":"4","status":"firing","alerts":[{"status":"firing","labels":{"alertname":"BasinTrapped"},"startsAt":"2025-06-03T14:00:00Z","endsAt":"2025-06-03T14:01:00Z"},{"status":"resolved","labels":{"alertname":"BasinTrapped"},"startsAt":"2025-06-03T13:00:00Z","endsAt":"2025-06-03T13:30:00Z"}]}`))
	f.Add([]byte(`{"VERSION":"4","Status":"firing","alerts":[{"status":"firing","labels":{"alertname":7}}]}`))
	f.Add([]byte(`{"version":"4"} {}`))
	f.Add([]byte(`[]`))
	now := time.Date(2025, 6, 3, 14, 10, 0, 0, time.UTC)

	f.Fuzz(func(t *testing.T, body []byte) {
		m, fe := decode(body)
		if fe != nil {
			require.Nil(t, m)
			if fe.Field == "" {
				require.True(t, strings.HasPrefix(fe.Msg, "body: "), "%q", fe.Msg)
			} else {
				require.True(t, strings.HasPrefix(fe.Msg, fe.Field+": "), "%q does not start with %q", fe.Msg, fe.Field)
			}
			return
		}
		require.Equal(t, payloadVersion, m.Version)
		require.NotNil(t, m.Data)
		require.Contains(t, []string{statusFiring, statusResolved}, m.Status)
		require.NotEmpty(t, m.Alerts)
		for _, a := range m.Alerts {
			require.Contains(t, []string{statusFiring, statusResolved}, a.Status)
			require.NotEmpty(t, a.Labels["alertname"])
			require.False(t, a.StartsAt.IsZero())
			require.NotEmpty(t, a.Fingerprint)
		}

		again, err := json.Marshal(m)
		require.NoError(t, err)
		m2, fe := decode(again)
		require.Nil(t, fe, "a re-encoded payload is accepted")
		require.Len(t, m2.Alerts, len(m.Alerts))

		tr := newTracker(DefaultMatchers(), DefaultMaxAge)
		firing := 0
		for i := range m.Alerts {
			a := &m.Alerts[i]
			if a.Status == statusFiring && matchesAny(tr.matchers, a.Labels) {
				firing++
			}
			tr.apply(now, a)
		}
		check := func() {
			require.LessOrEqual(t, len(tr.active), firing, "only matching firing alerts become active")
			for fp, a := range tr.active {
				assert.Equal(t, fp, a.Fingerprint)
				assert.True(t, a.ExpiresAt.After(now), "an active alert has not expired")
				assert.True(t, matchesAny(tr.matchers, a.Labels))
				_, both := tr.resolved[fp]
				assert.False(t, both, "an alert is active or resolved, not both")
			}
		}
		check()
		first := tr.alerts()
		for i := range m.Alerts {
			tr.apply(now, &m.Alerts[i])
		}
		check()
		assert.Equal(t, first, tr.alerts(), "a duplicate delivery changes nothing")
	})
}
