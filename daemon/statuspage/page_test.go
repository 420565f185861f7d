package statuspage_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/daemon/statuspage"
	"github.com/basin-dev/basin/test/chromiumtest"
)

// api is what the fake daemon answers: the JSON of /api/v1/status, /events, /history and /curve,
// in the shapes the daemon writes them.
type api struct {
	status, history, curve map[string]any
	events                 []map[string]any
}

// serve is the page with a fake daemon API behind it.
func (a api) serve(t *testing.T) string {
	t.Helper()
	mux := http.NewServeMux()
	page := statuspage.Handler()
	mux.Handle("GET /{$}", page)
	mux.Handle("GET /static/", page)
	answer := func(path string, v any) {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		mux.HandleFunc("GET "+path, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(b)
		})
	}
	hist := a.history
	if hist == nil {
		hist = map[string]any{"points": []any{}}
	}
	events := a.events
	if events == nil {
		events = []map[string]any{}
	}
	answer("/api/v1/status", a.status)
	answer("/api/v1/history", hist)
	answer("/api/v1/events", map[string]any{"events": events})
	curve := a.curve
	if curve == nil {
		curve = map[string]any{"points": []any{}, "lambda_per_s": 0, "live_sessions": 0, "completion_per_s": 0}
	}
	answer("/api/v1/curve", curve)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL + "/"
}

const (
	since    = "2026-03-02T10:00:00Z"
	observed = "2026-03-02T10:04:35Z"
	now      = "2026-03-02T10:06:00Z"
)

// status is a daemon's status: healthy, acting, every signal seen, the gateway at 1M tokens;
// edit changes it.
func status(edit func(s, a, g map[string]any)) map[string]any {
	a := map[string]any{"at": now, "state": "healthy", "since": since, "observed_at": observed,
		"reasons": []string{"W/C 0.62 < knee 1.34 and hit rate 0.95 on its plateau 0.95"}}
	g := map[string]any{"budget_tokens": 1_000_000, "reference_budget_tokens": 1_000_000, "reserved_tokens": 412_000,
		"live_sessions": 12, "queued_sessions": 0}
	s := map[string]any{"deployment": "unit", "now": now, "dry_run": false, "assessment": a, "gateway": g,
		"policy":  map[string]any{"mode": "normal", "target_tokens": 1_000_000},
		"lending": map[string]any{"configured": false, "enabled": false}}
	if edit != nil {
		edit(s, a, g)
	}
	return s
}

// budgetEvent is an audit record of a budget change from → to, as the executor writes it.
func budgetEvent(seq int, phase string, from, to int64, reasons ...string) map[string]any {
	return map[string]any{"seq": seq, "at": fmt.Sprintf("2026-03-02T10:%02d:00Z", seq), "kind": "budget",
		"phase": phase, "state": "healthy", "mode": "normal",
		"budget": map[string]any{"from_tokens": from, "to_tokens": to, "reference_tokens": 1_000_000}, "reasons": reasons}
}

// The reasons of one plan that tightened the budget and switched lending on, as the policy and the
// lender wrote them: audit logs written before each action carried its own reasons give both of
// its actions all of them, and the page still splits them.
var planReasons = []string{
	"hit rate 0.73 left its plateau 0.95 (− 0.05): tighten B 1.00M → 950K",
	"lending on: cache-first (risk rule: cache-first (cache limit 76.0 sessions; decode limit 153.6 sessions)); hottest decode decode-0 reserved 0.38 ≤ pressure-off 0.70, nothing waiting for decode KV",
	"decode-0: reserved 300000 / 800000 = 0.38, free 500000, lent 0, 0 waiting for decode KV",
}

// TestPageInChromium draws the page from recorded API answers in headless Chromium and checks what
// an operator reads: the dry-run banner, blindness, token counts and each action's reason.
func TestPageInChromium(t *testing.T) {
	bin := chromiumtest.Find(t)
	for _, tc := range []struct {
		name  string
		api   api
		check func(t *testing.T, dom string)
	}{
		{"acting and seeing", api{status: status(nil)}, func(t *testing.T, dom string) {
			assert.True(t, chromiumtest.Hidden(dom, "dry-run"), "no dry-run banner while acting")
			assert.True(t, chromiumtest.Hidden(dom, "blind"), "no blind line while every signal is seen")
			assert.True(t, chromiumtest.Hidden(dom, "role"), "no role without a store")
			assert.True(t, chromiumtest.Hidden(dom, "standby"))
			assert.Equal(t, "healthy", chromiumtest.Attr(dom, "state", "data-state"))
			text, _ := chromiumtest.Text(dom, "state")
			assert.Equal(t, "healthy", text)
			text, _ = chromiumtest.Text(dom, "budget-note")
			assert.Equal(t, "B 1M · B_ref 1M · reserved 412K · 12 live, 0 queued", text)
		}},
		{"holding", api{status: status(func(s, a, g map[string]any) {
			a["state"] = "recovering"
			g["live_sessions"], g["held_sessions"], g["held_tokens"], g["held_calls"], g["oldest_held_call_seconds"] = 92, 34, 1_200_000, 5, 61.4
		}), events: []map[string]any{
			{"seq": 5, "at": "2026-03-02T10:05:00Z", "kind": "hold", "phase": "done", "state": "trapped", "mode": "incident",
				"hold": map[string]any{"hold_session_ids": []string{"s-3", "s-9"}, "held_sessions": 34, "active_sessions": 58,
					"summary": "holding 34 sessions' next calls so the other 58 fit the cache (hold 2 more)"},
				"reasons": []string{planHold}},
		}}, func(t *testing.T, dom string) {
			text, _ := chromiumtest.Text(dom, "budget-note")
			assert.Equal(t, "B 1M · B_ref 1M · reserved 412K · 92 live, 0 queued · 34 held (1.2M of context), 5 calls waiting, the longest 61 s", text)
			rows := chromiumtest.Rows(dom, "actions")
			require.Len(t, rows, 1)
			assert.Equal(t, []string{"hold", "done", "holding 34 sessions' next calls so the other 58 fit the cache (hold 2 more)", planHold}, rows[0][1:])
		}},
		{"dry run", api{status: status(func(s, _, _ map[string]any) {
			s["dry_run"] = true
			s["policy"] = map[string]any{"mode": "incident", "target_tokens": 682_500}
		})}, func(t *testing.T, dom string) {
			require.False(t, chromiumtest.Hidden(dom, "dry-run"), "the dry-run banner shows")
			text, _ := chromiumtest.Text(dom, "dry-run")
			assert.Contains(t, text, "dry run: basin decides but does not act")
			assert.Regexp(t, `<title>basin — healthy \(dry run\)</title>`, dom)
			text, _ = chromiumtest.Text(dom, "budget-note")
			assert.Contains(t, text, "dry run: basin would hold B at 683K, not applied")
		}},
		{"standby (HA)", api{status: status(func(s, _, _ map[string]any) {
			s["role"], s["term"], s["instance"] = "standby", 3, "daemon-1"
		})}, func(t *testing.T, dom string) {
			require.False(t, chromiumtest.Hidden(dom, "standby"), "the standby banner shows")
			text, _ := chromiumtest.Text(dom, "standby")
			assert.Equal(t, "standby: daemon-1 watches and takes no action; the daemon holding the lease acts (this one last held term 3).", text)
			text, _ = chromiumtest.Text(dom, "role")
			assert.Equal(t, "standby (not acting) · last held term 3 · daemon-1", text, "not \"term 3\", which reads as the term it acts under")
			assert.Regexp(t, `<title>basin — healthy \(standby\)</title>`, dom)
		}},
		// A standby that has never held the lease: the status leaves its term out (the daemon's
		// JSON) or, from another client, sends it as null. Neither is a term to print.
		{"standby (HA), never held a term", api{status: status(func(s, _, _ map[string]any) {
			s["role"], s["instance"] = "standby", "daemon-1"
		})}, standbyWithoutTerm},
		{"standby (HA), term null", api{status: status(func(s, _, _ map[string]any) {
			s["role"], s["term"], s["instance"] = "standby", nil, "daemon-1"
		})}, standbyWithoutTerm},
		{"acting (HA)", api{status: status(func(s, _, _ map[string]any) {
			s["role"], s["term"], s["instance"] = "acting", 4, "daemon-0"
		})}, func(t *testing.T, dom string) {
			assert.True(t, chromiumtest.Hidden(dom, "standby"))
			text, _ := chromiumtest.Text(dom, "role")
			assert.Equal(t, "acting · term 4 · daemon-0", text)
		}},
		{"blind: stale signals", api{status: status(func(_, a, _ map[string]any) {
			a["blind"] = []string{"hit_rate stale", "cache_capacity_tokens missing", "working_set stale"}
		})}, func(t *testing.T, dom string) {
			assert.Equal(t, "blind", chromiumtest.Attr(dom, "state", "data-state"), "not the green healthy")
			text, _ := chromiumtest.Text(dom, "state")
			assert.Equal(t, "blind", text)
			require.False(t, chromiumtest.Hidden(dom, "blind"))
			text, _ = chromiumtest.Text(dom, "blind")
			assert.Equal(t, "cannot see: stale: hit_rate, working_set; missing: cache_capacity_tokens — holding healthy since 2026-03-02 10:00:00 UTC; "+
				"last saw every signal at 2026-03-02 10:04:35 UTC", text)
			text, _ = chromiumtest.Text(dom, "since")
			assert.Empty(t, text, "the held state's since is on the blind line, not next to the badge")
		}},
		{"blind: the daemon says so, gateway unreachable, never seen", api{status: status(func(s, a, _ map[string]any) {
			s["blind"] = true
			s["unseen"] = []string{"gateway admin API: dial tcp 127.0.0.1:8081: connection refused"}
			a["observed_at"] = "0001-01-01T00:00:00Z"
			s["gateway"] = map[string]any{"error": "dial tcp 127.0.0.1:8081: connection refused"}
		})}, func(t *testing.T, dom string) {
			assert.Equal(t, "blind", chromiumtest.Attr(dom, "state", "data-state"))
			text, _ := chromiumtest.Text(dom, "blind")
			assert.Equal(t, "cannot see: gateway admin API: dial tcp 127.0.0.1:8081: connection refused — holding healthy since "+
				"2026-03-02 10:00:00 UTC; never saw every signal", text)
			text, _ = chromiumtest.Text(dom, "budget-note")
			assert.Equal(t, "the gateway's budget is unknown: dial tcp 127.0.0.1:8081: connection refused", text)
		}},
		{"blind: only the gateway's error tells", api{status: status(func(s, _, _ map[string]any) {
			s["blind"] = true
			s["gateway"] = map[string]any{"error": "context deadline exceeded"}
		})}, func(t *testing.T, dom string) {
			text, _ := chromiumtest.Text(dom, "blind")
			assert.Equal(t, "cannot see: gateway admin API: context deadline exceeded — holding healthy since 2026-03-02 10:00:00 UTC; "+
				"last saw every signal at 2026-03-02 10:04:35 UTC", text)
		}},
		{"blind before the first step", api{status: status(func(s, a, _ map[string]any) {
			s["blind"], s["unseen"] = true, []string{"no step completed yet"}
			for _, k := range []string{"state", "since", "reasons"} {
				delete(a, k)
			}
			a["observed_at"] = "0001-01-01T00:00:00Z"
		})}, func(t *testing.T, dom string) {
			assert.Equal(t, "blind", chromiumtest.Attr(dom, "state", "data-state"))
			text, _ := chromiumtest.Text(dom, "blind")
			assert.Equal(t, "cannot see: no step completed yet — no state yet; never saw every signal", text)
		}},
		{"spike tolerance", api{status: status(nil), curve: curveWith(map[string]any{"ratio": 1.62, "sessions": 37.2})},
			func(t *testing.T, dom string) {
				text, _ := chromiumtest.Text(dom, "curve-note")
				assert.Contains(t, text, "absorbs a spike of +62% for 10 min (37 extra sessions) and comes back")
			}},
		{"counts of one", api{status: status(func(_, _, g map[string]any) {
			g["live_sessions"], g["held_sessions"], g["held_tokens"], g["held_calls"], g["oldest_held_call_seconds"] = 2, 1, 40_000, 1, 3
		}), curve: curveWith(map[string]any{"ratio": 1.05, "sessions": 1.2})}, func(t *testing.T, dom string) {
			text, _ := chromiumtest.Text(dom, "budget-note")
			assert.Equal(t, "B 1M · B_ref 1M · reserved 412K · 2 live, 0 queued · 1 held (40K of context), 1 call waiting, the longest 3 s", text)
			text, _ = chromiumtest.Text(dom, "curve-note")
			assert.Contains(t, text, "absorbs a spike of +5% for 10 min (1 extra session) and comes back")
		}},
		{"spike tolerance: none left", api{status: status(nil), curve: curveWith(map[string]any{"ratio": 1, "sessions": 0})},
			func(t *testing.T, dom string) {
				text, _ := chromiumtest.Text(dom, "curve-note")
				assert.Contains(t, text, "absorbs no spike: more arrivals now would leave it trapped")
			}},
		{"spike tolerance: unknown, not zero", api{status: status(nil), curve: curveWith(nil)},
			func(t *testing.T, dom string) {
				text, _ := chromiumtest.Text(dom, "curve-note")
				assert.Contains(t, text, "spike tolerance unknown: the curve is not known up to the edge")
				assert.NotContains(t, text, "absorbs")
			}},
		{"count-only budget", api{
			status: status(func(_, _, g map[string]any) { g["budget_tokens"], g["reference_budget_tokens"] = 1e12, 1e12 }),
			history: map[string]any{"points": []map[string]any{
				{"t": "2026-03-02T10:00:00Z", "state": "healthy", "budget": 1e12, "reserved": 300_000},
				{"t": "2026-03-02T10:01:00Z", "state": "healthy", "budget": 1e12, "reserved": 412_000},
				{"t": "2026-03-02T10:02:00Z", "state": "healthy", "budget": 1e12, "reserved": 380_000}}},
			events: []map[string]any{budgetEvent(1, "done", 1e12, 640_000, "incident: cut B 1000000.00M → 640K")},
		}, func(t *testing.T, dom string) {
			text, _ := chromiumtest.Text(dom, "budget-note")
			assert.Contains(t, text, "B ∞ (count only): out of reach, the gateway counts sessions and admits them all")
			assert.NotContains(t, text, "B_ref", "a count-only reference is no reference")
			rows := chromiumtest.Rows(dom, "actions")
			require.Len(t, rows, 1)
			assert.Equal(t, "B ∞ (count only) → 640K", rows[0][3])
			chart, _ := chromiumtest.Inner(dom, "budget-chart")
			labels := regexp.MustCompile(`<text x="2"[^>]*>([^<]*)</text>`).FindAllStringSubmatch(chart, -1)
			require.Len(t, labels, 3, "the reserved tokens are drawn, with the y axis labelled")
			for _, l := range labels {
				assert.Regexp(t, `^(0|\d{1,3}(\.\d{1,2})?[KMGT]?)$`, l[1], "an axis label for people")
			}
			assert.NotContains(t, chart, "1050000", "the count-only budget is not on the axis")
			assert.Empty(t, pathCommands(dom, "budget-line"), "no line for a budget that is not one")
		}},
		{"count-only gateway", api{
			status: status(func(_, _, g map[string]any) {
				g["budget_tokens"], g["reference_budget_tokens"], g["count_only"] = 0, 0, true
			}),
			events: []map[string]any{func() map[string]any {
				e := budgetEvent(1, "done", 0, 682_500, "the gateway only counts (admission.count_only): basin takes admission over")
				e["budget"].(map[string]any)["from_count_only"] = true
				return e
			}()},
		}, func(t *testing.T, dom string) {
			text, _ := chromiumtest.Text(dom, "budget-note")
			assert.Contains(t, text, "no budget yet: the gateway only counts (admission.count_only) and admits every session")
			assert.NotContains(t, text, "B 0")
			rows := chromiumtest.Rows(dom, "actions")
			require.Len(t, rows, 1)
			assert.Equal(t, "B count only → 683K", rows[0][3])
		}},
		{"token counts", api{status: status(nil), events: []map[string]any{
			budgetEvent(1, "done", 999, 1000, "a"),
			budgetEvent(2, "done", 682_500, 999_999, "b"),
			budgetEvent(3, "done", 1_050_000, 12_345, "c"),
			budgetEvent(4, "done", 2_500_000_000, 99_950_000_000, "d"),
		}}, func(t *testing.T, dom string) {
			var got []string
			for _, r := range chromiumtest.Rows(dom, "actions") {
				got = append(got, r[3])
			}
			assert.Equal(t, []string{"B 2.5G → 100G", "B 1.05M → 12.3K", "B 683K → 1M", "B 999 → 1K"}, got, "newest first")
		}},
		{"each action its own reason", api{status: status(nil), events: []map[string]any{
			budgetEvent(2, "intent", 1_000_000, 950_000, planReasons...),
			budgetEvent(2, "done", 1_000_000, 950_000, planReasons...),
			{"seq": 2, "at": "2026-03-02T10:02:00Z", "kind": "lending", "phase": "done", "state": "healthy", "mode": "normal",
				"lending": map[string]any{"enabled": true, "grants_tokens": map[string]any{"decode-0": 400_000}, "max_fraction": 0.5},
				"reasons": planReasons},
			{"seq": 3, "at": "2026-03-02T10:03:00Z", "kind": "shed", "phase": "dry_run", "state": "trapped", "mode": "incident",
				"shed": map[string]any{"session_ids": []string{"s-17"}}, "reasons": []string{
					"mode normal → incident: detector trapped",
					"incident: cut B 950K → 700K (0.70 × B_ref 1.00M) so the working set drains; admitted sessions finish",
					"long-run arrivals 9.00/min > peak completion rate 5.11/min and the head of the queue waited 2m0s ≥ 1m0s: shed the lowest-priority queued session s-17"}},
			budgetEvent(4, "done", 700_000, 700_000, "mode normal → incident: detector trapped", "incident: cut B 950K → 700K", "found applied after a restart"),
		}}, func(t *testing.T, dom string) {
			rows := chromiumtest.Rows(dom, "actions")
			require.Len(t, rows, 4, "the intent is not a row")
			assert.Equal(t, []string{"budget", "done", "B 700K, B_ref 1M",
				"mode normal → incident: detector trapped; incident: cut B 950K → 700K; found applied after a restart"}, rows[0][1:])
			assert.Equal(t, []string{"shed", "dry run: not done", "shed s-17", planShed}, rows[1][1:])
			assert.Equal(t, []string{"lending", "done", "lending on: decode-0 400K", planReasons[1]}, rows[2][1:],
				"the lender's verdict; its measurements are the tooltip")
			assert.Equal(t, []string{"budget", "done", "B 1M → 950K", planReasons[0]}, rows[3][1:],
				"the budget's own reason, not the lender's measurements")
			assert.Contains(t, dom, `title="`+planReasons[1]+"\n"+planReasons[2]+`"`)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.api.serve(t)
			dom := chromiumtest.DOM(t, bin, url)
			require.Contains(t, dom, `data-loaded="true"`, "the script fetched the API and drew")
			tc.check(t, dom)
			if dir := os.Getenv("BASIN_TEST_ARTIFACTS"); dir != "" {
				name := strings.NewReplacer(" ", "-", ":", "", ",", "").Replace(tc.name)
				require.NoError(t, os.MkdirAll(dir, 0o755))
				chromiumtest.Run(t, bin, url, "--window-size=1280,1100", "--screenshot="+filepath.Join(dir, "statuspage-"+name+".png"))
			}
		})
	}
}

// standbyWithoutTerm checks the page of a standby whose status carries no term: it says standby and
// not acting, and prints no term — neither a number nor "null".
func standbyWithoutTerm(t *testing.T, dom string) {
	require.False(t, chromiumtest.Hidden(dom, "standby"), "the standby banner shows")
	text, _ := chromiumtest.Text(dom, "standby")
	assert.Equal(t, "standby: daemon-1 watches and takes no action; the daemon holding the lease acts.", text)
	text, _ = chromiumtest.Text(dom, "role")
	assert.Equal(t, "standby (not acting) · daemon-1", text)
	for _, id := range []string{"standby", "role"} {
		text, _ := chromiumtest.Text(dom, id)
		assert.NotRegexp(t, `null|undefined|NaN|term`, text, id)
	}
}

// planHold is the hold rule's reason in the hold record above.
const planHold = "detector trapped, hit rate 0.31 off its plateau 0.95: holding 34 sessions' next calls so the other 58 fit the cache (hold 2 more): active working set 2.10M → 690K, at or under B 700K"

// planShed is the shedding rule's reason in the shed record above.
const planShed = "long-run arrivals 9.00/min > peak completion rate 5.11/min and the head of the queue waited 2m0s ≥ 1m0s: shed the lowest-priority queued session s-17"

// pathCommands is the d attribute of the SVG path with the given id, without the placeholder
// "M0 0" the page draws for a series with no point.
func pathCommands(dom, id string) string {
	d := chromiumtest.Attr(dom, id, "d")
	if d == "M0 0" {
		return ""
	}
	return d
}

// TestPageLosesTheDaemon: the page drew a healthy daemon, then the daemon stopped answering. The
// badge says so and loses the green: the state it shows is no longer known.
func TestPageLosesTheDaemon(t *testing.T) {
	bin := chromiumtest.Find(t)
	body, err := json.Marshal(status(nil))
	require.NoError(t, err)
	var calls atomic.Int32
	mux := http.NewServeMux()
	page := statuspage.Handler()
	mux.Handle("GET /{$}", page)
	mux.Handle("GET /static/", page)
	mux.HandleFunc("GET /api/v1/status", func(w http.ResponseWriter, _ *http.Request) {
		if calls.Add(1) > 1 {
			http.Error(w, "gone", http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	for _, p := range []string{"/api/v1/history", "/api/v1/curve", "/api/v1/events"} {
		mux.HandleFunc("GET "+p, func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"points": [], "events": []}`))
		})
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	// 7 s of the page's time: the first refresh at load, the second 5 s later.
	dom := string(chromiumtest.Run(t, bin, srv.URL+"/", "--dump-dom", "--virtual-time-budget=7000"))
	require.Contains(t, dom, `data-loaded="true"`, "the first refresh drew")
	require.GreaterOrEqual(t, calls.Load(), int32(2), "the page refreshed")
	text, _ := chromiumtest.Text(dom, "state")
	assert.Equal(t, "no data: /api/v1/status: 502", text)
	assert.Equal(t, "no-data", chromiumtest.Attr(dom, "state", "data-state"), "not the green of the last reading")
}

// curveWith is a /api/v1/curve answer with a learnt curve and, when not nil, a spike tolerance.
func curveWith(tolerance map[string]any) map[string]any {
	c := map[string]any{"points": []map[string]any{{"n": 10, "sessions_per_s": 0.02}, {"n": 30, "sessions_per_s": 0.06},
		{"n": 60, "sessions_per_s": 0.03}}, "lambda_per_s": 0.04, "live_sessions": 20, "completion_per_s": 0.04,
		"stable_n": 20.0, "unstable_n": 50.0}
	if tolerance != nil {
		c["spike_tolerance"] = tolerance
	}
	return c
}
