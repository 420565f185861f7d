package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Readiness probing. /healthz says the process is up and serving; /readyz says it can do its job:
// it is not shutting down and at least one upstream answers. An upstream is probed with GET
// /health (SGLang's model gateway, SGLang and vLLM all serve it); any HTTP answer under 500 counts
// as reachable — a router without /health answers 404, which still proves it is there — while a
// refused connection, a timeout or a 5xx does not. The result is kept for readyCacheFor, so that
// a probe every second from several load balancers costs the upstreams one request per interval.
const (
	readyCacheFor = 2 * time.Second
	readyTimeout  = 2 * time.Second
	readyPath     = "/health"
)

// readiness caches the last upstream probe.
type readiness struct {
	mu     sync.Mutex // held while probing, so concurrent requests share one probe
	at     time.Time
	ok     bool
	detail string
}

// serveReady answers GET /readyz: 200 when an upstream is reachable, else 503 naming why.
func (g *Gateway) serveReady(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if g.isStopping() {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "not ready: shutting down\n")
		return
	}
	ok, detail := g.ready(r.Context())
	if why, _ := g.repl.Degraded(); why != "" {
		// Degraded with degraded_admission: refuse, this replica turns new sessions away: a
		// load balancer should send them to a replica that reaches the leader. With the local
		// slice it still admits, and stays in rotation.
		detail += "; degraded: " + why
		if g.cfg.Replication.DegradedAdmission == DegradedRefuse {
			ok = false
		}
	}
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "not ready: "+detail+"\n")
		return
	}
	_, _ = io.WriteString(w, "ready: "+detail+"\n")
}

// ready probes the upstreams, or returns the last probe when it is recent.
func (g *Gateway) ready(ctx context.Context) (bool, string) {
	rd := &g.readiness
	rd.mu.Lock()
	defer rd.mu.Unlock()
	now := g.now()
	if !rd.at.IsZero() && now.Sub(rd.at) < readyCacheFor && !now.Before(rd.at) {
		return rd.ok, rd.detail
	}
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	type result struct {
		up  string
		err error
	}
	results := make([]result, len(g.upstreams))
	var wg sync.WaitGroup
	for i, u := range g.upstreams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = result{up: u.url.Redacted(), err: g.probe(ctx, u)}
		}()
	}
	wg.Wait()
	var up int
	var down []string
	for _, res := range results {
		if res.err == nil {
			up++
		} else {
			down = append(down, fmt.Sprintf("%s: %v", res.up, res.err))
		}
	}
	rd.at, rd.ok = now, up > 0
	rd.detail = fmt.Sprintf("%d of %d upstreams reachable", up, len(g.upstreams))
	if len(down) > 0 {
		rd.detail += " (" + strings.Join(down, "; ") + ")"
	}
	return rd.ok, rd.detail
}

// probe asks one upstream GET /health.
func (g *Gateway) probe(ctx context.Context, u *upstream) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.url.JoinPath(readyPath).String(), nil)
	if err != nil {
		return err
	}
	resp, err := g.transport.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode >= 500 {
		return fmt.Errorf("GET %s answered %d", readyPath, resp.StatusCode)
	}
	return nil
}
