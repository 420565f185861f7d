// Package hook is the mechanics basin shares to hand a decision to an operator's own switch: a
// JSON POST to their endpoint with a bearer token read from a rotating file, or a command run
// without a shell with the decision on stdin. The lender's and the scaler's http and exec backends
// use it, so both bound their calls, redact URLs and quote error bodies and stderr the same way;
// what they send, and the config keys that name it, stay theirs.
package hook

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
)

// MaxSnippet bounds how much of an error response's body goes into an error: enough for a JSON
// error message, not enough to flood a log with an HTML error page.
const MaxSnippet = 512

// CheckURL accepts absolute http and https URLs. purpose completes the message for an empty URL
// ("required, " + purpose), e.g. "where to POST the decision". Errors quote the URL without its
// password and never name a config key: the caller prefixes its own.
func CheckURL(s, purpose string) error {
	if s == "" {
		return errors.New("required, " + purpose)
	}
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%s: want an http or https URL", u.Redacted())
	}
	if u.Host == "" {
		return fmt.Errorf("%s: no host", u.Redacted())
	}
	return nil
}

// Redact prints a URL without its password, for errors and logs.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// Snippet reads the start of an error body as one line of valid text (a character cut at the
// limit shows as �), as an error suffix ": text", or nothing when the body is empty.
func Snippet(r io.Reader) string {
	buf, _ := io.ReadAll(io.LimitReader(r, MaxSnippet+1))
	return SnippetOf(buf)
}

// SnippetOf is Snippet of a body already read.
func SnippetOf(buf []byte) string {
	more := len(buf) > MaxSnippet
	if more {
		buf = buf[:MaxSnippet]
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
