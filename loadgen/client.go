package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/basin-dev/basin/internal/agentcall"
)

const (
	// maxErrorBody is how much of a refusal's or error's body is read for its message.
	maxErrorBody = 4 << 10
	// maxResponseBody bounds a non-streamed answer and each line of a stream.
	maxResponseBody = 16 << 20
)

// chatRequest is the body of a chat completion.
type chatRequest struct {
	Model         string         `json:"model"`
	Messages      []message      `json:"messages"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
	IgnoreEOS     bool           `json:"ignore_eos,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// usage is the part of OpenAI's usage block the report reads.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// answer is a chat completion or one chunk of a stream, as far as the report reads it.
type answer struct {
	Choices []struct {
		Message *struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// verdict is what a response means for the session.
type verdict int

const (
	vOK     verdict = iota
	vDefer          // 503, 429: wait Retry-After and retry
	vReject         // 429 with Reject429Terminal
	vShed           // 529
	vError          // anything else
)

// attempt is one HTTP exchange of a call.
type attempt struct {
	verdict    verdict
	status     int           // 0 on a transport error
	retryAfter time.Duration // for vDefer
	content    string        // the assistant's text
	usage      *usage
	first      time.Time // wall time of the first answer token; zero if none
	err        error     // why, for everything but vOK
}

// send makes one HTTP exchange: the request, and for a 200 the whole answer.
func (r *runner) send(ctx context.Context, sessionID string, last bool, body []byte) attempt {
	o := &r.o
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.Target+o.API.Path(), bytes.NewReader(body))
	if err != nil {
		return attempt{verdict: vError, err: fmt.Errorf("build request: %w", err)}
	}
	req.Header.Set("Content-Type", "application/json")
	if !o.NoStream {
		req.Header.Set("Accept", "text/event-stream")
	}
	req.Header.Set(o.SessionHeader, sessionID)
	if last {
		req.Header.Set("x-session-end", "true")
	}
	if o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+o.APIKey)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return attempt{verdict: vError, err: fmt.Errorf("send: %w", err)}
	}
	defer resp.Body.Close()
	a := attempt{status: resp.StatusCode}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		a.verdict, a.err = vDefer, statusError(resp)
		if resp.StatusCode == http.StatusTooManyRequests && o.Reject429Terminal {
			a.verdict = vReject
		}
		ra, ok := parseRetryAfter(resp.Header.Get("Retry-After"), o.Now())
		if !ok {
			ra = DefaultRetryAfter
		}
		a.retryAfter = ra
		return a
	case 529:
		a.verdict, a.err = vShed, statusError(resp)
		return a
	default:
		a.verdict, a.err = vError, statusError(resp)
		return a
	}
	switch {
	case o.API != agentcall.Chat && o.NoStream:
		err = r.readShapeAnswer(resp.Body, &a)
	case o.API != agentcall.Chat:
		err = r.readShapeStream(resp.Body, &a)
	case o.NoStream:
		err = r.readAnswer(resp.Body, &a)
	default:
		err = r.readStream(resp.Body, &a)
	}
	if err != nil {
		a.verdict, a.err = vError, err
	}
	return a
}

// decodeAnswer reads a whole answer body, at most maxResponseBody bytes, into v.
func decodeAnswer(body io.Reader, v any) error {
	b, err := io.ReadAll(io.LimitReader(body, maxResponseBody+1))
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if len(b) > maxResponseBody {
		return fmt.Errorf("read answer: larger than %d bytes", maxResponseBody)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}

// readAnswer reads a non-streamed completion. Its first token is only known as the answer's
// arrival: the response headers come with the whole answer.
func (r *runner) readAnswer(body io.Reader, a *attempt) error {
	a.first = r.o.Now()
	var ans answer
	if err := decodeAnswer(body, &ans); err != nil {
		return err
	}
	if ans.Error != nil {
		return fmt.Errorf("answer: error: %s", ans.Error.Message)
	}
	if len(ans.Choices) == 0 || ans.Choices[0].Message == nil {
		return errors.New("decode answer: no choices[0].message")
	}
	a.content, a.usage = ans.Choices[0].Message.Content, ans.Usage
	return nil
}

// readStream reads server-sent events up to data: [DONE]: the content deltas make the answer, the
// chunk with usage gives the counts, and an error event (as OpenAI sends once a stream has begun)
// fails the call. Events are taken one data line each, as OpenAI-compatible servers send them.
func (r *runner) readStream(body io.Reader, a *attempt) error {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), maxResponseBody)
	var content strings.Builder
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // blank separators, comments, event: and id: lines
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			a.content = content.String()
			return nil
		}
		var ch answer
		if err := json.Unmarshal(data, &ch); err != nil {
			return fmt.Errorf("decode stream chunk: %w", err)
		}
		if ch.Error != nil {
			return fmt.Errorf("stream: error: %s", ch.Error.Message)
		}
		for _, c := range ch.Choices {
			if c.Delta != nil && c.Delta.Content != "" {
				if a.first.IsZero() {
					a.first = r.o.Now()
				}
				content.WriteString(c.Delta.Content)
			}
		}
		if ch.Usage != nil {
			a.usage = ch.Usage
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read stream: %w", err)
	}
	return errors.New("read stream: ended before data: [DONE]")
}

// statusError describes a refusal or failure by its status and the body's message.
func statusError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	msg := strings.TrimSpace(string(b))
	var e answer
	if json.Unmarshal(b, &e) == nil && e.Error != nil && e.Error.Message != "" {
		msg = e.Error.Message
	}
	if msg == "" {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return fmt.Errorf("status %d: %s", resp.StatusCode, msg)
}

// parseRetryAfter reads Retry-After: delay seconds (decimals accepted) or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if !(s >= 0) || s > math.MaxInt64/float64(time.Second) {
			return 0, false
		}
		return seconds(s), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now)), true
	}
	return 0, false
}
