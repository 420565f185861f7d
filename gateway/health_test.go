package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/test/testclock"
)

func TestSessionIDsOverTheLimitAre400(t *testing.T) {
	up := newFakeUpstream(t, okJSON(100, 10))
	h := start(t, baseConfig(t, []string{up.URL}, nil), nil)
	long := strings.Repeat("a", MaxSessionIDBytes+1)
	atLimit := strings.Repeat("b", MaxSessionIDBytes)
	bodyWith := func(field string) string {
		return `{"model":"m","messages":[{"role":"user","content":"hi"}],` + field + `}`
	}
	for _, tc := range []struct {
		name      string
		header    map[string]string
		body      string
		wantParam string // "" when the call passes
	}{
		{"a header", map[string]string{"x-session-id": long}, chatBody(3), "x-session-id"},
		{"another session header", map[string]string{"x-claude-code-session-id": long}, chatBody(3), "x-claude-code-session-id"},
		{"metadata.session_id", nil, bodyWith(`"metadata":{"session_id":"` + long + `"}`), "metadata.session_id"},
		{"user", nil, bodyWith(`"user":"` + long + `"`), "user"},
		{"at the limit passes", map[string]string{"x-session-id": atLimit}, chatBody(3), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{"Content-Type": "application/json"}
			for k, v := range tc.header {
				hdr[k] = v
			}
			r, err := h.do(context.Background(), http.MethodPost, "/v1/chat/completions", hdr, tc.body)
			require.NoError(t, err)
			if tc.wantParam == "" {
				decodeCompletion(t, r)
				return
			}
			require.Equal(t, http.StatusBadRequest, r.status, "%s", r)
			e := errorOf(t, r)
			require.NotNil(t, e.Param)
			assert.Equal(t, tc.wantParam, *e.Param)
			assert.Contains(t, e.Message, fmt.Sprintf("%d bytes, longer than the %d allowed", MaxSessionIDBytes+1, MaxSessionIDBytes))
			assert.Equal(t, reasonBadRequest, r.header.Get(ReasonHeader))
		})
	}
	r, err := h.do(context.Background(), http.MethodPost, "/v1/sessions/"+long+"/end", nil, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, r.status, "%s", r)
	assert.Equal(t, "id", *errorOf(t, r).Param)
	assert.Equal(t, 1, h.state().Live, "only the id at the limit was admitted")
}

func TestFailedAdminAuthIsLoggedRateLimited(t *testing.T) {
	clock := testclock.New(time.Date(2026, 6, 1, 8, 0, 0, 0, time.UTC))
	h := start(t, baseConfig(t, []string{"http://127.0.0.1:1"}, nil), clock.Now)
	lines := func() []string {
		var out []string
		for _, l := range strings.Split(h.log.String(), "\n") {
			if strings.Contains(l, "refused a request without the admin token") {
				out = append(out, l)
			}
		}
		return out
	}
	r := h.adminDo(http.MethodGet, "/admin/state", "not-the-token-0123", "")
	require.Equal(t, http.StatusUnauthorized, r.status)
	require.Len(t, lines(), 1)
	assert.Contains(t, lines()[0], "remote=127.0.0.1:")
	assert.Contains(t, lines()[0], "why=\"wrong token\"")
	assert.Contains(t, lines()[0], "path=/admin/state")

	for range 5 { // a flood within the interval: counted, not logged
		h.adminDo(http.MethodPut, "/admin/budget", "", `{"tokens":1,"reason":"x"}`)
	}
	assert.Len(t, lines(), 1)
	clock.Advance(logEvery)
	h.adminDo(http.MethodPut, "/admin/budget", "", `{"tokens":1,"reason":"x"}`)
	require.Len(t, lines(), 2)
	assert.Contains(t, lines()[1], "more_since_last_logged=5")
	assert.Contains(t, lines()[1], `why="no bearer token"`)
	assert.NotContains(t, h.log.String(), "not-the-token-0123", "a wrong token is never logged")
	assert.NotContains(t, h.log.String(), testToken)
	got, _ := gather(t, h)
	assert.Equal(t, 7.0, got["basin_gateway_admin_auth_failures_total"])
}

func TestHealthzIsUpReadyzCanReachAnUpstream(t *testing.T) {
	clock := testclock.New(time.Date(2026, 6, 1, 8, 0, 0, 0, time.UTC))
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		http.NotFound(w, r) // a router without /health is still reachable
	})
	h := start(t, baseConfig(t, []string{up.URL, "http://127.0.0.1:1"}, nil), clock.Now)
	get := func(path string) response { return h.adminDo(http.MethodGet, path, "", "") }

	r := get("/readyz")
	assert.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.Contains(t, string(r.body), "1 of 2 upstreams reachable")
	assert.Contains(t, string(r.body), "127.0.0.1:1", "the unreachable one is named")
	seen := len(up.seen())
	get("/readyz")
	assert.Len(t, up.seen(), seen, "a recent probe is reused")

	up.Close()
	assert.Equal(t, http.StatusOK, get("/readyz").status, "within the cache")
	clock.Advance(readyCacheFor)
	r = get("/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s", r)
	assert.Contains(t, string(r.body), "0 of 2 upstreams reachable")
	assert.Equal(t, http.StatusOK, get("/healthz").status, "the process is still up")

	require.NoError(t, h.stop())
	r = get("/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Contains(t, string(r.body), "shutting down")
}

func TestReadyzCountsA5xxAsUnreachable(t *testing.T) {
	up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no workers", http.StatusServiceUnavailable)
	})
	h := start(t, baseConfig(t, []string{up.URL}, nil), nil)
	r := h.adminDo(http.MethodGet, "/readyz", "", "")
	assert.Equal(t, http.StatusServiceUnavailable, r.status)
	assert.Contains(t, string(r.body), "GET /health answered 503")
	assert.Equal(t, "/health", up.seenPaths()[0])
}

func TestSessionEndReachesTheUpstream(t *testing.T) {
	for _, tc := range []struct {
		name      string
		answer    int
		want      UpstreamEnd
		wantInMsg string
	}{
		{"the upstream ends it too", http.StatusOK, UpstreamEnd{Ended: true, Status: 200}, ""},
		{"an upstream without the endpoint", http.StatusNotFound, UpstreamEnd{Status: 404}, "ended at the gateway only"},
		{"an upstream error", http.StatusInternalServerError, UpstreamEnd{Status: 500}, "answered 500"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newFakeUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/chat/completions" {
					okJSON(100, 10)(w, r)
					return
				}
				w.WriteHeader(tc.answer)
				_, _ = w.Write([]byte(`{"ended":true}`))
			})
			h := start(t, baseConfig(t, []string{up.URL}, func(c *Config) { c.Affinity.Enabled = true }), nil)
			decodeCompletion(t, h.chat("s/1", 5, nil))
			r, err := h.do(context.Background(), http.MethodPost, "/v1/sessions/s%2F1/end",
				map[string]string{"Authorization": "Bearer sk-upstream-key"}, "")
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, r.status, "%s", r)
			var ans EndAnswer
			require.NoError(t, json.Unmarshal(r.body, &ans))
			assert.True(t, ans.Ended)
			assert.Equal(t, tc.want.Ended, ans.Upstream.Ended)
			assert.Equal(t, tc.want.Status, ans.Upstream.Status)
			if tc.wantInMsg != "" {
				assert.Contains(t, ans.Upstream.Message, tc.wantInMsg)
			}
			assert.False(t, h.g.core.Live("s/1"), "ended at the gateway whatever the upstream said")

			paths := up.seenPaths()
			require.Len(t, paths, 2)
			assert.Equal(t, "/v1/sessions/s%2F1/end", paths[1])
			hdr := up.seen()[1]
			assert.Equal(t, "Bearer sk-upstream-key", hdr.Get("Authorization"), "the client's API key goes along")
			assert.Equal(t, "s/1", hdr.Get(DefaultAffinityHeader), "to the decode worker holding the session")
		})
	}
	t.Run("an unreachable upstream", func(t *testing.T) {
		up := newFakeUpstream(t, okJSON(100, 10))
		h := start(t, baseConfig(t, []string{up.URL}, nil), nil)
		decodeCompletion(t, h.chat("s", 5, nil))
		up.Close()
		r, err := h.do(context.Background(), http.MethodPost, "/v1/sessions/s/end", nil, "")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, r.status, "%s", r)
		var ans EndAnswer
		require.NoError(t, json.Unmarshal(r.body, &ans))
		assert.True(t, ans.Ended)
		assert.False(t, ans.Upstream.Ended)
		assert.Zero(t, ans.Upstream.Status)
		assert.Contains(t, ans.Upstream.Message, "could not be reached")
	})
}
