package lender

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// received is what the test server saw of one request.
type received struct {
	method, contentType, auth string
	body                      []byte
}

// server answers every request with status and body; the returned func lists what it got.
func server(t *testing.T, status int, body string) (*httptest.Server, func() []received) {
	t.Helper()
	var mu sync.Mutex
	var got []received
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		assert.NoError(t, err)
		mu.Lock()
		got = append(got, received{r.Method, r.Header.Get("Content-Type"), r.Header.Get("Authorization"), b})
		mu.Unlock()
		if status == http.StatusFound {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []received {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

func TestHTTPBackendPostsThePayload(t *testing.T) {
	srv, got := server(t, http.StatusNoContent, "")
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret-token\n"), 0o600))
	b, err := NewBackend(BackendConfig{Kind: "http", URL: srv.URL + "/lending", TokenFile: tokenFile}, Wiring{})
	require.NoError(t, err)

	d := decision(t)
	require.NoError(t, b.Apply(context.Background(), d))
	require.Len(t, got(), 1)
	r := got()[0]
	assert.Equal(t, http.MethodPost, r.method)
	assert.Equal(t, "application/json", r.contentType)
	assert.Equal(t, "Bearer s3cret-token", r.auth)

	var p Payload
	require.NoError(t, json.Unmarshal(r.body, &p))
	assert.Equal(t, PayloadVersion, p.Version)
	assert.True(t, p.Enabled)
	assert.True(t, p.Changed)
	assert.Equal(t, 0.5, p.MaxFraction)
	assert.Equal(t, d.Grants, p.Grants)
	assert.Equal(t, d.Reasons, p.Reasons)
	assert.True(t, d.At.Equal(p.At))

	// The schema's field names, as a receiver in another language reads them.
	var raw map[string]any
	require.NoError(t, json.Unmarshal(r.body, &raw))
	for _, k := range []string{"version", "at", "enabled", "changed", "since", "max_fraction", "grants", "reasons"} {
		assert.Contains(t, raw, k)
	}
	assert.Equal(t, map[string]any{"instance": "decode-0", "tokens": 37000.0, "reason": d.Grants[0].Reason},
		raw["grants"].([]any)[0])

	// The token is read at each apply: a rotated token is sent without a restart.
	require.NoError(t, os.WriteFile(tokenFile, []byte("rotated"), 0o600))
	require.NoError(t, b.Apply(context.Background(), d))
	assert.Equal(t, "Bearer rotated", got()[1].auth)
}

func TestHTTPBackendWithoutToken(t *testing.T) {
	srv, got := server(t, http.StatusOK, "ok")
	b := &HTTPBackend{URL: srv.URL}
	require.NoError(t, b.Apply(context.Background(), decision(t)))
	require.Len(t, got(), 1)
	assert.Empty(t, got()[0].auth)
}

func TestHTTPBackendErrors(t *testing.T) {
	long := `{"error":"switch refused: ` + strings.Repeat("x", 2000) + `"}`
	tests := []struct {
		name    string
		status  int
		body    string
		want    []string
		notWant []string
	}{
		{"server error with a json body", http.StatusServiceUnavailable, `{"error": "blue/green switch in progress"}`,
			[]string{"POST decision: 503 Service Unavailable: {\"error\": \"blue/green switch in progress\"}"}, nil},
		{"long body is cut", http.StatusBadRequest, long,
			[]string{"400 Bad Request: {\"error\":\"switch refused: xxx", " …"}, []string{strings.Repeat("x", 600)}},
		{"html page folded onto one line", http.StatusBadGateway, "<html>\n<body>bad gateway</body>\n</html>\n",
			[]string{"502 Bad Gateway: <html> <body>bad gateway</body> </html>"}, nil},
		{"empty body", http.StatusForbidden, "", []string{"403 Forbidden"}, []string{"Forbidden:"}},
		{"redirect is not followed", http.StatusFound, "", []string{"302 Found"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, got := server(t, tt.status, tt.body)
			tokenFile := filepath.Join(t.TempDir(), "token")
			require.NoError(t, os.WriteFile(tokenFile, []byte("s3cret-token"), 0o600))
			b := &HTTPBackend{URL: srv.URL, TokenFile: tokenFile}
			err := b.Apply(context.Background(), decision(t))
			require.Error(t, err)
			assert.Contains(t, err.Error(), "http "+srv.URL)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			for _, w := range tt.notWant {
				assert.NotContains(t, err.Error(), w)
			}
			assert.NotContains(t, err.Error(), "s3cret")
			assert.Len(t, got(), 1, "one POST, no redirect followed")
		})
	}
}

func TestHTTPBackendTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	b := &HTTPBackend{URL: srv.URL, Timeout: 50 * time.Millisecond}
	err := b.Apply(context.Background(), decision(t))
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestHTTPBackendTokenFileGone(t *testing.T) {
	srv, got := server(t, http.StatusOK, "")
	b := &HTTPBackend{URL: srv.URL, TokenFile: filepath.Join(t.TempDir(), "missing")}
	err := b.Apply(context.Background(), decision(t))
	assert.ErrorContains(t, err, "bearer token: open ")
	assert.Empty(t, got(), "nothing is sent without the configured token")
}

func TestHTTPBackendRedactsURLPassword(t *testing.T) {
	srv, _ := server(t, http.StatusTeapot, "")
	u := strings.Replace(srv.URL, "http://", "http://user:pw-secret@", 1)
	err := (&HTTPBackend{URL: u}).Apply(context.Background(), decision(t))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "418")
	assert.NotContains(t, err.Error(), "pw-secret")
}
