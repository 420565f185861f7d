package daemon

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/test/chromiumtest"
)

// TestStatusPageInChromium loads the status page of a running daemon in headless Chromium and
// checks that the state, its reasons and the trap's picture render; the screenshot is kept as a
// test artifact (in $BASIN_TEST_ARTIFACTS when set).
func TestStatusPageInChromium(t *testing.T) {
	bin := chromiumtest.Find(t)
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

	dom := chromiumtest.DOM(t, bin, srv.URL+"/")
	assert.Contains(t, dom, `data-loaded="true"`, "the script fetched the API and drew")
	assert.Regexp(t, `id="state"[^>]*data-state="trapped"[^>]*>trapped<`, dom)
	assert.True(t, chromiumtest.Hidden(dom, "dry-run"), "an acting daemon shows no dry-run banner")
	assert.True(t, chromiumtest.Hidden(dom, "blind"), "a daemon that sees every signal is not blind")
	assert.Contains(t, dom, "<li>"+htmlEscape(s.Assessment.Reasons[0])+"</li>", "the reasons are listed")
	if d := pathData(dom, "curve-line"); assert.NotEmpty(t, d, "the completion curve is drawn") {
		assert.GreaterOrEqual(t, len(regexp.MustCompile(`L`).FindAllString(d, -1)), 2, "the curve has its points")
	}
	assert.Contains(t, dom, `id="arrival-line"`)
	assert.Contains(t, dom, `id="operating-point"`)
	assert.NotEmpty(t, pathData(dom, "wc-line"), "W/C is drawn")
	assert.Regexp(t, `<td>budget</td><td>done</td><td>B [^<]+ → 700K</td>`, dom, "the cut is in the recent actions")

	shot := screenshot(t, bin, srv.URL+"/", "status-page.png")
	fi, err := os.Stat(shot)
	require.NoError(t, err)
	assert.Greater(t, fi.Size(), int64(20_000), "a screenshot with something on it")
	t.Logf("status page screenshot: %s", shot)
}

// TestStatusPageDryRunBlind: a dry-run daemon in front of a gateway whose budget is the
// documented out-of-reach one decides a cut it does not make, then loses every signal. The page
// says dry run, shows the decision as not done and the budget as ∞ rather than a million M, and
// reads "blind", holding the state it last saw, instead of that state's colour.
func TestStatusPageDryRunBlind(t *testing.T) {
	bin := chromiumtest.Find(t)
	e := newEnv(t, "dry_run: true\n")
	e.gw = newFakeGateway(1_000_000_000_000)
	d := e.daemon()
	t.Cleanup(func() { _ = d.Close() })
	for range 12 {
		e.step(d)
	}
	e.dep.workingSet, e.dep.live, e.dep.hit = 2.4*testCapacity, 96, 0.3
	e.stepUntil(d, 40, "trapped", func(s Status) bool { return s.Assessment.State == "trapped" && s.Policy.Target == testCut })
	srv := serveAPI(t, d)

	dom := chromiumtest.DOM(t, bin, srv.URL+"/")
	require.False(t, chromiumtest.Hidden(dom, "dry-run"), "the dry-run banner shows")
	text, _ := chromiumtest.Text(dom, "dry-run")
	assert.Contains(t, text, "dry run: basin decides but does not act")
	text, _ = chromiumtest.Text(dom, "budget-note")
	assert.Contains(t, text, "B ∞ (count only)", "the gateway's out-of-reach budget")
	assert.Contains(t, text, "dry run: basin would hold B at 700K, not applied")
	text, _ = chromiumtest.Text(dom, "budget-chart")
	assert.Equal(t, "no budget to draw: ∞ (count only)", text, "not an axis up to 1050000.0M")
	var cut, takeover []string
	for _, r := range chromiumtest.Rows(dom, "actions") {
		switch {
		case r[1] == "budget" && strings.HasSuffix(r[3], "→ 700K"):
			cut = r
		case r[1] == "budget" && strings.HasPrefix(r[3], "B ∞ (count only) → "):
			takeover = r
		}
	}
	require.NotNil(t, cut, "the decided cut is listed: %q", chromiumtest.Rows(dom, "actions"))
	require.NotNil(t, takeover, "the decision to leave the count-only budget is listed: %q", chromiumtest.Rows(dom, "actions"))
	assert.Regexp(t, `^B ∞ \(count only\) → \d{1,3}(\.\d{1,2})?[KM]$`, takeover[3])
	assert.Equal(t, "dry run: not done", cut[2])
	assert.Contains(t, cut[4], "incident: cut B", "the cut's own reason")

	// Every target and the gateway go silent: the detector holds trapped, blind.
	e.gw.set(func(g *fakeGateway) { g.stateErr = errUnreachable })
	var s Status
	for range 40 {
		e.clock.Advance(e.wall(stepEvery))
		d.Step(context.Background())
		if s = d.StatusNow(); len(s.Assessment.Blind) > 0 {
			break
		}
	}
	require.NotEmpty(t, s.Assessment.Blind, "the daemon noticed it sees nothing")
	require.Equal(t, "trapped", string(s.Assessment.State), "and holds the state it last saw")

	dom = chromiumtest.DOM(t, bin, srv.URL+"/")
	assert.Equal(t, "blind", chromiumtest.Attr(dom, "state", "data-state"))
	text, _ = chromiumtest.Text(dom, "state")
	assert.Equal(t, "blind", text)
	require.False(t, chromiumtest.Hidden(dom, "blind"))
	text, _ = chromiumtest.Text(dom, "blind")
	assert.Regexp(t, `^cannot see: stale: [a-z_]+(, [a-z_]+)*`, text)
	for _, b := range s.Assessment.Blind {
		assert.Contains(t, text, strings.Fields(b)[0], "every unseen signal is named")
	}
	assert.Contains(t, text, "gateway admin API: "+errUnreachable.Error())
	assert.Contains(t, text, "holding trapped since "+s.Assessment.Since.UTC().Format("2006-01-02 15:04:05")+" UTC")
	assert.False(t, chromiumtest.Hidden(dom, "dry-run"), "still a dry run")

	t.Logf("dry run + blind screenshot: %s", screenshot(t, bin, srv.URL+"/", "status-page-dry-run-blind.png"))
}

// TestStatusPageActionReasons: one plan tightens the budget and switches lending on; each row
// shows its own reason, not the lender's per-instance measurements that close the plan's list.
func TestStatusPageActionReasons(t *testing.T) {
	bin := chromiumtest.Find(t)
	e := newEnv(t, "lending:\n  backend: {kind: affinity}\n")
	d := e.daemon()
	t.Cleanup(func() { _ = d.Close() })
	// The lender classifies the deployment with the risk rule, which needs the sessions in a call.
	step := func() {
		e.dep.advance(stepEvery)
		now := e.clock.Advance(e.wall(stepEvery))
		e.dep.feed(t, d, now)
		body := e.dep.gateway() + "# TYPE basin_gateway_sessions_in_call gauge\nbasin_gateway_sessions_in_call 20\n"
		require.NoError(t, d.col.IngestText(now, testTargets[2], strings.NewReader(body)))
		d.Step(context.Background())
	}
	for range 12 {
		step()
	}
	e.dep.workingSet, e.dep.live, e.dep.hit = 2.4*testCapacity, 96, 0.3
	var both bool
	for i := 0; i < 40 && !both; i++ {
		step()
		tightened, lent := map[uint64]bool{}, map[uint64]bool{}
		for _, r := range d.audit.Records(100) {
			switch {
			case r.Phase != "done":
			case r.Kind == "budget" && len(r.Reasons) > 0 && strings.Contains(r.Reasons[len(r.Reasons)-1], "tighten B"):
				tightened[r.Seq] = true
			case r.Kind == "lending":
				lent[r.Seq] = true
			}
		}
		for seq := range tightened {
			both = both || lent[seq]
		}
	}
	require.True(t, both, "a plan tightened the budget and switched lending together")
	srv := serveAPI(t, d)

	dom := chromiumtest.DOM(t, bin, srv.URL+"/")
	var budget, lending []string
	for _, r := range chromiumtest.Rows(dom, "actions") {
		switch {
		case r[1] == "budget" && strings.Contains(r[3], "→ 950K"):
			budget = r
		case r[1] == "lending":
			lending = r
		}
	}
	require.NotNil(t, budget, "the tightening is listed")
	require.NotNil(t, lending, "the switch is listed")
	assert.Regexp(t, `^hit rate 0\.\d\d left its plateau 0\.95 \(− 0\.05\): tighten B 1\.00M → 950K$`, budget[4])
	assert.Equal(t, "lending on: decode-0 400K", lending[3])
	assert.Regexp(t, `^lending on: cache-first`, lending[4])
	for _, r := range [][]string{budget, lending} {
		assert.NotContains(t, r[4], "decode-0: reserved", "the lender's measurements are not the %s row's reason", r[1])
	}
}

// TestStatusPageStandby: two daemons on one store. The standby has never held the lease, so its
// status leaves the term out (a term of 0 would read as one); its page says standby and not
// acting, and prints no term, while the acting daemon's names the term it acts under.
func TestStatusPageStandby(t *testing.T) {
	bin := chromiumtest.Find(t)
	p := newHAPair(t, "a", "b")
	p.step(0, 1)
	acting, standby := serveAPI(t, p.ds[0]), serveAPI(t, p.ds[1])

	code, body := call(t, http.MethodGet, standby.URL+"/api/v1/status", "", "")
	require.Equal(t, http.StatusOK, code)
	var st map[string]any
	require.NoError(t, json.Unmarshal(body, &st))
	assert.Equal(t, RoleStandby, st["role"])
	assert.Equal(t, "b", st["instance"])
	assert.NotContains(t, st, "term", "a standby that has held no term sends none")

	dom := chromiumtest.DOM(t, bin, standby.URL+"/")
	require.False(t, chromiumtest.Hidden(dom, "standby"), "the standby banner shows")
	text, _ := chromiumtest.Text(dom, "role")
	assert.Equal(t, "standby (not acting) · b", text)
	for _, id := range []string{"standby", "role"} {
		text, _ := chromiumtest.Text(dom, id)
		assert.NotRegexp(t, `null|undefined|NaN|term`, text, id)
	}

	dom = chromiumtest.DOM(t, bin, acting.URL+"/")
	assert.True(t, chromiumtest.Hidden(dom, "standby"))
	text, _ = chromiumtest.Text(dom, "role")
	assert.Equal(t, "acting · term 1 · a", text)
}

// errUnreachable is a gateway admin API that does not answer.
var errUnreachable = &unreachableError{}

type unreachableError struct{}

func (*unreachableError) Error() string { return "dial tcp 127.0.0.1:1: connect: connection refused" }

// screenshot saves the page as name in $BASIN_TEST_ARTIFACTS (a temporary directory when unset)
// and returns its path.
func screenshot(t *testing.T, bin, url, name string) string {
	t.Helper()
	dir := os.Getenv("BASIN_TEST_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	shot := filepath.Join(dir, name)
	chromiumtest.Run(t, bin, url, "--window-size=1280,1400", "--screenshot="+shot)
	return shot
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
