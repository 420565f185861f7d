package notify

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/slack-go/slack"
)

// Slack's limits (Block Kit reference): header text 150 characters, a section's text 3000, a
// field 2000, ten fields per section, 50 blocks per message. Blocks stays well under the block
// and field counts by construction and truncates text to the character limits.
const (
	maxHeaderChars  = 150
	maxSectionChars = 3000
	maxFieldChars   = 2000
	maxFallback     = 1000 // the notification text; Slack truncates long ones anyway
)

// stateEmoji gives each detector state a glance-readable colour in the channel.
var stateEmoji = map[string]string{
	"healthy":    ":large_green_circle:",
	"pressure":   ":warning:",
	"drifting":   ":warning:",
	"trapped":    ":rotating_light:",
	"recovering": ":large_blue_circle:",
}

// stateOrder lists the detector's states in the order a summary shows them.
var stateOrder = []string{"healthy", "pressure", "drifting", "trapped", "recovering"}

// actionNames are what the remediator's actions are called in a message.
var actionNames = map[string]string{
	"budget":  "session budget",
	"shed":    "shed queued sessions",
	"lending": "KV lending",
	"pause":   "remediation paused",
	"hold":    "holds",
}

// changeLabels title the before → after field of each action.
var changeLabels = map[string]string{
	"budget":  "Session budget",
	"shed":    "Queued sessions",
	"lending": "KV lending",
	"pause":   "Remediation",
	"hold":    "Held sessions",
}

func emojiFor(state string) string {
	if e, ok := stateEmoji[state]; ok {
		return e
	}
	return ":grey_question:"
}

func actionName(a string) string {
	if n, ok := actionNames[a]; ok {
		return n
	}
	return a
}

// Blocks renders ev as a Slack message: a header naming the deployment and what happened, a
// section of fields (states, W/C against the knee, hit rate against its plateau, the change an
// action made, a dry-run marker), the reasons, and a context line with the event's time and
// links to o's dashboard and status page. It is a pure function of its arguments so the message
// can be checked without Slack. Measurements that are zero in both halves of a pair (W/C and
// knee, hit rate and plateau) are treated as unknown and left out.
func Blocks(ev Event, o Options) []slack.Block {
	blocks := []slack.Block{
		slack.NewHeaderBlock(plain(headerText(ev))),
	}
	if fields := eventFields(ev); len(fields) > 0 {
		blocks = append(blocks, slack.NewSectionBlock(nil, fields, nil))
	}
	if len(ev.Reasons) > 0 {
		blocks = append(blocks, slack.NewSectionBlock(mrkdwn(bulletList("*Why*", ev.Reasons, maxSectionChars)), nil, nil))
	}
	blocks = append(blocks, contextBlock(ev.At, ev.Deployment, o))
	return blocks
}

// Fallback is the plain text of ev's message: what Slack shows in notifications, in clients
// that cannot draw blocks and to screen readers, so it carries the gist on its own.
func Fallback(ev Event) string {
	var b strings.Builder
	if ev.DryRun {
		b.WriteString("[dry run] ")
	}
	b.WriteString(subject(ev))
	var nums []string
	if ev.WorkingSetOverCache != 0 || ev.KneeRatio != 0 {
		nums = append(nums, fmt.Sprintf("W/C %.2f, knee %.2f", ev.WorkingSetOverCache, ev.KneeRatio))
	}
	if ev.HitRate != 0 || ev.Plateau != 0 {
		nums = append(nums, fmt.Sprintf("hit rate %s, plateau %s", percent(ev.HitRate), percent(ev.Plateau)))
	}
	if len(nums) > 0 {
		b.WriteString(" (" + strings.Join(nums, "; ") + ")")
	}
	return truncate(b.String(), maxFallback)
}

// subject says in a few words what happened.
func subject(ev Event) string {
	dep := ev.Deployment
	if dep == "" {
		dep = "basin"
	}
	switch ev.Kind {
	case KindTransition:
		return fmt.Sprintf("%s: %s → %s", dep, orUnknown(ev.From), orUnknown(ev.To))
	case KindAction:
		s := fmt.Sprintf("%s: %s", dep, actionName(ev.Action))
		switch {
		case ev.Before == "" && ev.After != "":
			// An action with no before (a shed, a hold) says what it did.
			s += ": " + ev.After
		case ev.Before != "" || ev.After != "":
			s += fmt.Sprintf(" %s → %s", orUnknown(ev.Before), orUnknown(ev.After))
		}
		return s
	default:
		if ev.To != "" {
			return fmt.Sprintf("%s: %s", dep, ev.To)
		}
		return dep
	}
}

func headerText(ev Event) string {
	var b strings.Builder
	b.WriteString(emojiFor(ev.To))
	b.WriteString(" ")
	b.WriteString(subject(ev))
	if ev.DryRun {
		b.WriteString(" (dry run)")
	}
	return truncate(b.String(), maxHeaderChars)
}

func eventFields(ev Event) []*slack.TextBlockObject {
	var f []*slack.TextBlockObject
	switch {
	case ev.Kind == KindTransition:
		f = append(f, field("State", escape(orUnknown(ev.From))+" → *"+escape(orUnknown(ev.To))+"*"))
	case ev.To != "":
		f = append(f, field("State", escape(ev.To)))
	}
	if ev.WorkingSetOverCache != 0 || ev.KneeRatio != 0 {
		f = append(f, field("W/C vs knee", fmt.Sprintf("%.2f vs %.2f", ev.WorkingSetOverCache, ev.KneeRatio)))
	}
	if ev.HitRate != 0 || ev.Plateau != 0 {
		f = append(f, field("Hit rate vs plateau", percent(ev.HitRate)+" vs "+percent(ev.Plateau)))
	}
	if ev.Kind == KindAction && (ev.Before != "" || ev.After != "") {
		label, ok := changeLabels[ev.Action]
		if !ok {
			label = "Before → after"
		}
		if ev.Before == "" {
			f = append(f, field(label, "*"+escape(ev.After)+"*"))
		} else {
			f = append(f, field(label, escape(orUnknown(ev.Before))+" → *"+escape(orUnknown(ev.After))+"*"))
		}
	}
	if ev.DryRun {
		f = append(f, field("Mode", ":test_tube: DRY RUN — nothing was changed"))
	}
	return f
}

// Summary rendering.

// SummaryBlocks renders s as the daily summary: a header with the deployment and the period, a
// section of fields (incidents, actions, goodput), time in each state with its share of the
// period, notes, and the links of o. Like Blocks it is pure.
func SummaryBlocks(s Summary, o Options) []slack.Block {
	title := ":bar_chart: basin daily summary"
	if s.Deployment != "" {
		title += ": " + s.Deployment
	}
	blocks := []slack.Block{slack.NewHeaderBlock(plain(truncate(title, maxHeaderChars)))}

	fields := []*slack.TextBlockObject{
		field("Period", slackDate(s.From)+" – "+slackDate(s.To)),
		field("Incidents", fmt.Sprint(s.Incidents)),
	}
	if len(s.Actions) > 0 {
		var parts []string
		for _, a := range slices.Sorted(maps.Keys(s.Actions)) {
			parts = append(parts, fmt.Sprintf("%s: %d", escape(actionName(a)), s.Actions[a]))
		}
		fields = append(fields, field("Actions", strings.Join(parts, "\n")))
	} else {
		fields = append(fields, field("Actions", "none"))
	}
	goodput := "unknown"
	if s.GoodputPerHour != nil {
		goodput = fmt.Sprintf("%.1f sessions/h", *s.GoodputPerHour)
	}
	fields = append(fields, field("Goodput", goodput))
	blocks = append(blocks, slack.NewSectionBlock(nil, fields, nil))

	if len(s.TimeInState) > 0 {
		blocks = append(blocks, slack.NewSectionBlock(mrkdwn(truncate(timeInState(s), maxSectionChars)), nil, nil))
	}
	if len(s.Notes) > 0 {
		blocks = append(blocks, slack.NewSectionBlock(mrkdwn(bulletList("*Notes*", s.Notes, maxSectionChars)), nil, nil))
	}
	blocks = append(blocks, contextBlock(time.Time{}, s.Deployment, o))
	return blocks
}

// SummaryFallback is the plain text of s's message.
func SummaryFallback(s Summary) string {
	dep := ""
	if s.Deployment != "" {
		dep = " for " + s.Deployment
	}
	return truncate(fmt.Sprintf("basin daily summary%s: %d incidents, %d actions, %s trapped",
		dep, s.Incidents, sumActions(s.Actions), formatDuration(s.TimeInState["trapped"])), maxFallback)
}

func sumActions(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// timeInState lists the states in the detector's order, then any others alphabetically, each
// with its share of the time accounted for.
func timeInState(s Summary) string {
	var total time.Duration
	for _, d := range s.TimeInState {
		total += d
	}
	states := slices.Clone(stateOrder)
	for _, st := range slices.Sorted(maps.Keys(s.TimeInState)) {
		if !slices.Contains(stateOrder, st) {
			states = append(states, st)
		}
	}
	var b strings.Builder
	b.WriteString("*Time in state*")
	for _, st := range states {
		d, ok := s.TimeInState[st]
		if !ok {
			continue
		}
		share := 0.0
		if total > 0 {
			share = float64(d) / float64(total)
		}
		fmt.Fprintf(&b, "\n%s %s: %s (%s)", emojiFor(st), escape(st), formatDuration(d), percent(share))
	}
	return b.String()
}

// Shared pieces.

func contextBlock(at time.Time, deployment string, o Options) *slack.ContextBlock {
	parts := []string{"basin"}
	if !at.IsZero() {
		parts = append(parts, slackDate(at))
	}
	if u := linkURL(o.DashboardURL, deployment); u != "" {
		parts = append(parts, "<"+u+"|Dashboard>")
	}
	if u := linkURL(o.StatusURL, deployment); u != "" {
		parts = append(parts, "<"+u+"|Status page>")
	}
	return slack.NewContextBlock("", mrkdwn(strings.Join(parts, " · ")))
}

// linkURL fills in "{deployment}" and makes the URL safe inside Slack's <url|label>, where a
// raw "|" or ">" would end the URL early.
func linkURL(raw, deployment string) string {
	if raw == "" {
		return ""
	}
	u := strings.ReplaceAll(raw, "{deployment}", url.QueryEscape(deployment))
	return strings.NewReplacer("|", "%7C", "<", "%3C", ">", "%3E").Replace(u)
}

// slackDate renders t with Slack's date formatting, so each reader sees it in their own time
// zone, with an RFC 3339 fallback for clients that cannot.
func slackDate(t time.Time) string {
	if t.IsZero() {
		return "?"
	}
	return fmt.Sprintf("<!date^%d^{date_short} {time_secs}|%s>", t.Unix(), t.UTC().Format(time.RFC3339))
}

// bulletList renders a titled list within limit characters. Items that do not fit are counted
// ("…and 3 more") instead of shown, and the item that straddles the limit is cut with an
// ellipsis when a useful part of it fits.
func bulletList(title string, items []string, limit int) string {
	var b strings.Builder
	b.WriteString(title)
	used := utf8.RuneCountInString(title)
	for i, it := range items {
		line := "\n• " + escape(it)
		n := utf8.RuneCountInString(line)
		tail := moreItems(len(items) - i - 1)
		if used+n+utf8.RuneCountInString(tail) <= limit {
			b.WriteString(line)
			used += n
			continue
		}
		// The previous round made room for moreItems(len(items)-i), so that always fits.
		if room := limit - used - utf8.RuneCountInString(tail); room >= minCutItem {
			b.WriteString(truncate(line, room))
			b.WriteString(tail)
		} else {
			b.WriteString(moreItems(len(items) - i))
		}
		break
	}
	return b.String()
}

// minCutItem is the shortest cut-down item worth showing rather than counting.
const minCutItem = 40

func moreItems(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("\n…and %d more", n)
}

// truncate cuts s to at most limit characters (runes), ending in "…" when it cut, and never in
// the middle of an HTML entity that escape produced.
func truncate(s string, limit int) string {
	if utf8.RuneCountInString(s) <= limit {
		return s
	}
	if limit < 1 {
		return ""
	}
	runes := []rune(s)[:limit-1]
	cut := string(runes)
	if amp := strings.LastIndexByte(cut, '&'); amp >= 0 && !strings.Contains(cut[amp:], ";") {
		cut = cut[:amp]
	}
	return cut + "…"
}

// escape makes text safe for mrkdwn: Slack reads &, < and > as the start of an entity or a
// link, so text from outside (deployment names, reasons) must carry them escaped.
func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

func plain(s string) *slack.TextBlockObject {
	// emoji=true: without it Slack shows ":rotating_light:" as text in a header.
	return slack.NewTextBlockObject(slack.PlainTextType, s, true, false)
}

func mrkdwn(s string) *slack.TextBlockObject {
	return slack.NewTextBlockObject(slack.MarkdownType, s, false, false)
}

func field(title, value string) *slack.TextBlockObject {
	return mrkdwn(truncate("*"+title+"*\n"+value, maxFieldChars))
}

func orUnknown(s string) string {
	if s == "" {
		return "?"
	}
	return s
}

func percent(f float64) string {
	return fmt.Sprintf("%.1f%%", 100*f)
}

// formatDuration renders d to the minute ("22h 10m", "45m"), or to the second under a minute.
func formatDuration(d time.Duration) string {
	if d < time.Minute {
		return d.Round(time.Second).String()
	}
	d = d.Round(time.Minute)
	h, m := d/time.Hour, (d%time.Hour)/time.Minute
	switch {
	case h == 0:
		return fmt.Sprintf("%dm", m)
	case m == 0:
		return fmt.Sprintf("%dh", h)
	default:
		return fmt.Sprintf("%dh %dm", h, m)
	}
}
