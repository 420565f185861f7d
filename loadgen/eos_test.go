package loadgen

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/internal/agentcall"
)

// Every API's body asks for exactly the scenario's output length (ignore_eos), unless the run
// stops at the model's end of turn.
func TestRequestsAskForTheScenariosOutputLength(t *testing.T) {
	msgs := []message{{Role: "system", Content: "s"}, {Role: "user", Content: "u"}}
	for _, api := range []agentcall.Shape{agentcall.Chat, agentcall.Responses, agentcall.Messages} {
		for _, stop := range []bool{false, true} {
			r := &runner{o: Options{API: api, StopAtEOS: stop, Model: "m"}}
			b, err := json.Marshal(r.request(msgs, 7))
			require.NoError(t, err)
			var body map[string]any
			require.NoError(t, json.Unmarshal(b, &body))
			v, ok := body["ignore_eos"]
			if stop {
				assert.False(t, ok, "%v: no ignore_eos when stopping at EOS: %s", api, b)
			} else {
				assert.Equal(t, true, v, "%v: %s", api, b)
			}
		}
	}
}
