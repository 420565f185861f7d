package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/replication"
)

// scenarioOutcome is what a client and an operator see of TestOneScenarioAloneAndReplicated.
type scenarioOutcome struct {
	Queue    []string
	Budget   adminapi.BudgetResult
	Live     int
	Counters adminapi.Counters
}

// TestOneScenarioAloneAndReplicated runs the same scenario through both replicators: a gateway
// alone (single), and a follower of a leader on one store (replication.Replica), which asks the
// leader to admit, reports its calls to it and forwards the admin API to it. On a budget of one
// session, a session is admitted at once, a second queues behind it and is admitted when the
// first ends, and a budget raised through the admin API admits a third at once. Both answer
// every call and admin request alike, and end with the same admission state.
func TestOneScenarioAloneAndReplicated(t *testing.T) {
	outcomes := map[string]scenarioOutcome{}
	for _, tc := range []struct {
		name  string
		start func(t *testing.T, upstream string) *harness
		leads bool
	}{
		{name: "single", leads: true, start: func(t *testing.T, upstream string) *harness {
			return start(t, baseConfig(t, []string{upstream}, func(c *Config) {
				c.Admission.BudgetTokens, c.Admission.ReferenceBudgetTokens = 1, 1
			}), nil)
		}},
		{name: "replicated", leads: false, start: func(t *testing.T, upstream string) *harness {
			mr := miniredis.RunT(t)
			_, followers := leaderOf(t, startReplicas(t, 2, mr.Addr(), upstream, ""))
			return followers[0]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newFakeUpstream(t, okJSON(1000, 10))
			h := tc.start(t, up.URL)
			require.Equal(t, tc.leads, h.g.repl.Leads(), "the gateway driven is the one whose replicator is tested")
			if !tc.leads {
				require.IsType(t, &replication.Replica{}, h.g.repl)
			}
			var out scenarioOutcome

			// a is admitted at once; b queues behind it.
			r := h.chat("a", 5, nil)
			require.Equal(t, http.StatusOK, r.status, "%s", r)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b := h.chatAsync(ctx, "b", 5, nil)
			for _, q := range h.waitQueued(1).Queue {
				out.Queue = append(out.Queue, q.ID)
			}
			notAnswered(t, b, "b queued behind a")

			// a ends: b is admitted from the queue.
			r = h.chat("a", 5, map[string]string{"x-session-end": "true"})
			require.Equal(t, http.StatusOK, r.status, "%s", r)
			r = answered(t, b)
			require.Equal(t, http.StatusOK, r.status, "b admitted once a ended: %s", r)

			// The budget raised: c is admitted at once beside b.
			r = h.adminDo(http.MethodPut, "/admin/budget", testToken, `{"tokens":50000,"reason":"test"}`)
			require.Equal(t, http.StatusOK, r.status, "%s", r)
			require.NoError(t, json.Unmarshal(r.body, &out.Budget))
			out.Budget.WorkingSetTokens, out.Budget.Effect = 0, "" // b's context, as far as reported yet
			r = h.chat("c", 5, nil)
			require.Equal(t, http.StatusOK, r.status, "%s", r)

			h.settle()
			var st adminapi.StateView
			waitFor(t, "every call accounted for where admission is decided", func() bool {
				st = h.state()
				return st.InCall == 0 && st.Live == 2
			})
			out.Live, out.Counters = st.Live, st.Counters
			assert.Equal(t, int64(50000), st.Budget)
			assert.Equal(t, []string{"b"}, out.Queue)
			assert.Equal(t, uint64(3), out.Counters.Arrivals)
			assert.Equal(t, uint64(2), out.Counters.AdmittedAtOnce)
			assert.Equal(t, uint64(1), out.Counters.AdmittedFromQueue)
			assert.Equal(t, uint64(1), out.Counters.Ended)
			assert.Equal(t, int64(1), out.Budget.Before.BudgetTokens)
			assert.Equal(t, int64(50000), out.Budget.After.BudgetTokens)
			assert.Empty(t, out.Budget.Admitted)
			outcomes[tc.name] = out
		})
	}
	if len(outcomes) == 2 {
		assert.Equal(t, outcomes["single"], outcomes["replicated"], "alone and replicated, the same scenario ends the same")
	}
}
