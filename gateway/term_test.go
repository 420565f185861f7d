package gateway

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDaemonTermFencesAdminWrites: an admin write carrying a lower Basin-Daemon-Term than one
// already accepted comes from a deposed daemon and is refused 409, changing nothing; a write
// without the header (an operator) passes; the term survives a restart through the state file.
func TestDaemonTermFencesAdminWrites(t *testing.T) {
	stateFile := filepath.Join(t.TempDir(), "state.json")
	cfg := baseConfig(t, []string{"http://127.0.0.1:1"}, func(c *Config) { c.StateFile = stateFile })
	h := start(t, cfg, nil)
	write := func(path, term, body string) response {
		req, err := http.NewRequest(http.MethodPut, h.admin.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+testToken)
		if term != "" {
			req.Header.Set(DaemonTermHeader, term)
		}
		resp, err := h.admin.Client().Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return response{status: resp.StatusCode, body: b}
	}
	put := func(term, tokens string) response {
		return write("/admin/budget", term, `{"tokens":`+tokens+`,"reason":"test"}`)
	}
	require.Equal(t, http.StatusOK, put("4", "5000").status)
	assert.Equal(t, uint64(4), h.state().DaemonTerm)
	r := put("3", "7000")
	assert.Equal(t, http.StatusConflict, r.status)
	assert.Contains(t, string(r.body), "stale_daemon_term")
	assert.Contains(t, string(r.body), "stale daemon term 3")
	assert.Equal(t, int64(5000), h.state().Budget, "the deposed daemon's write changed nothing")
	assert.Equal(t, http.StatusOK, put("", "6000").status, "an operator's write has no term")
	assert.Equal(t, http.StatusOK, put("4", "6500").status, "the same term")
	assert.Equal(t, http.StatusBadRequest, put("four", "1").status)

	// A daemon taking over claims its term before any action: the deposed one is refused at
	// once. The claim changes nothing else, and needs a term.
	claim := func(term string) response { return write("/admin/daemon-term", term, "") }
	r = claim("5")
	require.Equal(t, http.StatusOK, r.status, "%s", r)
	assert.JSONEq(t, `{"daemon_term":5}`, string(r.body))
	assert.Equal(t, http.StatusConflict, put("4", "6600").status, "the predecessor is refused before the successor's first action")
	assert.Equal(t, int64(6500), h.state().Budget)
	assert.Equal(t, http.StatusConflict, claim("4").status, "a stale claim")
	assert.Equal(t, http.StatusBadRequest, claim("").status, "a claim without a term")
	assert.Equal(t, uint64(5), h.state().DaemonTerm)
	require.NoError(t, h.stop())

	h2 := start(t, cfg, nil)
	assert.Equal(t, uint64(5), h2.state().DaemonTerm, "kept across a restart")
	req, err := http.NewRequest(http.MethodPost, h2.admin.URL+"/admin/shed", strings.NewReader(`{"count":1,"reason":"x"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set(DaemonTermHeader, "2")
	resp, err := h2.admin.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusConflict, resp.StatusCode, "every admin write is fenced, not only the budget")
}
