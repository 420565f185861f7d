package lender

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/basin-dev/basin/internal/hook"
)

// HTTPBackend POSTs each decision as JSON (Payload, PayloadVersion) to URL. It is how an operator
// plugs in their own lending switch: SGLang has no public API to lend decode KV to prefill, so the
// receiver decides what a decision means on their engine — for example flipping a blue/green
// switch between a launch config with decode's radix cache on and one without, or resizing a pool
// on an engine fork that supports it. The receiver must treat a repeated decision as a no-op
// (Changed says whether the switch just toggled); a 2xx status means applied.
//
// Redirects are not followed: a POST silently turned into a GET, or a token sent on to another
// host, would be worse than an error.
type HTTPBackend struct {
	URL string
	// TokenFile, when set, holds a bearer token sent as Authorization: Bearer; it is read at each
	// apply (so it can be rotated) and never logged or quoted in errors.
	TokenFile string
	// Timeout bounds one POST (DefaultHTTPTimeout when 0).
	Timeout time.Duration
	// Client sends the request; nil uses one that does not follow redirects.
	Client *http.Client
}

// Name implements Backend.
func (*HTTPBackend) Name() string { return KindHTTP }

// Apply implements Backend. A non-2xx answer is an error with the status and the start of the
// body.
func (b *HTTPBackend) Apply(ctx context.Context, d Decision) error {
	body, err := MarshalPayload(d)
	if err != nil {
		return fmt.Errorf("http %s: encode decision: %w", hook.Redact(b.URL), err)
	}
	return hook.Post{
		URL:       b.URL,
		TokenFile: b.TokenFile,
		Timeout:   orDefault(b.Timeout, DefaultHTTPTimeout),
		UserAgent: "basin-lender",
		What:      "decision",
		Client:    b.Client,
	}.Do(ctx, body)
}
