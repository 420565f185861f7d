package remediate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Phase is where an action stands in the audit log.
type Phase string

// Phases. An action is recorded as an intent before it is taken, then as done or failed; a dry
// run records what it would have done.
const (
	PhaseIntent Phase = "intent"
	PhaseDone   Phase = "done"
	PhaseFailed Phase = "failed"
	PhaseDryRun Phase = "dry_run"
	// PhaseNote records an operator action or a state change, not a remediation (a pause).
	PhaseNote Phase = "note"
)

// Record is one line of the audit log.
type Record struct {
	// Seq is the plan's sequence number: an intent and its outcome share it.
	Seq     uint64        `json:"seq"`
	At      time.Time     `json:"at"`
	Kind    string        `json:"kind"` // budget, shed, lending, pause, resume
	Phase   Phase         `json:"phase"`
	State   string        `json:"state,omitempty"`
	Mode    Mode          `json:"mode,omitempty"`
	Budget  *BudgetChange `json:"budget,omitempty"`
	Shed    *ShedAction   `json:"shed,omitempty"`
	Lending *LendingPlan  `json:"lending,omitempty"`
	Reasons []string      `json:"reasons,omitempty"`
	Error   string        `json:"error,omitempty"`
	// Reconciled marks an outcome found or completed after a restart.
	Reconciled bool `json:"reconciled,omitempty"`
}

// Change says what the record's action changes, in a few words: "budget 1.00M → 700K tokens",
// "lending on (decode-0 400K)", "shed [s1]"; empty for a note.
func (r Record) Change() string {
	switch {
	case r.Budget != nil && r.Budget.FromCountOnly:
		return fmt.Sprintf("budget count only → %s tokens", FormatTokens(r.Budget.To))
	case r.Budget != nil:
		return fmt.Sprintf("budget %s → %s tokens", FormatTokens(r.Budget.From), FormatTokens(r.Budget.To))
	case r.Shed != nil:
		return fmt.Sprintf("shed %v", r.Shed.IDs)
	case r.Lending != nil:
		on := "off"
		if r.Lending.Enabled {
			on = "on"
		}
		var grants []string
		for _, name := range slices.Sorted(maps.Keys(r.Lending.Grants)) {
			grants = append(grants, name+" "+FormatTokens(r.Lending.Grants[name]))
		}
		if len(grants) > 0 {
			return fmt.Sprintf("lending %s (%s)", on, strings.Join(grants, ", "))
		}
		return "lending " + on
	}
	return ""
}

// Audit is an append-only JSON Lines log of every action, written and synced before the action is
// taken: after a crash it says what was intended and what is known to have happened. It keeps the
// records in memory for the status API (the log of a daemon is small: one line per action).
type Audit struct {
	mu   sync.Mutex
	f    *os.File
	recs []Record
}

// NewMemoryAudit is an audit kept in memory only: for the simulator, where a run never restarts.
func NewMemoryAudit() *Audit { return &Audit{} }

// OpenAudit opens (creating it if needed) the log at path and reads its records. A last line cut
// short by a crash is reported in the returned warning and dropped; any other bad line is an error
// naming it, because the log is what prevents repeating an action.
func OpenAudit(path string) (a *Audit, warning string, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("audit log: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, "", fmt.Errorf("audit log %s: %w", path, err)
	}
	a = &Audit{f: f}
	good := 0
	lines := bytes.SplitAfter(data, []byte("\n"))
	for i, line := range lines {
		if len(bytes.TrimSpace(line)) == 0 {
			good += len(line)
			continue
		}
		var r Record
		if err := json.Unmarshal(line, &r); err != nil || r.Kind == "" {
			if i == len(lines)-1 && !bytes.HasSuffix(line, []byte("\n")) {
				warning = fmt.Sprintf("audit log %s: dropped a last line cut short (%d bytes), as a crash mid-write leaves it", path, len(line))
				break
			}
			if err == nil {
				err = errors.New("no kind")
			}
			return nil, "", fmt.Errorf("audit log %s: line %d: %w", path, i+1, err)
		}
		a.recs = append(a.recs, r)
		good += len(line)
	}
	if good < len(data) {
		if err := f.Truncate(int64(good)); err != nil {
			return nil, "", fmt.Errorf("audit log %s: %w", path, err)
		}
	}
	if _, err := f.Seek(int64(good), io.SeekStart); err != nil {
		return nil, "", fmt.Errorf("audit log %s: %w", path, err)
	}
	return a, warning, nil
}

// Append writes records and syncs them to disk before returning.
func (a *Audit) Append(recs ...Record) error {
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("audit record: %w", err)
		}
	}
	_ = w.Flush()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.f != nil {
		if _, err := a.f.Write(buf.Bytes()); err != nil {
			return fmt.Errorf("audit log: %w", err)
		}
		if err := a.f.Sync(); err != nil {
			return fmt.Errorf("audit log: %w", err)
		}
	}
	a.recs = append(a.recs, recs...)
	return nil
}

// Records returns a copy of the last n records (all with n ≤ 0), oldest first.
func (a *Audit) Records(n int) []Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	from := 0
	if n > 0 && len(a.recs) > n {
		from = len(a.recs) - n
	}
	return append([]Record(nil), a.recs[from:]...)
}

// Pending returns the intents with no outcome: actions a crash may have interrupted.
func (a *Audit) Pending() []Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	type key struct {
		seq  uint64
		kind string
	}
	open := map[key]int{}
	var order []key
	for i, r := range a.recs {
		k := key{r.Seq, r.Kind}
		switch r.Phase {
		case PhaseIntent:
			if _, ok := open[k]; !ok {
				order = append(order, k)
			}
			open[k] = i
		case PhaseDone, PhaseFailed:
			delete(open, k)
		}
	}
	var out []Record
	for _, k := range order {
		if i, ok := open[k]; ok {
			out = append(out, a.recs[i])
		}
	}
	return out
}

// Close closes the log file.
func (a *Audit) Close() error {
	if a.f == nil {
		return nil
	}
	return a.f.Close()
}
