package hook

import (
	"context"
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
	method, contentType, auth, userAgent string
	body                                 string
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
		got = append(got, received{r.Method, r.Header.Get("Content-Type"), r.Header.Get("Authorization"),
			r.Header.Get("User-Agent"), string(b)})
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

func tokenFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func TestPostSendsAndRereadsTheToken(t *testing.T) {
	srv, got := server(t, http.StatusNoContent, "")
	tok := tokenFile(t, "s3cret-token\n")
	p := Post{URL: srv.URL + "/x", TokenFile: tok, UserAgent: "basin-test", What: "thing", Timeout: time.Second}
	require.NoError(t, p.Do(context.Background(), []byte(`{"a":1}`)))

	require.NoError(t, os.WriteFile(tok, []byte("rotated"), 0o600))
	require.NoError(t, p.Do(context.Background(), []byte(`{"a":2}`)))

	assert.Equal(t, []received{
		{http.MethodPost, "application/json", "Bearer s3cret-token", "basin-test", `{"a":1}`},
		{http.MethodPost, "application/json", "Bearer rotated", "basin-test", `{"a":2}`},
	}, got(), "a rotated token is sent without a restart")
}

func TestPostWithoutToken(t *testing.T) {
	srv, got := server(t, http.StatusOK, "ok")
	require.NoError(t, Post{URL: srv.URL, What: "thing"}.Do(context.Background(), nil))
	require.Len(t, got(), 1)
	assert.Empty(t, got()[0].auth)
}

func TestPostErrors(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"server error with a body", http.StatusServiceUnavailable, `{"error": "busy"}`,
			`POST thing: 503 Service Unavailable: {"error": "busy"}`},
		{"empty body", http.StatusForbidden, "", "POST thing: 403 Forbidden"},
		{"redirect is not followed", http.StatusFound, "", "POST thing: 302 Found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, got := server(t, tt.status, tt.body)
			u := strings.Replace(srv.URL, "http://", "http://user:pw-secret@", 1)
			err := Post{URL: u, TokenFile: tokenFile(t, "s3cret-token"), What: "thing"}.Do(context.Background(), nil)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "http http://user:xxxxx@"+strings.TrimPrefix(srv.URL, "http://"))
			assert.True(t, strings.HasSuffix(err.Error(), tt.want), err.Error())
			assert.NotContains(t, err.Error(), "s3cret")
			assert.NotContains(t, err.Error(), "pw-secret")
			assert.Len(t, got(), 1, "one POST, no redirect followed")
		})
	}
}

func TestPostTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })
	err := Post{URL: srv.URL, Timeout: 50 * time.Millisecond, What: "thing"}.Do(context.Background(), nil)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestPostTokenFileGone(t *testing.T) {
	srv, got := server(t, http.StatusOK, "")
	err := Post{URL: srv.URL, TokenFile: filepath.Join(t.TempDir(), "missing")}.Do(context.Background(), nil)
	assert.ErrorContains(t, err, "bearer token: open ")
	assert.Empty(t, got(), "nothing is sent without the configured token")
}

func TestSetBearer(t *testing.T) {
	h := http.Header{}
	require.NoError(t, SetBearer(h, ""))
	assert.Empty(t, h.Get("Authorization"), "no file, no header")

	require.NoError(t, SetBearer(h, tokenFile(t, " tok-1 \n")))
	assert.Equal(t, "Bearer tok-1", h.Get("Authorization"))

	err := SetBearer(http.Header{}, tokenFile(t, "a\nb"))
	assert.ErrorContains(t, err, "bearer token: ")
	assert.ErrorContains(t, err, "more than one line")
	assert.NotContains(t, err.Error(), "a\nb")
}
