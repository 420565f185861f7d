package remediate

import (
	"bufio"
	"bytes"
	"context"
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
	Kind    string        `json:"kind"` // budget, shed, hold, lending, scale, pause, resume
	Phase   Phase         `json:"phase"`
	State   string        `json:"state,omitempty"`
	Mode    Mode          `json:"mode,omitempty"`
	Budget  *BudgetChange `json:"budget,omitempty"`
	Shed    *ShedAction   `json:"shed,omitempty"`
	Hold    *HoldAction   `json:"hold,omitempty"`
	Lending *LendingPlan  `json:"lending,omitempty"`
	Scale   *ScalePlan    `json:"scale,omitempty"`
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
	case r.Hold != nil:
		return r.Hold.Summary()
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
	case r.Scale != nil:
		return r.Scale.Summary()
	}
	return ""
}

// AuditStore is where an Audit keeps its records: a JSON Lines file (AuditFile) for a daemon
// alone, or a store that several daemons share (the daemon's Redis stream in replicated mode),
// so that the one that takes over reconciles what its predecessor left between intent and
// outcome exactly as a restarted daemon reconciles its own file.
type AuditStore interface {
	// Append stores recs, in order, durably before returning; all of them or, on error, none
	// that the caller may count on. An error wrapping ErrSuperseded means the writer may no
	// longer act.
	Append(ctx context.Context, recs []Record) error
	// Load returns every record stored, oldest first.
	Load(ctx context.Context) ([]Record, error)
	Close() error
}

// AuditOptions configure NewAudit.
type AuditOptions struct {
	// Store keeps the records (required).
	Store AuditStore
	// Records are what Store holds at start, as read when it was opened.
	Records []Record
	// Copy, when set, is written each record after Store took it: the daemon's local audit.jsonl
	// beside the shared stream. A record Store refused is not copied, so the copy never claims
	// what the log of record does not.
	Copy AuditStore
	// OnCopyError hears of a failed copy; the record stands (Store has it).
	OnCopyError func(error)
}

// Audit is an append-only log of every action, written before the action is taken: after a crash
// (or a takeover) it says what was intended and what is known to have happened. It keeps the
// records in memory for the status API (the log of a daemon is small: one record per action).
type Audit struct {
	mu   sync.Mutex
	o    AuditOptions
	recs []Record
}

// NewMemoryAudit is an audit kept in memory only: for the simulator, where a run never restarts.
func NewMemoryAudit() *Audit { return &Audit{} }

// NewAudit is an audit on o.Store, starting from o.Records.
func NewAudit(o AuditOptions) (*Audit, error) {
	if o.Store == nil {
		return nil, errors.New("audit: Store is required")
	}
	return &Audit{o: o, recs: slices.Clone(o.Records)}, nil
}

// OpenAudit opens (creating it if needed) the log file at path and reads its records; see
// OpenAuditFile for what it accepts.
func OpenAudit(path string) (a *Audit, warning string, err error) {
	f, recs, warning, err := OpenAuditFile(path)
	if err != nil {
		return nil, "", err
	}
	a, err = NewAudit(AuditOptions{Store: f, Records: recs})
	return a, warning, err
}

// AuditFile is an AuditStore in a JSON Lines file, each append synced to disk.
type AuditFile struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

// OpenAuditFile opens (creating it if needed) the log at path and reads its records. A last line
// cut short by a crash is reported in the returned warning and dropped; any other bad line is an
// error naming it, because the log is what prevents repeating an action.
func OpenAuditFile(path string) (af *AuditFile, recs []Record, warning string, err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, "", fmt.Errorf("audit log: %w", err)
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, nil, "", fmt.Errorf("audit log %s: %w", path, err)
	}
	recs, good, warning, err := parseAuditLines(path, data)
	if err != nil {
		return nil, nil, "", err
	}
	if good < len(data) {
		if err := f.Truncate(int64(good)); err != nil {
			return nil, nil, "", fmt.Errorf("audit log %s: %w", path, err)
		}
	}
	if _, err := f.Seek(int64(good), io.SeekStart); err != nil {
		return nil, nil, "", fmt.Errorf("audit log %s: %w", path, err)
	}
	return &AuditFile{path: path, f: f}, recs, warning, nil
}

// parseAuditLines reads a log's lines; good is the length of the part that holds whole records.
func parseAuditLines(path string, data []byte) (recs []Record, good int, warning string, err error) {
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
			return nil, 0, "", fmt.Errorf("audit log %s: line %d: %w", path, i+1, err)
		}
		recs = append(recs, r)
		good += len(line)
	}
	return recs, good, warning, nil
}

// Append writes recs as JSON lines and syncs them to disk before returning.
func (af *AuditFile) Append(_ context.Context, recs []Record) error {
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
	af.mu.Lock()
	defer af.mu.Unlock()
	if _, err := af.f.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	if err := af.f.Sync(); err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	return nil
}

// Load reads the file again.
func (af *AuditFile) Load(context.Context) ([]Record, error) {
	af.mu.Lock()
	defer af.mu.Unlock()
	data, err := os.ReadFile(af.path)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	recs, _, _, err := parseAuditLines(af.path, data)
	return recs, err
}

// Close closes the file.
func (af *AuditFile) Close() error { return af.f.Close() }

// Append stores records (and copies them) before returning. A record the store refuses is
// neither kept nor copied: the error is the store's, ErrSuperseded included.
func (a *Audit) Append(ctx context.Context, recs ...Record) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.o.Store != nil {
		if err := a.o.Store.Append(ctx, recs); err != nil {
			return err
		}
	}
	if a.o.Copy != nil {
		if err := a.o.Copy.Append(ctx, recs); err != nil && a.o.OnCopyError != nil {
			a.o.OnCopyError(err)
		}
	}
	a.recs = append(a.recs, recs...)
	return nil
}

// Reload reads the records again from the store: a daemon taking over a shared log learns what
// its predecessor wrote there.
func (a *Audit) Reload(ctx context.Context) error {
	if a.o.Store == nil {
		return nil
	}
	recs, err := a.o.Store.Load(ctx)
	if err != nil {
		return err
	}
	a.mu.Lock()
	a.recs = recs
	a.mu.Unlock()
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

// Close closes the store and the copy.
func (a *Audit) Close() error {
	var errs []error
	for _, s := range []AuditStore{a.o.Store, a.o.Copy} {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	return errors.Join(errs...)
}
