package gateway

import (
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"time"
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

// apiError is an OpenAI-style error body.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

type errorBody struct {
	Error apiError `json:"error"`
}

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
	e := apiError{Message: r.message, Type: r.typ, Code: r.reason}
	if r.param != "" {
		e.Param = &r.param
	}
	writeJSON(w, r.status, errorBody{Error: e})
}

// retryAfterSeconds is a Retry-After value: whole seconds, rounded up, at least 1.
func retryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(d.Seconds()))), 10)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"encoding the response failed","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
