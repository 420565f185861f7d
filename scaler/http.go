package scaler

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/basin-dev/basin/internal/hook"
)

// HTTPBackend POSTs each request as JSON (Payload, PayloadVersion) to URL: how an operator plugs
// in their own way of adding instances (a cloud autoscaling group, a capacity broker, a
// deployment pipeline). The receiver must treat a repeated request as a no-op — the caller sends
// its desired state every time it acts, mostly unchanged — and may drop one whose seq is below
// the last it applied. A 2xx status means accepted.
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
func (b *HTTPBackend) Apply(ctx context.Context, r Request) error {
	where := hook.Redact(b.URL)
	if err := r.Validate(); err != nil {
		return fmt.Errorf("http %s: %w", where, err)
	}
	body, err := MarshalPayload(r)
	if err != nil {
		return fmt.Errorf("http %s: encode scale request: %w", where, err)
	}
	return hook.Post{
		URL:       b.URL,
		TokenFile: b.TokenFile,
		Timeout:   orDefault(b.Timeout, DefaultHTTPTimeout),
		UserAgent: "basin-scaler",
		What:      "scale request",
		Client:    b.Client,
	}.Do(ctx, body)
}

// Current implements Backend: a webhook only receives, so the engines' metrics say what runs.
func (*HTTPBackend) Current(_ context.Context, role Role) (Count, bool, error) {
	return Count{}, false, checkRole(KindHTTP, role)
}
