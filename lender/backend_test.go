package lender

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decision is a lending-on decision with two grants, as Decide makes them.
func decision(t *testing.T) Decision {
	t.Helper()
	l := newLender(t, Options{})
	d := l.Decide(Inputs{At: t0, CacheFirst: true, Reason: "risk rule",
		Instances: []Instance{dec("decode-0", 98_000, 0, 0), dec("decode-1", 30_000, 0, 0)}})
	require.True(t, d.Enabled)
	require.Equal(t, []int64{37_000, 75_000}, []int64{d.Grants[0].Tokens, d.Grants[1].Tokens})
	return d
}

type fakeAffinity struct {
	enabled     bool
	reason      string
	hasDeadline bool
	err         error
}

func (f *fakeAffinity) SetAffinity(ctx context.Context, enabled bool, reason string) error {
	_, f.hasDeadline = ctx.Deadline()
	f.enabled, f.reason = enabled, reason
	return f.err
}

func TestNewBackendErrors(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty-token")
	require.NoError(t, os.WriteFile(empty, []byte(" \n"), 0o600))
	setSim := func(bool, float64) {}

	// What the code hands in beside the configuration, by case (none unless named).
	wires := map[string]Wiring{"sim with a timeout": {Sim: setSim}, "affinity with a url": {Affinity: &fakeAffinity{}}}
	tests := []struct {
		name string
		cfg  BackendConfig
		want []string
	}{
		{"no kind", BackendConfig{}, []string{"kind: required, one of sim, affinity, http, exec"}},
		{"unknown kind", BackendConfig{Kind: "grpc"}, []string{`kind: unknown "grpc"`}},
		{"sim without the switch", BackendConfig{Kind: "sim"}, []string{"kind: sim needs the simulator's lending switch"}},
		{"sim with a timeout", BackendConfig{Kind: "sim", Timeout: time.Second}, []string{"timeout: not used by kind sim"}},
		{"affinity without a client", BackendConfig{Kind: "affinity"}, []string{"kind: affinity needs a gateway admin client"}},
		{"affinity with a url", BackendConfig{Kind: "affinity", URL: "http://x"},
			[]string{"url: not used by kind affinity"}},
		{"http without url", BackendConfig{Kind: "http"}, []string{"url: required"}},
		{"http with a relative url", BackendConfig{Kind: "http", URL: "/lending"}, []string{"url: /lending: want an http or https URL"}},
		{"http without host", BackendConfig{Kind: "http", URL: "http:///lending"}, []string{"url: http:///lending: no host"}},
		{"http url password redacted", BackendConfig{Kind: "http", URL: "ftp://u:secret@host/x"},
			[]string{"url: ftp://u:xxxxx@host/x: want an http or https URL"}},
		{"http token file missing", BackendConfig{Kind: "http", URL: "http://127.0.0.1:9/x", TokenFile: filepath.Join(dir, "nope")},
			[]string{"token_file: open "}},
		{"http token file empty", BackendConfig{Kind: "http", URL: "http://127.0.0.1:9/x", TokenFile: empty},
			[]string{"token_file: " + empty + ": empty"}},
		{"http with a command", BackendConfig{Kind: "http", URL: "http://127.0.0.1:9/x", Command: []string{"true"}},
			[]string{"command: not used by kind http"}},
		{"negative timeout", BackendConfig{Kind: "http", URL: "http://127.0.0.1:9/x", Timeout: -time.Second},
			[]string{"timeout: -1s, must not be negative"}},
		{"exec without command", BackendConfig{Kind: "exec"}, []string{"command: required"}},
		{"exec with an empty program", BackendConfig{Kind: "exec", Command: []string{""}}, []string{"command[0]: empty"}},
		{"exec program not found", BackendConfig{Kind: "exec", Command: []string{"basin-no-such-program-xyz"}},
			[]string{"command[0]: ", "basin-no-such-program-xyz"}},
		{"exec with url and token", BackendConfig{Kind: "exec", Command: []string{"sh"}, URL: "http://x", TokenFile: empty},
			[]string{"url: not used by kind exec", "token_file: not used by kind exec"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := NewBackend(tt.cfg, wires[tt.name])
			require.Error(t, err)
			assert.Nil(t, b)
			assert.Contains(t, err.Error(), "lender backend: ")
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.NotContains(t, err.Error(), "secret")
		})
	}
}

func TestNewBackendKinds(t *testing.T) {
	tests := []struct {
		cfg  BackendConfig
		want Backend
		wire Wiring
	}{
		{BackendConfig{Kind: "sim"}, nil, Wiring{Sim: func(bool, float64) {}}},
		{BackendConfig{Kind: "affinity"},
			AffinityBackend{Client: &fakeAffinity{}, Timeout: DefaultHTTPTimeout}, Wiring{Affinity: &fakeAffinity{}}},
		{BackendConfig{Kind: "http", URL: "https://switch.example/lending"},
			&HTTPBackend{URL: "https://switch.example/lending", Timeout: DefaultHTTPTimeout}, Wiring{}},
		{BackendConfig{Kind: "http", URL: "http://127.0.0.1:9/x", Timeout: time.Second},
			&HTTPBackend{URL: "http://127.0.0.1:9/x", Timeout: time.Second}, Wiring{}},
		{BackendConfig{Kind: "exec", Command: []string{"sh", "-c", "true"}},
			&ExecBackend{Command: []string{"sh", "-c", "true"}, Timeout: DefaultExecTimeout}, Wiring{}},
	}
	for _, tt := range tests {
		t.Run(tt.cfg.Kind, func(t *testing.T) {
			b, err := NewBackend(tt.cfg, tt.wire)
			require.NoError(t, err)
			assert.Equal(t, tt.cfg.Kind, b.Name())
			if tt.want != nil {
				assert.Equal(t, tt.want, b)
			}
		})
	}
}

func TestSimBackend(t *testing.T) {
	type call struct {
		enabled  bool
		fraction float64
	}
	var calls []call
	b := SimBackend{Set: func(e bool, f float64) { calls = append(calls, call{e, f}) }}
	d := decision(t)
	require.NoError(t, b.Apply(context.Background(), d))
	d.Enabled = false
	require.NoError(t, b.Apply(context.Background(), d))
	assert.Equal(t, []call{{true, 0.5}, {false, 0.5}}, calls, "the simulator gets the global switch and the max fraction")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, b.Apply(ctx, d), context.Canceled)
	assert.Len(t, calls, 2, "a cancelled apply does not switch")
	assert.ErrorContains(t, SimBackend{}.Apply(context.Background(), d), "sim: no lending switch wired")
}

func TestAffinityBackend(t *testing.T) {
	f := &fakeAffinity{}
	b := AffinityBackend{Client: f}
	d := decision(t)
	require.NoError(t, b.Apply(context.Background(), d))
	assert.True(t, f.enabled)
	assert.True(t, f.hasDeadline, "a hung gateway cannot hold the caller")
	assert.Equal(t, "basin lender: "+d.Reasons[0], f.reason)

	f.err = errors.New("503 Service Unavailable")
	d.Enabled = false
	err := b.Apply(context.Background(), d)
	assert.ErrorIs(t, err, f.err)
	assert.ErrorContains(t, err, "affinity: switch to false: 503")
	assert.False(t, f.enabled)

	assert.ErrorContains(t, AffinityBackend{}.Apply(context.Background(), d), "affinity: no gateway admin client wired")
}

func TestMarshalPayloadNeverNull(t *testing.T) {
	b, err := MarshalPayload(Decision{At: t0})
	require.NoError(t, err)
	assert.JSONEq(t, `{"version":1,"at":"2026-05-01T12:00:00Z","enabled":false,"changed":false,
		"max_fraction":0,"grants":[],"reasons":[]}`, string(b))

	b, err = MarshalPayload(decision(t))
	require.NoError(t, err)
	assert.Contains(t, string(b), "= 37000 < 0.5 × 150000", "reasons are not HTML-escaped")
	assert.NotContains(t, string(b), "\n")
}
