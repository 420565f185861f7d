package agentbody

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestChat(t *testing.T) {
	base := len(Chat(0)) // the system prompt alone
	for _, size := range []int{0, 50 << 10, 300 << 10} {
		b := Chat(size)
		assert.GreaterOrEqual(t, len(b), size)
		assert.Less(t, len(b), max(size, base)+4<<10, "at most one round over")
		var v struct {
			Stream   bool `json:"stream"`
			Messages []struct {
				Role string `json:"role"`
			} `json:"messages"`
		}
		require.NoError(t, json.Unmarshal(b, &v))
		assert.True(t, v.Stream)
		assert.Equal(t, "system", v.Messages[0].Role)
	}
}

func TestResponsesAndMessages(t *testing.T) {
	for name, build := range map[string]func(int) []byte{"responses": Responses, "messages": Messages} {
		t.Run(name, func(t *testing.T) {
			base := len(build(0))
			for _, size := range []int{0, 300 << 10} {
				b := build(size)
				assert.GreaterOrEqual(t, len(b), size)
				assert.Less(t, len(b), max(size, base)+4<<10, "at most one round over")
				var v map[string]json.RawMessage
				require.NoError(t, json.Unmarshal(b, &v))
				assert.Equal(t, "true", string(v["stream"]))
			}
		})
	}
}
