package loadgen

import (
	"context"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOptionsValidation(t *testing.T) {
	sc := parseScenario(t, shortYAML)
	cases := []struct {
		name string
		edit func(*Options)
		want []string // each must appear in the error
	}{
		{"no target", func(o *Options) { o.Target = "" }, []string{"target: missing"}},
		{"target without scheme", func(o *Options) { o.Target = "localhost:8080" }, []string{"target:"}},
		{"target ftp", func(o *Options) { o.Target = "ftp://h/" }, []string{"target:", "http or https"}},
		{"target with query", func(o *Options) { o.Target = "http://h/?x=1" }, []string{"target:", "query"}},
		{"no scenario", func(o *Options) { o.Scenario = nil }, []string{"scenario: missing"}},
		{"negative speed", func(o *Options) { o.Speed = -1 }, []string{"speed:"}},
		{"NaN speed", func(o *Options) { o.Speed = math.NaN() }, []string{"speed:"}},
		{"infinite speed", func(o *Options) { o.Speed = math.Inf(1) }, []string{"speed:"}},
		{"bad header", func(o *Options) { o.SessionHeader = "x session" }, []string{"session_header:"}},
		{"bad run id", func(o *Options) { o.RunID = "a/b" }, []string{"run_id:"}},
		{"api key with newline", func(o *Options) { o.APIKey = "k\nx" }, []string{"api_key:"}},
		{"jitter above 1", func(o *Options) { o.JitterFraction = 1.5 }, []string{"jitter_fraction:"}},
		{"jitter NaN", func(o *Options) { o.JitterFraction = math.NaN() }, []string{"jitter_fraction:"}},
		{"negative max retry wait", func(o *Options) { o.MaxRetryWait = -time.Second }, []string{"max_retry_wait:"}},
		{"negative max sessions", func(o *Options) { o.MaxSessions = -1 }, []string{"max_sessions:"}},
		{"too many sessions", func(o *Options) { o.MaxSessions = 2 }, []string{"max_sessions:", "more than the cap of 2"}},
		{"several at once", func(o *Options) { o.Target, o.Speed = "", -2 }, []string{"target:", "speed:"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Target: "http://127.0.0.1:1", Scenario: sc, Speed: 600}
			tc.edit(&o)
			rep, err := Run(context.Background(), o)
			require.Error(t, err)
			assert.Nil(t, rep)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestOptionsDefaults(t *testing.T) {
	in := Options{Target: "http://h:1/v1/", Scenario: parseScenario(t, shortYAML)}
	require.NoError(t, in.Validate())
	o := in.withDefaults()
	assert.Equal(t, "http://h:1", o.Target, "a trailing /v1 is the API's, not the host's")
	assert.Equal(t, 1.0, o.Speed)
	assert.Equal(t, DefaultSessionHeader, o.SessionHeader)
	assert.Equal(t, DefaultJitterFraction, o.JitterFraction)
	assert.Equal(t, DefaultRetryBudget, o.RetryBudget)
	assert.Equal(t, DefaultMaxRetryWait, o.MaxRetryWait)
	assert.Equal(t, DefaultMaxSessions, o.MaxSessions)
	assert.Equal(t, DefaultModel, o.Model)
	assert.Regexp(t, `^lg[0-9a-f]{8}$`, o.RunID)
	o2 := Options{Target: "http://h:1", Scenario: parseScenario(t, shortYAML)}.withDefaults()
	assert.NotEqual(t, o.RunID, o2.RunID, "runs get distinct session ids")
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"1", time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"0", 0, true},
		{"1.5", 1500 * time.Millisecond, true},
		{now.Add(3 * time.Second).Format(http.TimeFormat), 3 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"", 0, false},
		{"-1", 0, false},
		{"NaN", 0, false},
		{"Inf", 0, false},
		{"1e30", 0, false},
		{"soon", 0, false},
	}
	for _, tc := range cases {
		got, ok := parseRetryAfter(tc.in, now)
		assert.Equal(t, tc.ok, ok, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
}
