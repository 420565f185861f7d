package alerts

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want []string // each error names its field first; none when empty
	}{
		{"token", Options{Token: "t"}, nil},
		{"basic", Options{BasicUser: "u", BasicPassword: "p"}, nil},
		{"no credentials", Options{}, []string{"Token: required"}},
		{"user without password", Options{BasicUser: "u"}, []string{"BasicPassword: required"}},
		{"password without user", Options{BasicPassword: "p"}, []string{"BasicUser: required"}},
		{"colon in user", Options{BasicUser: "a:b", BasicPassword: "p"}, []string{"BasicUser: must not contain ':'"}},
		{"padded token", Options{Token: "t "}, []string{"Token: has leading or trailing white space"}},
		{"negative MaxBody", Options{Token: "t", MaxBody: -1}, []string{"MaxBody: must be > 0"}},
		{"negative MaxAge", Options{Token: "t", MaxAge: -time.Second}, []string{"MaxAge: must be > 0"}},
		{"empty matcher", Options{Token: "t", Matchers: []Matcher{{AlertName: "BasinTrapped"}, {}}}, []string{"Matchers[1]: empty"}},
		{"empty label name", Options{Token: "t", Matchers: []Matcher{{Labels: map[string]string{"": "x"}}}}, []string{"Matchers[0].Labels: empty label name"}},
		{"several at once", Options{MaxBody: -1}, []string{"Token: required", "MaxBody: must be > 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.opts.Validate()
			if len(tt.want) == 0 {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			_, err = New(tt.opts)
			assert.ErrorContains(t, err, tt.want[0], "New refuses what Validate refuses")
		})
	}
}

func TestDefaults(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, err := New(Options{Token: "t", Registerer: reg})
	require.NoError(t, err)
	assert.Equal(t, int64(DefaultMaxBody), r.opts.MaxBody)
	assert.Equal(t, DefaultMaxAge, r.opts.MaxAge)
	assert.Equal(t, DefaultMatchers(), r.opts.Matchers)
	_, err = New(Options{Token: "t", Registerer: reg})
	assert.ErrorContains(t, err, "register metrics", "two receivers on one registry collide")
}

func TestMatchersAreCopied(t *testing.T) {
	labels := map[string]string{"severity": "critical"}
	h := newHarness(t, Options{Matchers: []Matcher{{AlertName: "BasinTrapped", Labels: labels}}})
	labels["severity"] = "info" // the caller's map changes after New
	rep := okReply(t, h.post(t, payload(t, alert("BasinTrapped", t0, "severity", "critical"))))
	assert.True(t, rep.Incident)
}
