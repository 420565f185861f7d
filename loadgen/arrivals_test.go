package loadgen

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/sim"
	"github.com/basin-dev/basin/sim/scenario"
)

func parseScenario(t *testing.T, yaml string) *scenario.Scenario {
	t.Helper()
	sc, err := scenario.Parse([]byte(yaml))
	require.NoError(t, err)
	return sc
}

// The same seed offers the same sessions as the simulator: compare arrivals minute by minute with
// a simulator run of a scenario that has a spike, a rate dip (thinning) and an extra stream.
func TestOffersMatchSimulator(t *testing.T) {
	sc := parseScenario(t, `name: mirror
seed: 11
duration: 30m
deployment: {preset: paper-1p1d-h100}
workload: {kind: short}
arrivals:
  rate_per_min: 2
  spikes: [{from: 5m, to: 10m, multiplier: 3}, {from: 15m, to: 22m, multiplier: 0.4}]
  extra: [{from: 20m, to: 25m, rate_per_min: 4, kill_at: 25m}]
`)
	so, err := sc.Options("")
	require.NoError(t, err)
	ofs, err := offers(so, DefaultMaxSessions)
	require.NoError(t, err)
	perMinute := make([]int, 30)
	streams := map[int]int{}
	for _, of := range ofs {
		perMinute[int(of.At/time.Minute)]++
		streams[of.Stream]++
	}
	require.Len(t, streams, 3, "every stream offers sessions")

	res, err := scenario.Run(sc, "", nil)
	require.NoError(t, err)
	require.Len(t, res.Timeline, 30)
	want := make([]int, 30)
	for i, m := range res.Timeline {
		want[i] = m.Arrivals
	}
	assert.Equal(t, want, perMinute)

	// Thinning dropped some arrivals of the base stream: indexes skip.
	skipped := false
	var next uint64
	for _, of := range ofs {
		if of.Stream == 0 {
			skipped = skipped || of.Index != next
			next = of.Index + 1
		}
	}
	assert.True(t, skipped, "a 0.4× dip thins the base stream")
}

func TestOffersCap(t *testing.T) {
	sc := parseScenario(t, `name: cap
seed: 1
duration: 10m
deployment: {preset: paper-1p1d-h100}
workload: {kind: short}
arrivals: {rate_per_min: 10}
`)
	so, err := sc.Options("")
	require.NoError(t, err)
	_, err = offers(so, 20)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "max_sessions")
	ofs, err := offers(so, 1000)
	require.NoError(t, err)
	assert.Greater(t, len(ofs), 50)
}

// serveTokens is sim/serve's count: ceil(chars / 4) + 4 per message; shared the same over the
// leading system messages.
func serveTokens(msgs []message) (prompt, shared int) {
	chars, sharedChars, sharedMsgs := 0, 0, 0
	leading := true
	for _, m := range msgs {
		n := utf8.RuneCountInString(m.Content)
		chars += n
		if leading && m.Role == "system" {
			sharedChars += n
			sharedMsgs++
		} else {
			leading = false
		}
	}
	prompt = (chars+3)/4 + 4*len(msgs)
	if sharedMsgs > 0 {
		shared = (sharedChars+3)/4 + 4*sharedMsgs
	}
	return prompt, shared
}

// words is an answer of n three-letter words, as sim/serve writes one (n tokens when sent back).
func words(n int) string { return strings.TrimSpace(strings.Repeat("the ", n)) }

func TestConversationSizing(t *testing.T) {
	for _, kind := range sim.SyntheticWorkloadNames() {
		t.Run(kind, func(t *testing.T) {
			w, err := sim.SyntheticWorkload(kind)
			require.NoError(t, err)
			for idx := range uint64(5) {
				spec := w.Session(sim.SessionRNG(1, 0, idx))
				c := newConversation("run-1", systemPrompt(spec.Shared))
				answer := ""
				for i, call := range spec.Calls {
					msgs := c.prompt(i, answer, call.Prompt)
					prompt, shared := serveTokens(msgs)
					require.Equal(t, call.Prompt, prompt, "call %d", i)
					require.Equal(t, spec.Shared, shared, "call %d", i)
					assert.Len(t, msgs, 2+2*i, "system, task, then answer and tool result per call")
					answer = words(call.Output)
				}
			}
		})
	}
}

func TestConversationOvershootsOnlyByTheHeading(t *testing.T) {
	c := newConversation("s", systemPrompt(100))
	msgs := c.prompt(0, "", 200)
	p, _ := serveTokens(msgs)
	require.Equal(t, 200, p)
	// The answer alone is longer than the room the next prompt leaves: the tool result is just
	// its heading.
	msgs = c.prompt(1, words(500), 250)
	p, _ = serveTokens(msgs)
	assert.Greater(t, p, 250)
	assert.Equal(t, "Result of tool call 1:", msgs[len(msgs)-1].Content)
}

func TestSessionsShareOnlyTheSystemPrompt(t *testing.T) {
	a := newConversation("run-1", systemPrompt(7000)).prompt(0, "", 9000)
	b := newConversation("run-2", systemPrompt(7000)).prompt(0, "", 9000)
	assert.Equal(t, a[0], b[0], "the system prompt is the same for every session")
	assert.NotEqual(t, a[1].Content[:24], b[1].Content[:24], "the task starts with the session's id")
	body, err := json.Marshal(a)
	require.NoError(t, err)
	assert.True(t, utf8.Valid(body))
}

func TestFiller(t *testing.T) {
	for _, n := range []int{-3, 0, 1, 3, 4, 5, 63, 64, 1001} {
		f := filler(n)
		assert.Len(t, f, max(0, n), "n=%d", n)
	}
	assert.Equal(t, " map key", filler(8))
}
