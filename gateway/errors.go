package gateway

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/basin-dev/basin/internal/agentcall"
	"github.com/basin-dev/basin/internal/httpjson"
)

// Refusal reasons, sent in the x-basin-reason header and as the error code.
const (
	reasonQueueTimeout    = "queue_timeout"
	reasonTooLate         = "too_late"
	reasonTenantQuota     = "tenant_quota"
	reasonShed            = "shed"
	reasonShuttingDown    = "shutting_down"
	reasonDegraded        = "degraded"
	reasonStaleTerm       = "stale_daemon_term"
	reasonNoSession       = "no_session_id"
	reasonBodyTooLarge    = "body_too_large"
	reasonBadRequest      = "invalid_request"
	reasonUpstreamError   = "upstream_error"
	reasonUpstreamTimeout = "upstream_timeout"
)

// ReasonHeader carries the reason of every response the gateway makes itself.
const ReasonHeader = "x-basin-reason"

// ShouldRetryHeader is the header the OpenAI and Anthropic SDKs obey before their own retry
// rules: "false" stops their retries of a status they would otherwise retry (every 5xx, 529
// included), "true" asks for one.
const ShouldRetryHeader = "x-should-retry"

// MaxRetryAfter bounds the Retry-After of a refusal a retry can cure (a queue timeout, a tenant
// quota, a shutdown). The SDKs sleep for whatever Retry-After says, without a cap (openai@6 slept
// about 30 minutes on a Retry-After of 1792), and a queue's drain estimate can run that long; a
// client that asks again within a minute loses nothing, as a queued session id keeps its place.
const MaxRetryAfter = time.Minute

// refusal is an answer the gateway gives instead of the upstream.
type refusal struct {
	// api is the shape of the call refused: its errors are written in that API's format (zero:
	// OpenAI's).
	api        agentcall.Shape
	status     int
	reason     string
	typ        string // OpenAI error type
	param      string
	message    string
	retryAfter time.Duration // 0: no Retry-After
}

// retryable says what the SDKs should do with a refusal: "true" when asking again (after
// Retry-After) can succeed, "false" when it cannot — a shed session stays refused for the
// admission core's shed memory, and a bad request stays bad — and "" to leave the SDK's own rule
// (502, 504: the upstream's trouble, not the gateway's decision).
func (r refusal) retryable() string {
	switch r.reason {
	case reasonQueueTimeout, reasonTooLate, reasonTenantQuota, reasonShuttingDown, reasonDegraded:
		return "true"
	case reasonShed, reasonNoSession, reasonBodyTooLarge, reasonBadRequest:
		return "false"
	}
	return ""
}

// refuse writes r and counts it: in the error format of the call's API, with x-should-retry and,
// where a retry can succeed, Retry-After bounded by MaxRetryAfter and retry-after-ms, which the
// SDKs read first. Where a retry cannot succeed there is no Retry-After at all: some clients wait
// it out whatever x-should-retry says (Codex 0.171 slept through a shed session's Retry-After of
// 1697 s; Claude Code exited at once), so the time a refused session may return goes in the
// body's message, for the person reading it, instead.
func (g *Gateway) refuse(w http.ResponseWriter, r refusal) {
	g.metrics.refusals.WithLabelValues(strconv.Itoa(r.status), r.reason).Inc()
	retry := r.retryable()
	switch retry {
	case "true":
		r.retryAfter = min(r.retryAfter, MaxRetryAfter)
	case "false":
		if r.retryAfter > 0 {
			r.message += fmt.Sprintf(" This session id is refused for another %s.", r.retryAfter.Round(time.Second))
		}
		r.retryAfter = 0
	}
	g.log.Debug("call refused", "status", r.status, "reason", r.reason, "retry_after", r.retryAfter, "api", r.api)
	h := w.Header()
	if r.retryAfter > 0 {
		h.Set("Retry-After", retryAfterSeconds(r.retryAfter))
		h.Set("retry-after-ms", strconv.FormatInt(max(1, r.retryAfter.Milliseconds()), 10))
	}
	if retry != "" {
		h.Set(ShouldRetryHeader, retry)
	}
	h.Set(ReasonHeader, r.reason)
	if r.api == agentcall.Messages {
		httpjson.Write(w, r.status, anthropicError{Type: "error",
			Error: anthropicErrorDetail{Type: anthropicErrorType(r.status), Message: r.message}})
		return
	}
	httpjson.WriteError(w, r.status, r.typ, r.reason, r.param, r.message)
}

// anthropicError is the Anthropic Messages API's error body: {"type":"error","error":{"type",
// "message"}}. Its SDK builds its error from the status and shows error.message.
type anthropicError struct {
	Type  string               `json:"type"`
	Error anthropicErrorDetail `json:"error"`
}

type anthropicErrorDetail struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthropicErrorType is the Anthropic error type of a status, as that API documents them: 529
// and a 503 queue timeout are overloaded_error (the deployment is busy), 429 rate_limit_error.
func anthropicErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "invalid_request_error"
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	case http.StatusGatewayTimeout:
		return "timeout_error"
	}
	return "api_error"
}

// retryAfterSeconds is a Retry-After value: whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(d.Seconds()))), 10)
}
