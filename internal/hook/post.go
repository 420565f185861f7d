package hook

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/basin-dev/basin/internal/secret"
)

// drainBytes is how much of a body Drain reads before closing, so that the connection can be
// reused; chosen: more than any answer an admin endpoint sends, little enough that a huge body
// costs nothing.
const drainBytes = 64 << 10

// Post is one JSON POST to an operator's endpoint.
type Post struct {
	// URL receives the body.
	URL string
	// TokenFile, when set, holds a bearer token sent as Authorization: Bearer; it is read at each
	// call (so it can be rotated without a restart) and never logged or quoted in errors.
	TokenFile string
	// Timeout bounds the call; the caller resolves its own default, zero means none beyond ctx's.
	Timeout time.Duration
	// UserAgent names the caller to the receiver, e.g. "basin-lender".
	UserAgent string
	// What names the body in errors: "POST decision: 503 Service Unavailable".
	What string
	// Client sends the request; nil uses NoRedirects().
	Client *http.Client
}

// Do POSTs body as application/json. A 2xx status is success; any other is an error with the
// status and the start of the body. Redirects are not followed (with the default client): a POST
// silently turned into a GET, or a token sent on to another host, would be worse than an error.
func (p Post) Do(ctx context.Context, body []byte) error {
	where := Redact(p.URL)
	if p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("http %s: %w", where, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if p.UserAgent != "" {
		req.Header.Set("User-Agent", p.UserAgent)
	}
	if err := SetBearer(req.Header, p.TokenFile); err != nil {
		return fmt.Errorf("http %s: %w", where, err)
	}
	client := p.Client
	if client == nil {
		client = NoRedirects()
	}
	resp, err := client.Do(req)
	if err != nil {
		// net/http's error names the URL with its password removed.
		return fmt.Errorf("http: POST %s: %w", p.What, err)
	}
	defer Drain(resp.Body)
	if resp.StatusCode/100 == 2 {
		return nil
	}
	return fmt.Errorf("http %s: POST %s: %s%s", where, p.What, resp.Status, Snippet(resp.Body))
}

// SetBearer sets Authorization: Bearer from the token in tokenFile, read now: a projected or
// rotated token is picked up at the next call without a restart. An empty tokenFile sets
// nothing. Errors name the file, never the token.
func SetBearer(h http.Header, tokenFile string) error {
	if tokenFile == "" {
		return nil
	}
	tok, err := secret.File(tokenFile)
	if err != nil {
		return fmt.Errorf("bearer token: %w", err)
	}
	h.Set("Authorization", "Bearer "+tok)
	return nil
}

// NoRedirects is a client that returns a redirect as the answer instead of following it.
func NoRedirects() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// Drain reads a little of a response body, so the connection can be reused, then closes it.
func Drain(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, drainBytes))
	_ = body.Close()
}
