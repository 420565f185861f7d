package statuspage

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestServes(t *testing.T) {
	srv := httptest.NewServer(Handler())
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		path, wantType, wantBody string
		wantCode                 int
	}{
		{"/", "text/html", `<div id="state"`, 200},
		{"/static/app.js", "javascript", "/api/v1/status", 200},
		{"/static/style.css", "text/css", ".state", 200},
		{"/static/nope.js", "", "", 404},
	} {
		t.Run(tc.path, func(t *testing.T) {
			resp, err := http.Get(srv.URL + tc.path)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			require.Equal(t, tc.wantCode, resp.StatusCode)
			if tc.wantCode == 200 {
				assert.Contains(t, resp.Header.Get("Content-Type"), tc.wantType)
				assert.Contains(t, string(b), tc.wantBody)
			}
		})
	}
	resp, err := http.Get(srv.URL + "/")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'self'")
}

// TestNoExternalResources: the page must work with no network beyond the daemon (no CDN).
func TestNoExternalResources(t *testing.T) {
	url := regexp.MustCompile(`https?://[^\s"'<>)]+`)
	err := fs.WalkDir(assets, "assets", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := assets.ReadFile(path)
		require.NoError(t, err)
		for _, u := range url.FindAllString(string(b), -1) {
			if strings.HasPrefix(u, "http://www.w3.org/2000/svg") {
				continue // the SVG namespace name, not a fetch
			}
			t.Errorf("%s refers to %s", path, u)
		}
		return nil
	})
	require.NoError(t, err)
}
