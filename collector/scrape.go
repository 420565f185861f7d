package collector

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// acceptHeader asks for the text format: prometheus_client (SGLang, vLLM) answers OpenMetrics
// only when asked, and the collector never decodes OpenMetrics (expfmt's parser for it is two
// orders of magnitude slower) or protobuf.
const acceptHeader = `text/plain;version=0.0.4;q=0.9,*/*;q=0.1`

// Run scrapes every target once per Interval (of Now's time), all concurrently (at most
// Concurrency at a time), each within Timeout (wall time), until ctx is done; then it returns nil. It re-reads the target file when
// it changed. One Run at a time.
func (c *Collector) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("collector: Run is already running")
	}
	defer c.running.Store(false)
	ticker := time.NewTicker(c.opts.WallDuration(c.opts.Interval))
	defer ticker.Stop()
	for {
		if ctx.Err() != nil {
			return nil
		}
		c.round(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// round reloads the target file if needed and scrapes every target once.
func (c *Collector) round(ctx context.Context) {
	c.reloadTargetFile()
	targets := c.Targets()
	sem := make(chan struct{}, c.opts.Concurrency)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, t := range targets {
		if t.URL == "" {
			continue // fed through Ingest only
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			c.scrapeTarget(ctx, t)
		})
	}
}

// scrapeTarget scrapes one target and records the result.
func (c *Collector) scrapeTarget(ctx context.Context, t Target) {
	start := c.opts.Now()
	// The timeout is the network's, in wall time whatever the deployment's speed: a scrape of a
	// deployment served 60 times faster takes no less time on the wire.
	sctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	raw, kept := getBuffer(), getBuffer()
	defer putBuffer(raw)
	defer putBuffer(kept)
	fams, info, reason, err := c.scrape(sctx, t, raw, kept)
	c.metrics.scrapeDuration.WithLabelValues(t.Name).Observe(c.opts.Now().Sub(start).Seconds())
	if err == nil && t.Role.engine() {
		if err = c.checkSpeed(fams); err != nil {
			reason, err = reasonSpeed, fmt.Errorf("scrape %s (%s): %w", t.Name, t.URL, err)
		}
	}
	if err == nil {
		err = c.ingest(start, t, fams, info.samples, info.dialect(), false)
		reason = "" // ingest counts its own errors
	}
	switch {
	case err == nil, errors.Is(err, errGone):
		return
	case ctx.Err() != nil:
		return // shutting down: not the target's fault
	}
	if reason != "" {
		c.countError(t.Name, reason)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ts := c.mu.targets[t.Name]
	if ts == nil {
		return
	}
	if !ts.failing {
		ts.failing = true
		c.log.Warn("scrape failed; keeping the last good data until it is stale", "target", t.Name, "url", t.URL, "err", err)
	} else {
		c.log.Debug("scrape failed", "target", t.Name, "url", t.URL, "err", err)
	}
}

// scrape GETs a target's metrics and parses the families the collector reads. reason
// classifies an error for basin_scrape_errors_total.
func (c *Collector) scrape(ctx context.Context, t Target, raw, kept *bytes.Buffer) (
	fams map[string]*dto.MetricFamily, info scanInfo, reason string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, t.URL, nil)
	if err != nil {
		return nil, info, reasonRequest, fmt.Errorf("scrape %s: %w", t.Name, err)
	}
	req.Header.Set("Accept", acceptHeader)
	req.Header.Set("User-Agent", "basin-collector")
	req.Header.Set("X-Prometheus-Scrape-Timeout-Seconds", strconv.FormatFloat(c.opts.Timeout.Seconds(), 'f', -1, 64))
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return nil, info, classify(err, reasonRequest), fmt.Errorf("scrape %s (%s): %w", t.Name, t.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, info, reasonStatus, fmt.Errorf("scrape %s (%s): unexpected status %s", t.Name, t.URL, resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !isText(ct) {
		return nil, info, reasonContentType, fmt.Errorf(
			"scrape %s (%s): content type %q is not the text exposition format (asked for %s)", t.Name, t.URL, ct, acceptHeader)
	}
	limit := c.opts.MaxBodyBytes
	if resp.ContentLength > limit {
		return nil, info, reasonTooLarge, fmt.Errorf("scrape %s (%s): body of %d bytes exceeds the limit of %d bytes",
			t.Name, t.URL, resp.ContentLength, limit)
	}
	n, err := raw.ReadFrom(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, info, classify(err, reasonRead), fmt.Errorf("scrape %s (%s): read body: %w", t.Name, t.URL, err)
	}
	if n > limit {
		return nil, info, reasonTooLarge, fmt.Errorf("scrape %s (%s): body exceeds the limit of %d bytes", t.Name, t.URL, limit)
	}
	fams, info, err = parseScrape(raw.Bytes(), kept)
	if err != nil {
		return nil, info, reasonParse, fmt.Errorf("scrape %s (%s): parse: %w", t.Name, t.URL, err)
	}
	return fams, info, "", nil
}

func classify(err error, otherwise string) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return reasonTimeout
	}
	return otherwise
}

// isText accepts text/plain (any version) and a missing content type, as Prometheus does.
func isText(contentType string) bool {
	if contentType == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "text/plain"
}

// reloadTargetFile re-reads the target file when its modification time or size changed. A file
// that cannot be read or is invalid keeps the previous list; the problem is counted and logged
// once.
func (c *Collector) reloadTargetFile() {
	path := c.opts.TargetFile
	if path == "" {
		return
	}
	stamp, err := statTargetFile(path)
	c.mu.Lock()
	unchanged := err == nil && stamp.same(c.mu.fileStamp)
	c.mu.Unlock()
	if unchanged {
		return
	}
	var file []Target
	if err == nil {
		file, err = loadTargetFile(path)
	}
	if err == nil {
		err = conflicts(c.opts.Targets, file)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if problem := err.Error(); problem != c.mu.fileProblem || !stamp.same(c.mu.fileStamp) {
			c.mu.fileProblem = problem
			c.mu.fileStamp = stamp
			c.metrics.fileErrors.Inc()
			c.log.Error("target file rejected; keeping the previous targets", "file", path, "err", err)
		}
		return
	}
	c.mu.fileStamp, c.mu.fileProblem = stamp, ""
	c.mu.file = file
	c.setTargetsLocked()
}

func (a fileStamp) same(b fileStamp) bool { return a.size == b.size && a.mod.Equal(b.mod) }
