package gateway

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/basin-dev/basin/internal/httpjson"
)

// Refusal reasons, sent in the x-basin-reason header and as the error code.
const (
	reasonQueueTimeout    = "queue_timeout"
	reasonTenantQuota     = "tenant_quota"
	reasonShed            = "shed"
	reasonShuttingDown    = "shutting_down"
	reasonNoSession       = "no_session_id"
	reasonBodyTooLarge    = "body_too_large"
	reasonBadRequest      = "invalid_request"
	reasonUpstreamError   = "upstream_error"
	reasonUpstreamTimeout = "upstream_timeout"
)

// ReasonHeader carries the reason of every response the gateway makes itself.
const ReasonHeader = "x-basin-reason"

// refusal is an answer the gateway gives instead of the upstream.
type refusal struct {
	status     int
	reason     string
	typ        string // OpenAI error type
	param      string
	message    string
	retryAfter time.Duration // 0: no Retry-After
}

// refuse writes r and counts it.
func (g *Gateway) refuse(w http.ResponseWriter, r refusal) {
	g.metrics.refusals.WithLabelValues(strconv.Itoa(r.status), r.reason).Inc()
	g.log.Debug("call refused", "status", r.status, "reason", r.reason, "retry_after", r.retryAfter)
	if r.retryAfter > 0 {
		w.Header().Set("Retry-After", retryAfterSeconds(r.retryAfter))
	}
	w.Header().Set(ReasonHeader, r.reason)
	httpjson.WriteError(w, r.status, r.typ, r.reason, r.param, r.message)
}

// retryAfterSeconds is a Retry-After value: whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(d.Seconds()))), 10)
}
