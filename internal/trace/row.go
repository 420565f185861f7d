package trace

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// Row is one call placed in its session: everything one line of a basin trace says. WriteBasin
// writes whole sessions as Rows; a recorder that learns of calls one at a time, as they finish
// (the gateway), writes each with WriteRow or a Recorder, so both produce the same lines.
type Row struct {
	// SessionID names the session; Index is the call's 0-based place in it.
	SessionID string
	Index     int
	// Tenant and TaskChars describe the session, as in Session.
	Tenant    string
	TaskChars int
	// Call is the call itself.
	Call Call
	// DefaultReuse leaves reused_tokens out of the row, so that readers apply the format's
	// default (the previous call's prompt plus output, what an agent resending its history
	// reuses). It is for writers that see token counts but not prefixes, as the gateway does;
	// Call.Reused is then ignored.
	DefaultReuse bool
}

// rowOut is one line of a basin trace as written, fields in FORMAT.md's order: every field
// explicit (end only when known, reused_tokens unless the row asks for the default), so a reader
// needs no other defaults and a person reading the file sees what the simulator will use.
type rowOut struct {
	SessionID    string      `json:"session_id"`
	Call         int         `json:"call"`
	Start        string      `json:"start"`
	End          string      `json:"end,omitempty"`
	PromptTokens int         `json:"prompt_tokens"`
	ReusedTokens *int        `json:"reused_tokens,omitempty"`
	OutputTokens int         `json:"output_tokens"`
	GapBeforeS   json.Number `json:"gap_before_s"`
	Turn         string      `json:"turn"`
	Tenant       string      `json:"tenant"`
	TaskChars    int         `json:"task_chars"`
}

// out is the row as written: timestamps in UTC with as many fractional digits as needed, the gap
// in exact decimal seconds, the turn spelt out.
func (r Row) out() rowOut {
	c := r.Call
	o := rowOut{
		SessionID:    r.SessionID,
		Call:         r.Index,
		Start:        formatTime(c.Start),
		PromptTokens: c.Prompt,
		OutputTokens: c.Output,
		GapBeforeS:   json.Number(formatSeconds(c.GapBefore)),
		Turn:         turnTool,
		Tenant:       r.Tenant,
		TaskChars:    r.TaskChars,
	}
	if !r.DefaultReuse {
		o.ReusedTokens = &c.Reused
	}
	if !c.End.IsZero() {
		o.End = formatTime(c.End)
	}
	switch {
	case r.Index == 0:
		o.Turn = turnFirst
	case c.Human:
		o.Turn = turnHuman
	}
	return o
}

// newRowEncoder is the JSON encoder of every writer of the format. HTML escaping is off because a
// trace is not HTML: IDs and tenants stay readable.
func newRowEncoder(w io.Writer) *json.Encoder {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc
}

// checkRow holds a row to the rules of the basin format, naming the session, call and field at
// fault. A row checked here reads back with ReadBasin.
func checkRow(r Row) error {
	switch {
	case r.SessionID == "":
		return fmt.Errorf("call %d: session_id: must not be empty", r.Index)
	case checkName(r.SessionID) != nil:
		return fmt.Errorf("call %d: session_id: %w", r.Index, checkName(r.SessionID))
	case r.Index < 0:
		return fmt.Errorf("session %q: call: must be >= 0, got %d", r.SessionID, r.Index)
	case checkName(r.Tenant) != nil:
		return fmt.Errorf("session %q call %d: tenant: %w", r.SessionID, r.Index, checkName(r.Tenant))
	case r.TaskChars < 0:
		return fmt.Errorf("session %q call %d: task_chars: must be >= 0, got %d", r.SessionID, r.Index, r.TaskChars)
	}
	c := r.Call
	if r.DefaultReuse {
		c.Reused = 0 // not written, so not checked
	}
	if field, err := checkCall(r.Index, c); err != nil {
		return fmt.Errorf("session %q call %d: %s: %w", r.SessionID, r.Index, field, err)
	}
	return nil
}

// WriteRow writes one row of a basin trace, with its line ending, in a single Write, so that a
// writer appending rows from several goroutines under a lock never leaves half a line. A row that
// breaks the format's rules writes nothing. Rows written one by one must still make up sessions
// whose calls run 0, 1, 2, …; that is the caller's to keep.
func WriteRow(w io.Writer, r Row) error {
	if err := checkRow(r); err != nil {
		return fmt.Errorf("write trace row: %w", err)
	}
	var buf bytes.Buffer
	if err := newRowEncoder(&buf).Encode(r.out()); err != nil {
		return fmt.Errorf("write trace row: session %q call %d: %w", r.SessionID, r.Index, err)
	}
	if _, err := w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("write trace row: %w", err)
	}
	return nil
}
