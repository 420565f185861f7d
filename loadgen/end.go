package loadgen

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"time"
)

// Ending sessions.
//
// A session the server admitted holds its budget there until it ends. A completed session ends
// with its last call (x-session-end: true); any other one — failed on an upstream error, killed,
// refused after a retry, cut by a cancelled run — would hold it until the server's idle timeout
// (ten minutes at the gateway by default), and a run that leaves a hundred of them behind hands
// the next run, and the detector, a working set of sessions nobody calls. So every session that
// sent a call and did not complete is ended with POST {target}/v1/sessions/{id}/end when it stops,
// whatever stopped it, on a context of its own (the run's may be done) bounded by EndTimeout.
// A server that cannot be reached then (a gateway restarting) is asked again every EndRetryEvery
// while the run lasts, and once more as the run ends; what still fails is counted and named in the
// report (Report.SessionEnds) and logged.

const (
	// EndTimeout bounds one end request. It is longer than the gateway's own wait on its upstream
	// when it passes the end on (10 s by default), so that a slow engine does not read as a gateway
	// that did not answer.
	EndTimeout = 15 * time.Second
	// EndRetryEvery is how often ends that found no server are tried again while the run lasts.
	EndRetryEvery = 2 * time.Second
	// maxFailedIDs is how many of the sessions that could not be ended the report names.
	maxFailedIDs = 20
	// finalEndsInFlight bounds the concurrent end requests of the run's last attempt.
	finalEndsInFlight = 32
)

// SessionEnds counts the sessions Run ended at the server because they did not end with their
// last call.
type SessionEnds struct {
	// Asked is how many sessions were to be ended: each that sent a call and did not complete.
	Asked int `json:"asked"`
	// Ended is how many the server ended (2xx).
	Ended int `json:"ended"`
	// NotLive is how many it held nothing for: 404 (refused before admission, or ended by the
	// server itself, as the gateway ends a session whose first call failed), or 405/501 from a
	// server without the endpoint (a bare engine keeps no session).
	NotLive int `json:"not_live"`
	// Failed is how many could not be ended: the server did not answer until the run ended, or
	// refused the request. They hold their budget there until its idle timeout.
	Failed int `json:"failed"`
	// FailedIDs names up to 20 of them.
	FailedIDs []string `json:"failed_ids,omitempty"`
	// LastError is why the last of them failed.
	LastError string `json:"last_error,omitempty"`
}

// endVerdict is what one end request came to.
type endVerdict int

const (
	endDone    endVerdict = iota // 2xx
	endNotLive                   // 404, 405, 501
	endRefused                   // another 4xx: asking again will not help
	endRetry                     // no answer or a 5xx: ask again later
)

// ender ends the sessions of a run that did not end with their last call.
type ender struct {
	r    *runner
	kick chan struct{} // a pending end was added

	mu struct {
		sync.Mutex
		ends    SessionEnds
		pending map[string]struct{} // ids whose end found no server yet
		lastErr error
		warned  bool
	}
}

func newEnder(r *runner) *ender {
	e := &ender{r: r, kick: make(chan struct{}, 1)}
	e.mu.pending = map[string]struct{}{}
	return e
}

// end ends a session that stopped without completing, once, on a context of its own bounded by
// EndTimeout: ctx may be done (a killed session, a cancelled run). An end that finds no server is
// left to retry and final.
func (e *ender) end(ctx context.Context, id string) {
	e.mu.Lock()
	e.mu.ends.Asked++
	e.mu.Unlock()
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), EndTimeout)
	defer cancel()
	v, err := e.r.sendEnd(actx, id)
	e.book(id, v, err)
}

// book records an end's verdict; a retry leaves it pending.
func (e *ender) book(id string, v endVerdict, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch v {
	case endDone:
		e.mu.ends.Ended++
		delete(e.mu.pending, id)
	case endNotLive:
		e.mu.ends.NotLive++
		delete(e.mu.pending, id)
	case endRefused:
		e.failLocked(id, err)
		delete(e.mu.pending, id)
		e.r.o.Logger.Warn("ending a session: refused; it stays live at the server until its idle timeout",
			"session", id, "err", err)
	case endRetry:
		e.mu.lastErr = err
		if _, ok := e.mu.pending[id]; ok {
			return
		}
		e.mu.pending[id] = struct{}{}
		if !e.mu.warned {
			e.mu.warned = true
			e.r.o.Logger.Warn("ending a session: no answer from the server; asking again while the run lasts",
				"session", id, "every", EndRetryEvery, "err", err)
		}
		select {
		case e.kick <- struct{}{}:
		default:
		}
	}
}

func (e *ender) failLocked(id string, err error) {
	e.mu.ends.Failed++
	if len(e.mu.ends.FailedIDs) < maxFailedIDs {
		e.mu.ends.FailedIDs = append(e.mu.ends.FailedIDs, id)
	}
	if err != nil {
		e.mu.ends.LastError = err.Error()
	}
}

// takePending is the pending ids, sorted.
func (e *ender) takePending() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids := make([]string, 0, len(e.mu.pending))
	for id := range e.mu.pending {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// retry asks again, every EndRetryEvery, for the ends that found no server, until ctx is done
// (the run's end or its cancellation): a gateway back from a crash frees what the failed sessions
// held at once instead of at its idle timeout.
func (e *ender) retry(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.kick:
		}
		for {
			ids := e.takePending()
			if len(ids) == 0 {
				break
			}
			if e.r.o.Sleep(ctx, EndRetryEvery) != nil || ctx.Err() != nil {
				return
			}
			for _, id := range ids {
				actx, cancel := context.WithTimeout(ctx, EndTimeout)
				v, err := e.r.sendEnd(actx, id)
				cancel()
				if ctx.Err() != nil {
					return // cut by the run's end, not the server's answer: final asks again
				}
				e.book(id, v, err)
			}
		}
	}
}

// final asks once more, at once and concurrently, for every end still pending, on a context of
// its own bounded by EndTimeout; what still finds no server is counted failed, and logged.
func (e *ender) final(ctx context.Context) SessionEnds {
	ids := e.takePending()
	if len(ids) > 0 {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), EndTimeout)
		sem := make(chan struct{}, finalEndsInFlight)
		var wg sync.WaitGroup
		for _, id := range ids {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				v, err := e.r.sendEnd(actx, id)
				e.book(id, v, err)
			})
		}
		wg.Wait()
		cancel()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	left := make([]string, 0, len(e.mu.pending))
	for id := range e.mu.pending {
		left = append(left, id)
	}
	slices.Sort(left)
	for _, id := range left {
		e.failLocked(id, e.mu.lastErr)
	}
	clear(e.mu.pending)
	ends := e.mu.ends
	ends.FailedIDs = slices.Clone(ends.FailedIDs)
	if ends.Failed > 0 {
		e.r.o.Logger.Warn("sessions not ended: they stay live at the server until its idle timeout",
			"count", ends.Failed, "of", ends.Asked, "ids", ends.FailedIDs, "err", ends.LastError)
	}
	return ends
}

// sendEnd asks the server to end a session: POST {target}/v1/sessions/{id}/end, with the
// session's header and the API key as on its calls (the gateway passes both on to the engine).
func (r *runner) sendEnd(ctx context.Context, id string) (endVerdict, error) {
	o := &r.o
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.Target+"/v1/sessions/"+url.PathEscape(id)+"/end", nil)
	if err != nil {
		return endRefused, fmt.Errorf("end session %s: build request: %w", id, err)
	}
	req.Header.Set(o.SessionHeader, id)
	if o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.APIKey)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return endRetry, fmt.Errorf("end session %s: %w", id, err)
	}
	defer resp.Body.Close()
	switch c := resp.StatusCode; {
	case c >= 200 && c < 300:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return endDone, nil
	case c == http.StatusNotFound, c == http.StatusMethodNotAllowed, c == http.StatusNotImplemented:
		return endNotLive, nil
	case c >= 500:
		return endRetry, fmt.Errorf("end session %s: %w", id, statusError(resp))
	default:
		return endRefused, fmt.Errorf("end session %s: %w", id, statusError(resp))
	}
}
