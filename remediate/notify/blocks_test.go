package notify_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/slack-go/slack"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/remediate/notify"
)

// wireText and wireBlock are the parts of Block Kit JSON the tests look at. Tests read the JSON
// Slack would receive, not slack-go's structs, so they check the message and not the library.
type wireText struct {
	Type  string `json:"type"`
	Text  string `json:"text"`
	Emoji *bool  `json:"emoji"`
}

type wireBlock struct {
	Type     string     `json:"type"`
	Text     *wireText  `json:"text"`
	Fields   []wireText `json:"fields"`
	Elements []wireText `json:"elements"`
}

func decodeBlocks(t *testing.T, raw []byte) []wireBlock {
	t.Helper()
	var bs []wireBlock
	require.NoError(t, json.Unmarshal(raw, &bs), "blocks JSON: %s", raw)
	checkSlackLimits(t, bs)
	return bs
}

func wire(t *testing.T, blocks []slack.Block) []wireBlock {
	t.Helper()
	raw, err := json.Marshal(blocks)
	require.NoError(t, err)
	return decodeBlocks(t, raw)
}

// checkSlackLimits asserts Block Kit's limits; Slack rejects the whole message (invalid_blocks)
// when one is broken, so a breach loses the notification.
func checkSlackLimits(t *testing.T, bs []wireBlock) {
	t.Helper()
	assert.LessOrEqual(t, len(bs), 50, "blocks per message")
	runes := utf8.RuneCountInString
	for i, b := range bs {
		switch b.Type {
		case "header":
			require.NotNil(t, b.Text, "block %d", i)
			assert.Equal(t, "plain_text", b.Text.Type, "header %d", i)
			assert.LessOrEqual(t, runes(b.Text.Text), 150, "header %d", i)
			if assert.NotNil(t, b.Text.Emoji, "header %d: emoji must be set or the emoji codes show as text", i) {
				assert.True(t, *b.Text.Emoji)
			}
		case "section":
			assert.True(t, b.Text != nil || len(b.Fields) > 0, "section %d is empty", i)
			if b.Text != nil {
				assert.LessOrEqual(t, runes(b.Text.Text), 3000, "section %d", i)
				assert.NotEmpty(t, b.Text.Text, "section %d", i)
			}
			assert.LessOrEqual(t, len(b.Fields), 10, "section %d fields", i)
			for j, f := range b.Fields {
				assert.LessOrEqual(t, runes(f.Text), 2000, "section %d field %d", i, j)
				assert.NotEmpty(t, f.Text, "section %d field %d", i, j)
			}
		case "context":
			assert.NotEmpty(t, b.Elements, "context %d", i)
			assert.LessOrEqual(t, len(b.Elements), 10, "context %d", i)
		default:
			t.Errorf("block %d: unexpected type %q", i, b.Type)
		}
	}
}

func fieldTexts(bs []wireBlock) []string {
	var out []string
	for _, b := range bs {
		for _, f := range b.Fields {
			out = append(out, f.Text)
		}
	}
	return out
}

func sectionTexts(bs []wireBlock) []string {
	var out []string
	for _, b := range bs {
		if b.Type == "section" && b.Text != nil {
			out = append(out, b.Text.Text)
		}
	}
	return out
}

func contextText(t *testing.T, bs []wireBlock) string {
	t.Helper()
	last := bs[len(bs)-1]
	require.Equal(t, "context", last.Type)
	require.Len(t, last.Elements, 1)
	return last.Elements[0].Text
}

var (
	at = time.Date(2026, 11, 20, 9, 30, 0, 0, time.UTC)

	trapped = notify.Event{
		Kind: notify.KindTransition, At: at, Deployment: "prod-a", From: "drifting", To: "trapped",
		WorkingSetOverCache: 1.42, KneeRatio: 1.3, HitRate: 0.31, Plateau: 0.95,
		Reasons: []string{"hit rate 0.31 under the collapse line 0.50 for 30s"},
	}
	tighten = notify.Event{
		Kind: notify.KindAction, At: at, Deployment: "prod-a", To: "trapped", Action: "budget",
		Before: "1.2M tokens", After: "1.0M tokens", WorkingSetOverCache: 1.42, KneeRatio: 1.3,
		Reasons: []string{"W/C above the knee"},
	}
	links = notify.Options{
		DashboardURL: "https://grafana.example.com/d/basin?var-deployment={deployment}&from=now-6h",
		StatusURL:    "https://status.example.com",
	}
)

func TestBlocks(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ev         notify.Event
		o          notify.Options
		header     string
		fields     []string
		sections   []string
		context    []string // substrings
		notContext []string
		fallback   string
	}{
		{
			name:     "transition",
			ev:       trapped,
			o:        links,
			header:   ":rotating_light: prod-a: drifting → trapped",
			fields:   []string{"*State*\ndrifting → *trapped*", "*W/C vs knee*\n1.42 vs 1.30", "*Hit rate vs plateau*\n31.0% vs 95.0%"},
			sections: []string{"*Why*\n• hit rate 0.31 under the collapse line 0.50 for 30s"},
			context: []string{
				"<https://grafana.example.com/d/basin?var-deployment=prod-a&from=now-6h|Dashboard>",
				"<https://status.example.com|Status page>",
				"<!date^1795167000^{date_short} {time_secs}|2026-11-20T09:30:00Z>",
			},
			fallback: "prod-a: drifting → trapped (W/C 1.42, knee 1.30; hit rate 31.0%, plateau 95.0%)",
		},
		{
			name:       "back to healthy, nothing measured, no links",
			ev:         notify.Event{Kind: notify.KindTransition, At: at, Deployment: "prod-a", From: "recovering", To: "healthy"},
			header:     ":large_green_circle: prod-a: recovering → healthy",
			fields:     []string{"*State*\nrecovering → *healthy*"},
			context:    []string{"basin · <!date^"},
			notContext: []string{"Dashboard", "Status page"},
			fallback:   "prod-a: recovering → healthy",
		},
		{
			name:     "action",
			ev:       tighten,
			o:        links,
			header:   ":rotating_light: prod-a: session budget 1.2M tokens → 1.0M tokens",
			fields:   []string{"*State*\ntrapped", "*W/C vs knee*\n1.42 vs 1.30", "*Session budget*\n1.2M tokens → *1.0M tokens*"},
			sections: []string{"*Why*\n• W/C above the knee"},
			context:  []string{"Dashboard", "Status page"},
			fallback: "prod-a: session budget 1.2M tokens → 1.0M tokens (W/C 1.42, knee 1.30)",
		},
		{
			name: "dry run",
			ev: notify.Event{Kind: notify.KindAction, At: at, Deployment: "prod-a", To: "drifting", Action: "lending",
				Before: "off", After: "on", DryRun: true},
			header:   ":warning: prod-a: KV lending off → on (dry run)",
			fields:   []string{"*State*\ndrifting", "*KV lending*\noff → *on*", "*Mode*\n:test_tube: DRY RUN — nothing was changed"},
			fallback: "[dry run] prod-a: KV lending off → on",
		},
		{
			name: "an action with no before says what it did",
			ev: notify.Event{Kind: notify.KindAction, At: at, Deployment: "prod-a", To: "trapped", Action: "hold",
				After: "holding 34 sessions' next calls so the other 58 fit the cache (hold 34 more)"},
			header:   ":rotating_light: prod-a: holds: holding 34 sessions' next calls so the other 58 fit the cache (hold 34 more)",
			fields:   []string{"*State*\ntrapped", "*Held sessions*\n*holding 34 sessions' next calls so the other 58 fit the cache (hold 34 more)*"},
			fallback: "prod-a: holds: holding 34 sessions' next calls so the other 58 fit the cache (hold 34 more)",
		},
		{
			name: "a collapsed hit rate of zero still shows next to its plateau",
			ev: notify.Event{Kind: notify.KindTransition, At: at, Deployment: "d", From: "drifting", To: "trapped",
				Plateau: 0.9},
			header:   ":rotating_light: d: drifting → trapped",
			fields:   []string{"*State*\ndrifting → *trapped*", "*Hit rate vs plateau*\n0.0% vs 90.0%"},
			fallback: "d: drifting → trapped (hit rate 0.0%, plateau 90.0%)",
		},
		{
			name: "text from outside is escaped for mrkdwn",
			ev: notify.Event{Kind: notify.KindTransition, At: at, Deployment: "a&b", From: "pressure", To: "drifting",
				Reasons: []string{"W > 0.9·knee & <rising>"}},
			header:   ":warning: a&b: pressure → drifting",
			fields:   []string{"*State*\npressure → *drifting*"},
			sections: []string{"*Why*\n• W &gt; 0.9·knee &amp; &lt;rising&gt;"},
			fallback: "a&b: pressure → drifting",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := wire(t, notify.Blocks(tc.ev, tc.o))
			require.Equal(t, "header", bs[0].Type)
			assert.Equal(t, tc.header, bs[0].Text.Text)
			assert.Equal(t, tc.fields, fieldTexts(bs))
			assert.Equal(t, tc.sections, sectionTexts(bs))
			ctx := contextText(t, bs)
			for _, s := range tc.context {
				assert.Contains(t, ctx, s)
			}
			for _, s := range tc.notContext {
				assert.NotContains(t, ctx, s)
			}
			assert.Equal(t, tc.fallback, notify.Fallback(tc.ev))
		})
	}
}

func TestBlocksStayWithinSlackLimits(t *testing.T) {
	long := strings.Repeat("working set → knee ", 400) // 7600 characters, multi-byte arrows
	many := make([]string, 500)
	for i := range many {
		many[i] = "sessions above the budget are queued, the oldest first"
	}
	for _, tc := range []struct {
		name     string
		ev       notify.Event
		wantTail string
	}{
		{"one long reason is cut", notify.Event{Kind: notify.KindTransition, To: "trapped", Reasons: []string{long}}, "…"},
		{"many reasons are counted", notify.Event{Kind: notify.KindTransition, To: "trapped", Reasons: many}, " more"},
		{"a long reason among others", notify.Event{Kind: notify.KindTransition, To: "trapped", Reasons: []string{"first", long, "last"}}, "…and 1 more"},
		{"escaping is never cut in half", notify.Event{Kind: notify.KindTransition, To: "trapped", Reasons: []string{strings.Repeat("&", 2000)}}, "&amp;…"},
		{"a long deployment name", notify.Event{Kind: notify.KindAction, Action: "shed", Deployment: strings.Repeat("d", 400), Before: "1", After: "0"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := wire(t, notify.Blocks(tc.ev, notify.Options{})) // checkSlackLimits runs in wire
			if tc.wantTail != "" {
				s := sectionTexts(bs)
				require.Len(t, s, 1)
				assert.True(t, strings.HasSuffix(s[0], tc.wantTail), "ends %q", s[0][max(0, len(s[0])-40):])
				assert.Greater(t, utf8.RuneCountInString(s[0]), 2900, "the room is used")
			} else {
				assert.True(t, strings.HasSuffix(bs[0].Text.Text, "…"))
			}
		})
	}
}

func TestLinksAreSafeInSlackMarkup(t *testing.T) {
	o := notify.Options{DashboardURL: "https://g.example.com/d/x?var-dep={deployment}&q=a|b>c"}
	bs := wire(t, notify.Blocks(notify.Event{Kind: notify.KindTransition, Deployment: "team a/prod", To: "healthy"}, o))
	assert.Contains(t, contextText(t, bs), "<https://g.example.com/d/x?var-dep=team+a%2Fprod&q=a%7Cb%3Ec|Dashboard>")
}

func TestSummaryBlocks(t *testing.T) {
	goodput := 221.04
	s := notify.Summary{
		Deployment: "prod-a",
		From:       at.Add(-24 * time.Hour), To: at,
		TimeInState: map[string]time.Duration{
			"healthy": 20 * time.Hour, "trapped": 90 * time.Minute, "pressure": 2*time.Hour + 30*time.Minute,
		},
		Incidents: 1,
		Actions:   map[string]int{"lending": 2, "budget": 4},
		Notes:     []string{"the budget was at its floor for 40m"},
	}
	for _, tc := range []struct {
		name     string
		goodput  *float64
		fields   []string
		fallback string
	}{
		{"goodput known", &goodput, []string{
			"*Period*\n<!date^1795080600^{date_short} {time_secs}|2026-11-19T09:30:00Z> – <!date^1795167000^{date_short} {time_secs}|2026-11-20T09:30:00Z>",
			"*Incidents*\n1",
			"*Actions*\nsession budget: 4\nKV lending: 2",
			"*Goodput*\n221.0 sessions/h",
		}, "basin daily summary for prod-a: 1 incidents, 6 actions, 1h 30m trapped"},
		{"goodput unknown", nil, []string{
			"*Period*\n<!date^1795080600^{date_short} {time_secs}|2026-11-19T09:30:00Z> – <!date^1795167000^{date_short} {time_secs}|2026-11-20T09:30:00Z>",
			"*Incidents*\n1",
			"*Actions*\nsession budget: 4\nKV lending: 2",
			"*Goodput*\nunknown",
		}, "basin daily summary for prod-a: 1 incidents, 6 actions, 1h 30m trapped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := s
			s.GoodputPerHour = tc.goodput
			bs := wire(t, notify.SummaryBlocks(s, links))
			assert.Equal(t, ":bar_chart: basin daily summary: prod-a", bs[0].Text.Text)
			assert.Equal(t, tc.fields, fieldTexts(bs))
			assert.Equal(t, []string{
				"*Time in state*\n" +
					":large_green_circle: healthy: 20h (83.3%)\n" +
					":warning: pressure: 2h 30m (10.4%)\n" +
					":rotating_light: trapped: 1h 30m (6.2%)",
				"*Notes*\n• the budget was at its floor for 40m",
			}, sectionTexts(bs))
			assert.Contains(t, contextText(t, bs), "var-deployment=prod-a")
			assert.Equal(t, tc.fallback, notify.SummaryFallback(s))
		})
	}
}
