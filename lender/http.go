package lender

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/basin-dev/basin/internal/secret"
)

// maxSnippet bounds how much of an error response's body goes into the error: enough for a JSON
// error message, not enough to flood a log with an HTML error page.
const maxSnippet = 512

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
	where := redact(b.URL)
	body, err := MarshalPayload(d)
	if err != nil {
		return fmt.Errorf("http %s: encode decision: %w", where, err)
	}
	ctx, cancel := context.WithTimeout(ctx, orDefault(b.Timeout, DefaultHTTPTimeout))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.URL, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("http %s: %w", where, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "basin-lender")
	if b.TokenFile != "" {
		tok, err := secret.File(b.TokenFile)
		if err != nil {
			return fmt.Errorf("http %s: bearer token: %w", where, err)
		}
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	client := b.Client
	if client == nil {
		client = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	resp, err := client.Do(req)
	if err != nil {
		// net/http's error names the URL with its password removed.
		return fmt.Errorf("http: POST decision: %w", err)
	}
	defer func() {
		// Drain a little so the connection can be reused, then close.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
	}()
	if resp.StatusCode/100 == 2 {
		return nil
	}
	return fmt.Errorf("http %s: POST decision: %s%s", where, resp.Status, snippet(resp.Body))
}

// snippet reads the start of an error body as one line of valid text (a character cut at the
// limit shows as �), or nothing.
func snippet(r io.Reader) string {
	buf, _ := io.ReadAll(io.LimitReader(r, maxSnippet+1))
	more := len(buf) > maxSnippet
	if more {
		buf = buf[:maxSnippet]
	}
	s := strings.Join(strings.Fields(strings.ToValidUTF8(string(buf), "�")), " ")
	if s == "" {
		return ""
	}
	if more {
		s += " …"
	}
	return ": " + s
}

// redact prints a URL without its password, for errors.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
