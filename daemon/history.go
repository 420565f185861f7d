package daemon

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/basin-dev/basin/detector"
	"github.com/basin-dev/basin/internal/atomicfile"
	"github.com/basin-dev/basin/internal/httpjson"
)

// historyLen keeps an hour of steps at the default 5 s interval for the status page.
const historyLen = 720

// historyPath is the history's file in the data directory.
func historyPath(dir string) string { return filepath.Join(dir, "history.jsonl") }

// historyFile keeps the status page's history across restarts: one JSON line per step, appended
// (not synced: losing the last steps to a crash costs a few points of a picture), and rewritten
// with the last historyLen points once it holds twice that, so it stays under ~0.5 MB. Step owns
// it (under the loop lock).
type historyFile struct {
	path  string
	f     *os.File
	lines int
}

// openHistory reads the history file, if any, and opens it for appending. What cannot be read is
// dropped with a warning rather than stopping the daemon: the history is a picture, not state that
// decides anything.
func openHistory(path string) (h *historyFile, pts []HistoryPoint, warning string, err error) {
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, "", fmt.Errorf("history file: %w", err)
	}
	bad := 0
	for line := range bytes.Lines(data) {
		var p HistoryPoint
		if err := json.Unmarshal(line, &p); err != nil || p.T.IsZero() {
			bad++
			continue
		}
		pts = append(pts, p)
	}
	if bad > 0 {
		warning = fmt.Sprintf("history file %s: dropped %d unreadable lines (a crash mid-write leaves one)", path, bad)
	}
	if len(pts) > historyLen {
		pts = pts[len(pts)-historyLen:]
	}
	h = &historyFile{path: path}
	// Start from a clean file holding what was read: a line cut short must not glue onto the next.
	if err := h.rewrite(pts); err != nil {
		return nil, nil, "", err
	}
	return h, pts, warning, nil
}

// rewrite replaces the file with pts, atomically, and reopens it for appending.
func (h *historyFile) rewrite(pts []HistoryPoint) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, p := range pts {
		if err := enc.Encode(p); err != nil {
			return fmt.Errorf("history file: %w", err)
		}
	}
	if h.f != nil {
		_ = h.f.Close()
		h.f = nil
	}
	if err := atomicfile.WriteFile(h.path, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("history file: %w", err)
	}
	f, err := os.OpenFile(h.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("history file: %w", err)
	}
	h.f, h.lines = f, len(pts)
	return nil
}

// append writes one point; past 2 × historyLen lines it rewrites the file with ring, the points
// kept in memory (p among them).
func (h *historyFile) append(p HistoryPoint, ring func() []HistoryPoint) error {
	if h.lines+1 > 2*historyLen {
		return h.rewrite(ring())
	}
	if h.f == nil {
		return errors.New("history file: not open")
	}
	w := bufio.NewWriter(h.f)
	if err := json.NewEncoder(w).Encode(p); err != nil {
		return fmt.Errorf("history file: %w", err)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("history file: %w", err)
	}
	h.lines++
	return nil
}

func (h *historyFile) close() error {
	if h == nil || h.f == nil {
		return nil
	}
	err := h.f.Close()
	h.f = nil
	return err
}

// HistoryPoint is one step as the status page draws it. Absent readings are omitted, not zero.
type HistoryPoint struct {
	T        time.Time      `json:"t"`
	State    detector.State `json:"state"`
	WC       *float64       `json:"wc,omitempty"`
	Knee     *float64       `json:"knee,omitempty"`
	Hit      *float64       `json:"hit,omitempty"`
	Plateau  *float64       `json:"plateau,omitempty"`
	Live     *float64       `json:"live,omitempty"`
	Budget   int64          `json:"budget,omitempty"`
	Reserved int64          `json:"reserved,omitempty"`
}

// record appends a step to the ring; the caller holds d.mu.
func (d *Daemon) recordLocked(p HistoryPoint) {
	if len(d.mu.history) < historyLen {
		d.mu.history = append(d.mu.history, p)
		return
	}
	copy(d.mu.history, d.mu.history[1:])
	d.mu.history[len(d.mu.history)-1] = p
}

func historyPoint(a detector.Assessment, budget, reserved int64) HistoryPoint {
	p := HistoryPoint{T: a.At, State: a.State, Budget: budget, Reserved: reserved}
	if !a.ObservedAt.IsZero() && len(a.Blind) == 0 {
		p.WC, p.Plateau, p.Live = ptr(a.WorkingSetOverCache), ptr(a.Plateau), ptr(a.LiveSessions)
		p.Knee = ptr(a.Knee.Ratio)
		if a.HitEvidence.Enough { // a gap in the hit-rate line where there was no reading
			p.Hit = ptr(a.HitRate)
		}
	}
	return p
}

func ptr[T any](v T) *T { return &v }

func (d *Daemon) serveHistory(w http.ResponseWriter, _ *http.Request) {
	d.mu.Lock()
	pts := append([]HistoryPoint(nil), d.mu.history...)
	d.mu.Unlock()
	httpjson.WriteIndent(w, http.StatusOK, map[string]any{"points": pts})
}

// CurveView is GET /api/v1/curve: the completion curve, the arrival rate and where the deployment
// is on it.
type CurveView struct {
	Points         []detector.CurvePoint `json:"points"`
	LambdaPerS     float64               `json:"lambda_per_s"`
	LiveSessions   float64               `json:"live_sessions"`
	CompletionPerS float64               `json:"completion_per_s"`
	StableN        *float64              `json:"stable_n,omitempty"`
	UnstableN      *float64              `json:"unstable_n,omitempty"`
	Estimated      bool                  `json:"unstable_estimated,omitempty"`
	NoEquilibrium  bool                  `json:"no_equilibrium,omitempty"`
	// SpikeTolerance is the largest 10-minute spike the deployment absorbs now; absent while the
	// curve is not known up to the edge.
	SpikeTolerance *detector.SpikeTolerance `json:"spike_tolerance,omitempty"`
}

func (d *Daemon) serveCurve(w http.ResponseWriter, _ *http.Request) {
	a, _ := d.det.Last()
	v := CurveView{Points: d.det.Curve(), LambdaPerS: a.Lambda, LiveSessions: a.LiveSessions, CompletionPerS: a.CompletionRate,
		StableN: a.Equilibria.Stable, UnstableN: a.Equilibria.Unstable, Estimated: a.Equilibria.Estimated,
		NoEquilibrium: a.Equilibria.NoEquilibrium, SpikeTolerance: a.SpikeTolerance}
	if v.Points == nil {
		v.Points = []detector.CurvePoint{}
	}
	httpjson.WriteIndent(w, http.StatusOK, v)
}
