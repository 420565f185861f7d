package daemon

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/lender"
)

// TestDecodePool: the lender sees one instance per decode target, with free KV never counting
// lent KV twice, and an instance it cannot judge (stale, incomplete) without numbers; with no
// per-instance readings, the pool's sums as one instance.
func TestDecodePool(t *testing.T) {
	ok := func(v float64) collector.Value { return collector.Value{V: v, State: collector.OK} }
	for _, tc := range []struct {
		name string
		snap collector.Snapshot
		want []lender.Instance
	}{
		{"per instance", collector.Snapshot{Decode: []collector.DecodeInstance{
			{Name: "decode-0", State: collector.OK, Complete: true, CapacityTokens: 800, FreeTokens: 500, ReservedTokens: 300, Waiting: 2},
			// SGLang's "available" may include the retained pages sticky routing lends: 700 free
			// of 800 with 300 reserved and 200 lent is really 300.
			{Name: "decode-1", State: collector.OK, Complete: true, CapacityTokens: 800, FreeTokens: 500, ReservedTokens: 300, LentTokens: 200},
			{Name: "decode-2", State: collector.Stale, Complete: true, CapacityTokens: 800, FreeTokens: 800},
			{Name: "decode-3", State: collector.OK, Complete: false, CapacityTokens: 800},
			{Name: "decode-4"},
		}}, []lender.Instance{
			{Name: "decode-0", CapacityTokens: 800, FreeTokens: 500, ReservedTokens: 300, Waiting: 2},
			{Name: "decode-1", CapacityTokens: 800, FreeTokens: 300, ReservedTokens: 300, LentTokens: 200},
			{Name: "decode-2"}, {Name: "decode-3"}, {Name: "decode-4"},
		}},
		{"pool sums only", collector.Snapshot{Signals: map[collector.Signal]collector.Value{
			collector.DecodeCapacity: ok(1600), collector.DecodeFree: ok(900), collector.DecodeReserved: ok(700)}},
			[]lender.Instance{{Name: "decode", CapacityTokens: 1600, FreeTokens: 900, ReservedTokens: 700}}},
		{"nothing", collector.Snapshot{}, []lender.Instance{{Name: "decode"}}},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, decodePool(tc.snap)) })
	}
}
