package inproc

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/admission"
)

// TestStateOfKeepsTheWireBytes: /admin/state was the core's snapshot embedded in the view; the
// view is its own struct now, and a populated snapshot must marshal to the very same bytes
// either way, listed or not, so that no reader of the API sees a change.
func TestStateOfKeepsTheWireBytes(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	full := admission.Snapshot{Mode: admission.ModePeak, CountOnly: true, Budget: 1_000_000, ReferenceBudget: 900_000,
		Reserved: 700_000, WorkingSet: 650_000, Engaged: true, Live: 3, InCall: 2, Queued: 4, OldestWaitSeconds: 12.5, Stale: 1,
		Held: 1, HeldTokens: 40_000, HeldCalls: 1, OldestHeldCallSeconds: 3.25, Dormant: 1, DormantTokens: 9_000,
		DormantAfterSeconds: 600, ToolGaps: 17,
		Sessions: []admission.LiveSession{
			{ID: "a", Tenant: "t1", Arrival: t0, Admitted: t0.Add(time.Second), LastDone: t0.Add(time.Minute), Context: 100,
				Peak: 200, PredictedPeak: 300, Priority: t0.Add(2 * time.Second), Held: true, HeldCallSeconds: 1.5},
			{ID: "b", Arrival: t0, Admitted: t0, Dormant: true},
		},
		Queue: []admission.QueuedSession{{ID: "q", Tenant: "t2", Arrival: t0, Priority: t0.Add(time.Hour), WaitedSeconds: 7.75, Demand: 5000}},
		Counters: admission.Counters{Arrivals: 1, AdmittedAtOnce: 2, AdmittedFromQueue: 3, Queued: 4, OverQuota: 5, Refused: 6,
			Shed: 7, Cancelled: 8, Ended: 9, Staled: 10, TooLate: 11, Held: 12, Resumed: 13, CallsHeld: 14, HoldBoundReleases: 15,
			Dormant: 16, Woken: 17}}
	unlisted := full
	unlisted.Sessions, unlisted.Queue = nil, []admission.QueuedSession{}
	for name, s := range map[string]admission.Snapshot{"listed": full, "not listed": unlisted, "zero": {}} {
		t.Run(name, func(t *testing.T) {
			// What the gateway sent before: the snapshot embedded, then the gateway's fields.
			type embedded struct {
				admission.Snapshot
				Now         time.Time                 `json:"now"`
				Affinity    adminapi.AffinityView     `json:"affinity"`
				Upstreams   []adminapi.UpstreamView   `json:"upstreams"`
				Replication *adminapi.ReplicationView `json:"replication,omitempty"`
				DaemonTerm  uint64                    `json:"daemon_term,omitempty"`
				Speed       float64                   `json:"deployment_speed,omitempty"`
			}
			aff := adminapi.AffinityView{Enabled: true, Header: "x-session-id"}
			ups := []adminapi.UpstreamView{{URL: "http://up", Sessions: 3}}
			repl := &adminapi.ReplicationView{ReplicaID: "r1", Leading: true}
			want, err := json.Marshal(embedded{Snapshot: s, Now: t0, Affinity: aff, Upstreams: ups, Replication: repl, DaemonTerm: 4, Speed: 2})
			require.NoError(t, err)
			v := StateOf(s)
			v.Now, v.Affinity, v.Upstreams, v.Replication, v.DaemonTerm, v.DeploymentSpeed = t0, aff, ups, repl, 4, 2
			got, err := json.Marshal(v)
			require.NoError(t, err)
			assert.JSONEq(t, string(want), string(got))
			assert.Equal(t, string(want), string(got), "byte for byte")
		})
	}
}

// TestWireTypesNameEveryCoreField: the wire types are copies of the core's, field by field. A
// field added to the core and not to the wire (or with another JSON name) would vanish from
// /admin/state without a failing byte comparison when it is omitted while empty; this names it.
func TestWireTypesNameEveryCoreField(t *testing.T) {
	for _, c := range []struct {
		name       string
		core, wire any
	}{
		{"Snapshot", admission.Snapshot{}, adminapi.StateView{}},
		{"LiveSession", admission.LiveSession{}, adminapi.LiveSession{}},
		{"QueuedSession", admission.QueuedSession{}, adminapi.QueuedSession{}},
		{"Counters", admission.Counters{}, adminapi.Counters{}},
	} {
		wire := jsonFields(reflect.TypeOf(c.wire))
		for name, tag := range jsonFields(reflect.TypeOf(c.core)) {
			assert.Equal(t, tag, wire[name], "%s.%s: its JSON name on the wire", c.name, name)
		}
	}
}

// jsonFields maps a struct's exported fields to their JSON tags.
func jsonFields(t reflect.Type) map[string]string {
	out := map[string]string{}
	for f := range t.Fields() {
		if f.IsExported() {
			out[f.Name] = f.Tag.Get("json")
		}
	}
	return out
}
