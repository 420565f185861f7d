package scaler

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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// received is what the test server saw of one request.
type received struct {
	method, path, contentType, auth, userAgent string
	body                                       []byte
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
		got = append(got, received{r.Method, r.URL.Path, r.Header.Get("Content-Type"), r.Header.Get("Authorization"),
			r.Header.Get("User-Agent"), b})
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

func TestHTTPBackendPostsTheRequest(t *testing.T) {
	srv, got := server(t, http.StatusAccepted, "")
	tokenFile := writeFile(t, "token", "s3cret-token\n")
	b, err := NewBackend(BackendConfig{Kind: "http", URL: srv.URL + "/scale", TokenFile: tokenFile}, Wiring{})
	require.NoError(t, err)

	require.NoError(t, b.Apply(context.Background(), request()))
	require.Len(t, got(), 1)
	r := got()[0]
	assert.Equal(t, http.MethodPost, r.method)
	assert.Equal(t, "/scale", r.path)
	assert.Equal(t, "application/json", r.contentType)
	assert.Equal(t, "Bearer s3cret-token", r.auth)
	assert.Equal(t, "basin-scaler", r.userAgent)

	// The schema, as a receiver in another language reads it.
	var raw map[string]any
	require.NoError(t, json.Unmarshal(r.body, &raw))
	assert.Equal(t, map[string]any{"version": 1.0, "deployment": "prod", "role": "decode", "replicas": 3.0,
		"reason": request().Reason, "seq": 42.0}, raw)

	// The token is read at each apply: a rotated token is sent without a restart.
	require.NoError(t, os.WriteFile(tokenFile, []byte("rotated"), 0o600))
	require.NoError(t, b.Apply(context.Background(), Request{Deployment: "prod", Role: RolePrefill, Replicas: 0, Seq: 43}))
	require.Len(t, got(), 2)
	assert.Equal(t, "Bearer rotated", got()[1].auth)
	assert.JSONEq(t, `{"version":1,"deployment":"prod","role":"prefill","replicas":0,"reason":"","seq":43}`, string(got()[1].body),
		"zero replicas is sent, not omitted")

	c, ok, err := b.Current(context.Background(), RoleDecode)
	assert.NoError(t, err)
	assert.False(t, ok, "a webhook cannot say what runs")
	assert.Zero(t, c)
	assert.Len(t, got(), 2, "Current sends nothing")
}

func TestHTTPBackendErrors(t *testing.T) {
	tests := []struct {
		name    string
		status  int
		body    string
		r       Request
		want    []string
		notWant []string
		sent    int
	}{
		{"server error with a json body", http.StatusServiceUnavailable, `{"error": "no GPU capacity in us-east-1"}`, request(),
			[]string{`POST scale request: 503 Service Unavailable: {"error": "no GPU capacity in us-east-1"}`}, nil, 1},
		{"long body is cut", http.StatusBadRequest, strings.Repeat("x", 2000), request(),
			[]string{"400 Bad Request: xxx", " …"}, []string{strings.Repeat("x", 600)}, 1},
		{"redirect is not followed", http.StatusFound, "", request(), []string{"302 Found"}, nil, 1},
		{"an invalid request is not sent", http.StatusOK, "", Request{Role: "router", Replicas: -2},
			[]string{`scale request: role: "router"`, "replicas: -2"}, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, got := server(t, tt.status, tt.body)
			b := &HTTPBackend{URL: srv.URL, TokenFile: writeFile(t, "token", "s3cret-token")}
			err := b.Apply(context.Background(), tt.r)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "http "+srv.URL)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
			for _, w := range tt.notWant {
				assert.NotContains(t, err.Error(), w)
			}
			assert.NotContains(t, err.Error(), "s3cret")
			assert.Len(t, got(), tt.sent)
		})
	}
}

func TestHTTPBackendTokenFileGone(t *testing.T) {
	srv, got := server(t, http.StatusOK, "")
	b := &HTTPBackend{URL: srv.URL, TokenFile: filepath.Join(t.TempDir(), "missing")}
	assert.ErrorContains(t, b.Apply(context.Background(), request()), "bearer token: open ")
	assert.Empty(t, got(), "nothing is sent without the configured token")
}
