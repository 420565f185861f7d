package daemon

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chromium finds headless Chromium: skipped without it, except in CI (which installs Debian's).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not on PATH; .ci/run installs the Debian package")
	}
	t.Skip("chromium is not on PATH (apt-get install chromium)")
	return ""
}

// headless runs Chromium on url with the page's scripts given time to fetch and draw.
func headless(t *testing.T, bin, url string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=5000"}
	out, err := exec.CommandContext(ctx, bin, append(append(base, args...), url)...).Output()
	require.NoError(t, err, "chromium %v", args)
	return out
}

// TestStatusPageInChromium loads the status page of a running daemon in headless Chromium and
// checks that the state, its reasons and the trap's picture render; the screenshot is kept as a
// test artifact (in $BASIN_TEST_ARTIFACTS when set).
func TestStatusPageInChromium(t *testing.T) {
	bin := chromium(t)
	if testing.Short() {
		t.Skip("starts Chromium")
	}
	e := newEnv(t, "")
	d := e.daemon()
	t.Cleanup(func() { _ = d.Close() })
	for range 12 {
		e.step(d)
	}
	// The working set outgrows the knee and the hit rate collapses: trapped, and the budget cut.
	e.dep.workingSet, e.dep.live, e.dep.hit = 2.4*testCapacity, 96, 0.3
	s := e.stepUntil(d, 40, "trapped", func(s Status) bool { return s.Assessment.State == "trapped" && s.Policy.Target == testCut })
	srv := serveAPI(t, d)

	dom := string(headless(t, bin, srv.URL+"/", "--dump-dom"))
	assert.Contains(t, dom, `data-loaded="true"`, "the script fetched the API and drew")
	assert.Regexp(t, `id="state"[^>]*data-state="trapped"[^>]*>trapped<`, dom)
	assert.Contains(t, dom, "<li>"+htmlEscape(s.Assessment.Reasons[0])+"</li>", "the reasons are listed")
	if d := pathData(dom, "curve-line"); assert.NotEmpty(t, d, "the completion curve is drawn") {
		assert.GreaterOrEqual(t, len(regexp.MustCompile(`L`).FindAllString(d, -1)), 2, "the curve has its points")
	}
	assert.Contains(t, dom, `id="arrival-line"`)
	assert.Contains(t, dom, `id="operating-point"`)
	assert.NotEmpty(t, pathData(dom, "wc-line"), "W/C is drawn")
	assert.Regexp(t, `<td>budget</td><td>done</td><td>B [^<]+ → 700K</td>`, dom, "the cut is in the recent actions")

	dir := os.Getenv("BASIN_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	shot := filepath.Join(dir, "status-page.png")
	headless(t, bin, srv.URL+"/", "--window-size=1280,1400", "--screenshot="+shot)
	fi, err := os.Stat(shot)
	require.NoError(t, err)
	assert.Greater(t, fi.Size(), int64(20_000), "a screenshot with something on it")
	t.Logf("status page screenshot: %s", shot)
}

// pathData is the d attribute of the SVG path with the given id ("" without one).
func pathData(dom, id string) string {
	tag := regexp.MustCompile(`<path [^>]*id="` + id + `"[^>]*>`).FindString(dom)
	if m := regexp.MustCompile(`\bd="(M[^"]*)"`).FindStringSubmatch(tag); m != nil {
		return m[1]
	}
	return ""
}

// htmlEscape escapes text as the DOM serialiser does for text nodes.
func htmlEscape(s string) string {
	return regexp.MustCompile(`[&<>]`).ReplaceAllStringFunc(s, func(c string) string {
		return map[string]string{"&": "&amp;", "<": "&lt;", ">": "&gt;"}[c]
	})
}
