// Package chromiumtest loads a page in headless Chromium for tests and reads what it drew. The
// status page is drawn by its script from the daemon's API, so only a real browser shows what an
// operator sees; the packages that test the page (statuspage with recorded API answers, daemon
// with a running daemon) share this.
package chromiumtest

import (
	"context"
	"errors"
	"html"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Find returns headless Chromium's path. Without it the test is skipped, except in CI (which
// installs Debian's chromium) and under -short (the browser takes seconds to start).
func Find(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts Chromium")
	}
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

// Run runs Chromium on url with extra arguments (--dump-dom, --screenshot=…) and returns its
// standard output. Virtual time lets the page's fetches finish and its script draw before the
// dump without the test sleeping: 5 s of it unless the arguments give a --virtual-time-budget
// (in milliseconds; a page that refreshes every 5 s needs more to refresh again). The timeout
// only bounds a browser that hangs.
func Run(t testing.TB, bin, url string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--disable-background-networking"}
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--virtual-time-budget=") }) {
		base = append(base, "--virtual-time-budget=5000")
	}
	// A browser killed by a signal (headless Chromium segfaults now and then, more often with
	// several started at once, as make test's two passes do) is started again, twice at most:
	// the page is what the tests check, not the browser. Any other failure fails at once.
	for try := 1; ; try++ {
		profile := "--user-data-dir=" + t.TempDir() // a fresh one: a crashed browser leaves its lock
		out, err := exec.CommandContext(ctx, bin, append(append(append(base, profile), args...), url)...).Output()
		var ee *exec.ExitError
		if err != nil && try < 3 && ctx.Err() == nil && errors.As(err, &ee) && ee.ProcessState != nil && !ee.Exited() {
			t.Logf("chromium %v: %v; starting it again", args, err)
			continue
		}
		require.NoError(t, err, "chromium %v", args)
		return out
	}
}

// DOM is the page as the browser serialised it after the script ran.
func DOM(t testing.TB, bin, url string) string {
	t.Helper()
	return string(Run(t, bin, url, "--dump-dom"))
}

// Tag is the opening tag of the element with the given id, "" when there is none.
func Tag(dom, id string) string {
	return regexp.MustCompile(`<[a-zA-Z][a-zA-Z0-9-]*\s[^>]*\bid="` + regexp.QuoteMeta(id) + `"[^>]*>`).FindString(dom)
}

// Hidden reports whether the element with the given id carries the hidden attribute.
func Hidden(dom, id string) bool {
	return regexp.MustCompile(`\shidden(=""|\s|>|$)`).MatchString(Tag(dom, id))
}

// Attr is an attribute of the element with the given id ("" when absent).
func Attr(dom, id, name string) string {
	m := regexp.MustCompile(`\s` + regexp.QuoteMeta(name) + `="([^"]*)"`).FindStringSubmatch(Tag(dom, id))
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// Text is the text of the element with the given id and its descendants, entities decoded and
// runs of white space folded to one space, as a reader sees it; ok is false without the element.
func Text(dom, id string) (text string, ok bool) {
	inner, ok := Inner(dom, id)
	if !ok {
		return "", false
	}
	return TextOf(inner), true
}

// TextOf is the text of a fragment of markup, as Text.
func TextOf(fragment string) string {
	s := regexp.MustCompile(`<[^>]*>`).ReplaceAllString(fragment, "")
	return strings.Join(strings.Fields(html.UnescapeString(s)), " ")
}

// Inner is the markup inside the element with the given id. The serialiser writes well-formed
// markup, so counting the opening and closing tags of the element's name finds its end.
func Inner(dom, id string) (string, bool) {
	tag := Tag(dom, id)
	if tag == "" {
		return "", false
	}
	name := regexp.MustCompile(`^<([a-zA-Z][a-zA-Z0-9-]*)`).FindStringSubmatch(tag)[1]
	start := strings.Index(dom, tag) + len(tag)
	open := regexp.MustCompile(`(?i)<` + name + `[\s>]|</` + name + `>`)
	depth := 1
	for _, loc := range open.FindAllStringIndex(dom[start:], -1) {
		if strings.HasPrefix(dom[start+loc[0]:], "</") {
			depth--
			if depth == 0 {
				return dom[start : start+loc[0]], true
			}
		} else {
			depth++
		}
	}
	return "", false
}

// Rows is the text of each cell of each row of the table body with the given id.
func Rows(dom, id string) [][]string {
	inner, ok := Inner(dom, id)
	if !ok {
		return nil
	}
	var rows [][]string
	for _, tr := range regexp.MustCompile(`(?s)<tr[^>]*>(.*?)</tr>`).FindAllStringSubmatch(inner, -1) {
		var cells []string
		for _, td := range regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`).FindAllStringSubmatch(tr[1], -1) {
			cells = append(cells, TextOf(td[1]))
		}
		if cells != nil {
			rows = append(rows, cells)
		}
	}
	return rows
}
