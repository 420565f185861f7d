package client_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/client"
)

// termServer records the term header of every call and refuses writes whose term is under floor
// with the contract's 409, its reason put where body says.
type termServer struct {
	mu    sync.Mutex
	seen  map[string]string // method+path → header value
	floor uint64
	body  string
}

func (s *termServer) handler(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	s.mu.Lock()
	s.seen[r.Method+" "+r.URL.Path] = r.Header.Get(client.TermHeader)
	refuse := s.floor > 0 && r.Method != http.MethodGet
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if refuse {
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, s.body)
		return
	}
	_, _ = io.WriteString(w, `{}`)
}

// TestWritesCarryTheTerm: with a term in the context every write carries it in
// Basin-Daemon-Term and reads do not; without one (a daemon without a store) no write does.
func TestWritesCarryTheTerm(t *testing.T) {
	for _, tc := range []struct {
		name string
		term uint64
		want string
	}{{"no term", 0, ""}, {"term 7", 7, "7"}, {"large term", 1 << 40, "1099511627776"}} {
		t.Run(tc.name, func(t *testing.T) {
			s := &termServer{seen: map[string]string{}}
			ts := httptest.NewServer(http.HandlerFunc(s.handler))
			t.Cleanup(ts.Close)
			c, err := client.New(client.Options{BaseURL: ts.URL, Token: testToken})
			require.NoError(t, err)
			ctx := context.Background()
			if tc.term != 0 {
				ctx = client.WithTerm(ctx, tc.term)
			}
			_, err = c.State(ctx)
			require.NoError(t, err)
			_, err = c.SetBudget(ctx, budgetReq(100, 0, "test"))
			require.NoError(t, err)
			_, err = c.Shed(ctx, shedReq([]string{"s1"}, 0, "test"))
			require.NoError(t, err)
			require.NoError(t, c.SetAffinity(ctx, true, "test"))
			want := map[string]string{"GET /admin/state": "", "PUT /admin/budget": tc.want,
				"POST /admin/shed": tc.want, "PUT /admin/affinity": tc.want}
			if _, err := c.ClaimTerm(ctx); tc.term == 0 {
				assert.ErrorContains(t, err, "no term", "a claim needs a term")
			} else {
				require.NoError(t, err)
				want["PUT /admin/daemon-term"] = tc.want
			}
			assert.Equal(t, want, s.seen)
		})
	}
}

// TestStaleTermIsErrStaleTerm: the gateway's 409 naming stale_daemon_term is ErrStaleTerm
// wherever the reason is put; other refusals, a 409 included, are not.
func TestStaleTermIsErrStaleTerm(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		stale      bool
	}{
		{"reason beside the error", `{"error":{"message":"term 3 < 4","type":"invalid_request_error","param":null,"code":null},"reason":"stale_daemon_term"}`, true},
		{"reason inside the error", `{"error":{"message":"term 3 < 4","type":"invalid_request_error","reason":"stale_daemon_term"}}`, true},
		{"reason as the code", `{"error":{"message":"term 3 < 4","type":"invalid_request_error","param":null,"code":"stale_daemon_term"}}`, true},
		{"another conflict", `{"error":{"message":"busy","type":"invalid_request_error","param":null,"code":"conflict"}}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &termServer{seen: map[string]string{}, floor: 4, body: tc.body}
			ts := httptest.NewServer(http.HandlerFunc(s.handler))
			t.Cleanup(ts.Close)
			c, err := client.New(client.Options{BaseURL: ts.URL, Token: testToken})
			require.NoError(t, err)
			_, err = c.SetBudget(client.WithTerm(context.Background(), 3), budgetReq(100, 0, "test"))
			var ae *client.APIError
			require.ErrorAs(t, err, &ae)
			assert.Equal(t, http.StatusConflict, ae.Status)
			assert.Equal(t, tc.stale, errors.Is(err, client.ErrStaleTerm), "reason %q", ae.Reason)
		})
	}
}
