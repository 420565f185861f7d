package gateway

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// recorder appends one row per finished call to a trace in basin's format (internal/trace/FORMAT.md).
// It never writes a raw session id, tenant or any text: ids and tenants are the first 16 hex
// digits of SHA-256 over a random salt drawn when the file is opened, so rows of one session
// group together while the id cannot be looked up. A session gets a fresh trace id each time it
// is admitted (the hash also covers a sequence number), so an id reused after its session ended,
// or a session that outlives a restart, starts a new trace session at call 0 rather than
// breaking the call numbering.
type recorder struct {
	salt [16]byte
	mu   struct {
		sync.Mutex
		f      *os.File
		seq    uint64
		closed bool
	}
}

func openRecorder(path string) (*recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	r := &recorder{}
	if _, err := rand.Read(r.salt[:]); err != nil {
		f.Close()
		return nil, fmt.Errorf("salt: %w", err)
	}
	r.mu.f = f
	return r, nil
}

func (r *recorder) hash(parts ...string) string {
	h := sha256.New()
	h.Write(r.salt[:])
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// sessionID is the trace id of a newly admitted session.
func (r *recorder) sessionID(id string) string {
	r.mu.Lock()
	r.mu.seq++
	seq := r.mu.seq
	r.mu.Unlock()
	return r.hash(id, strconv.FormatUint(seq, 10))
}

// tenant is the trace name of a tenant ("" stays "").
func (r *recorder) tenant(t string) string {
	if t == "" {
		return ""
	}
	return r.hash("tenant", t)
}

// traceRow is one row, fields in FORMAT.md's order. reused_tokens is left out: the reader's
// default (the previous prompt plus output) is what an agent resending its history reuses.
type traceRow struct {
	SessionID    string      `json:"session_id"`
	Call         int         `json:"call"`
	Start        string      `json:"start"`
	End          string      `json:"end"`
	PromptTokens int64       `json:"prompt_tokens"`
	OutputTokens int64       `json:"output_tokens"`
	GapBeforeS   json.Number `json:"gap_before_s"`
	Turn         string      `json:"turn"`
	Tenant       string      `json:"tenant,omitempty"`
	TaskChars    int         `json:"task_chars"`
}

// record writes the row of a finished call. start is when the call reached the gateway (queueing
// included), so a replay sees the demand as the clients made it.
func (r *recorder) record(si *sessionInfo, c *call, index int, gap time.Duration, end time.Time, prompt, output int64) error {
	turn := "first"
	if index > 0 {
		turn = "tool"
		if c.req.lastRole == "user" {
			turn = "human" // the conversation ends with a person's message, not a tool result
		}
	} else {
		gap = 0
	}
	if end.Before(c.arrival) {
		end = c.arrival
	}
	row := traceRow{SessionID: si.traceID, Call: index, Start: formatTime(c.arrival), End: formatTime(end),
		PromptTokens: max(1, prompt), OutputTokens: max(0, output), GapBeforeS: json.Number(formatSeconds(gap)),
		Turn: turn, Tenant: si.traceTenant, TaskChars: max(0, si.taskChars)}
	line, err := json.Marshal(row)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.closed {
		return errors.New("record: trace already closed")
	}
	_, err = r.mu.f.Write(append(line, '\n'))
	return err
}

func (r *recorder) close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.closed {
		return nil
	}
	r.mu.closed = true
	return r.mu.f.Close()
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// formatSeconds writes d as exact decimal seconds ("19.291"), as the trace format asks.
func formatSeconds(d time.Duration) string {
	s := strconv.FormatInt(int64(d/time.Second), 10)
	if frac := d % time.Second; frac != 0 {
		s += strings.TrimRight(fmt.Sprintf(".%09d", int64(frac)), "0")
	}
	return s
}
