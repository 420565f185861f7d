package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// httpClient bounds every call the test makes; each is to a process on loopback.
var httpClient = &http.Client{Timeout: 10 * time.Second}

// getJSON GETs url (with a bearer token if given) and decodes a 200 answer into v.
func getJSON(ctx context.Context, u, token string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", u, resp.Status, truncate(string(b), 300))
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("GET %s: %w", u, err)
	}
	return nil
}

// post POSTs with an empty body and returns the status code.
func post(ctx context.Context, u string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// ready reports whether GET u answers 200.
func ready(ctx context.Context, u string) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return false, err.Error()
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK, resp.Status
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// prom is Prometheus' HTTP API.
type prom struct{ base string }

// promResponse is the envelope of every Prometheus API answer.
type promResponse[T any] struct {
	Status    string `json:"status"`
	Data      T      `json:"data"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
}

func promGet[T any](ctx context.Context, p prom, path string, q url.Values) (T, error) {
	var r promResponse[T]
	err := getJSON(ctx, p.base+path+"?"+q.Encode(), "", &r)
	if err == nil && r.Status != "success" {
		err = fmt.Errorf("%s: %s: %s", path, r.ErrorType, r.Error)
	}
	return r.Data, err
}

// series is one series of a range query.
type series struct {
	Metric map[string]string `json:"metric"`
	Values [][2]any          `json:"values"`
}

// points are the series' samples as (time, value).
func (s series) points() ([]time.Time, []float64) {
	var ts []time.Time
	var vs []float64
	for _, p := range s.Values {
		sec, _ := p[0].(float64)
		str, _ := p[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			v = math.NaN()
		}
		ts = append(ts, time.Unix(0, int64(sec*float64(time.Second))))
		vs = append(vs, v)
	}
	return ts, vs
}

// queryRange runs a range query with a one-second step: Grafana's panels and annotations are
// range queries.
func (p prom) queryRange(ctx context.Context, expr string, from, to time.Time) ([]series, error) {
	q := url.Values{"query": {expr}, "start": {unix(from)}, "end": {unix(to)}, "step": {"1"}}
	d, err := promGet[struct {
		ResultType string   `json:"resultType"`
		Result     []series `json:"result"`
	}](ctx, p, "/api/v1/query_range", q)
	if err != nil {
		return nil, err
	}
	if d.ResultType != "matrix" {
		return nil, fmt.Errorf("query_range %s: result type %s", expr, d.ResultType)
	}
	return d.Result, nil
}

// labelValues is what Grafana's label_values(selector, label) asks.
func (p prom) labelValues(ctx context.Context, label, selector string, from, to time.Time) ([]string, error) {
	q := url.Values{"match[]": {selector}, "start": {unix(from)}, "end": {unix(to)}}
	return promGet[[]string](ctx, p, "/api/v1/label/"+url.PathEscape(label)+"/values", q)
}

// promAlert is one alert of GET /api/v1/alerts.
type promAlert struct {
	Labels   map[string]string `json:"labels"`
	State    string            `json:"state"`
	ActiveAt time.Time         `json:"activeAt"`
}

func (p prom) alerts(ctx context.Context) ([]promAlert, error) {
	d, err := promGet[struct {
		Alerts []promAlert `json:"alerts"`
	}](ctx, p, "/api/v1/alerts", nil)
	return d.Alerts, err
}

// firing is the set of alert names firing now.
func (p prom) firing(ctx context.Context) (map[string]bool, error) {
	as, err := p.alerts(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, a := range as {
		if a.State == "firing" {
			out[a.Labels["alertname"]] = true
		}
	}
	return out, nil
}

// firstFiring is, per alert name, the first evaluation at which Prometheus recorded it firing
// (its ALERTS series) between from and to.
func (p prom) firstFiring(ctx context.Context, from, to time.Time) (map[string]time.Time, error) {
	ss, err := p.queryRange(ctx, `ALERTS{alertstate="firing"}`, from, to)
	if err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	for _, s := range ss {
		ts, _ := s.points()
		if len(ts) == 0 {
			continue
		}
		name := s.Metric["alertname"]
		if first, ok := out[name]; !ok || ts[0].Before(first) {
			out[name] = ts[0]
		}
	}
	return out, nil
}

// target is one scrape target of GET /api/v1/targets.
type target struct {
	Labels    map[string]string `json:"labels"`
	ScrapeURL string            `json:"scrapeUrl"`
	Health    string            `json:"health"`
	LastError string            `json:"lastError"`
}

func (p prom) targets(ctx context.Context) ([]target, error) {
	d, err := promGet[struct {
		ActiveTargets []target `json:"activeTargets"`
	}](ctx, p, "/api/v1/targets", url.Values{"state": {"active"}})
	return d.ActiveTargets, err
}

// alertmanagers are the URLs Prometheus sends alerts to.
func (p prom) alertmanagers(ctx context.Context) ([]string, error) {
	d, err := promGet[struct {
		Active []struct {
			URL string `json:"url"`
		} `json:"activeAlertmanagers"`
	}](ctx, p, "/api/v1/alertmanagers", nil)
	var out []string
	for _, a := range d.Active {
		out = append(out, a.URL)
	}
	return out, err
}

func unix(t time.Time) string { return strconv.FormatFloat(float64(t.UnixMilli())/1000, 'f', 3, 64) }

// daemonStatus is the part of the daemon's GET /api/v1/status the test reads.
type daemonStatus struct {
	DryRun     bool `json:"dry_run"`
	Assessment struct {
		State string `json:"state"`
	} `json:"assessment"`
	Policy struct {
		Mode string `json:"mode"`
	} `json:"policy"`
	Alerts struct {
		Active bool `json:"active"`
		Alerts []struct {
			Name string `json:"name"`
		} `json:"alerts"`
	} `json:"alerts"`
}

func (s daemonStatus) alertNames() []string {
	var out []string
	for _, a := range s.Alerts.Alerts {
		out = append(out, a.Name)
	}
	sort.Strings(out)
	return out
}

// slackStandIn records what Alertmanager posts to a Slack incoming webhook (slack_configs with
// api_url): the JSON body, one per notification.
type slackStandIn struct {
	mu    sync.Mutex
	posts []slackPost
}

// slackPost is the part of Alertmanager's Slack payload the test reads.
type slackPost struct {
	at          time.Time // when it arrived
	Channel     string    `json:"channel"`
	Attachments []struct {
		Title     string `json:"title"`
		TitleLink string `json:"title_link"`
		Text      string `json:"text"`
	} `json:"attachments"`
}

func (s *slackStandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var p slackPost
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&p); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p.at = time.Now()
	s.mu.Lock()
	s.posts = append(s.posts, p)
	s.mu.Unlock()
	_, _ = io.WriteString(w, "ok")
}

// titles are the attachment titles posted since a time.
func (s *slackStandIn) titles(since time.Time) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, p := range s.posts {
		if p.at.Before(since) {
			continue
		}
		for _, a := range p.Attachments {
			out = append(out, a.Title)
		}
	}
	return out
}

// posted says whether a post since a time has a title naming the alert and its status (the
// example's title template: "[severity] Alertname firing (deployment)" or "Alertname resolved
// (deployment)").
func (s *slackStandIn) posted(alert, status string, since time.Time) bool {
	_, ok := s.find(alert, status, since)
	return ok
}

// slackAttachment is one attachment of a post: one alert group.
type slackAttachment struct{ Title, TitleLink, Text string }

// find is the first attachment posted since a time whose title names the alert and its status.
func (s *slackStandIn) find(alert, status string, since time.Time) (slackAttachment, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.posts {
		if p.at.Before(since) {
			continue
		}
		for _, a := range p.Attachments {
			if strings.Contains(a.Title, alert+" "+status) {
				return slackAttachment{a.Title, a.TitleLink, a.Text}, true
			}
		}
	}
	return slackAttachment{}, false
}
