package daemon

import (
	"net/http"
	"time"

	"github.com/basin-dev/basin/detector"
)

// historyLen keeps an hour of steps at the default 5 s interval for the status page.
const historyLen = 720

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
		p.WC, p.Hit, p.Plateau, p.Live = ptr(a.WorkingSetOverCache), ptr(a.HitRate), ptr(a.Plateau), ptr(a.LiveSessions)
		p.Knee = ptr(a.Knee.Ratio)
	}
	return p
}

func ptr[T any](v T) *T { return &v }

func (d *Daemon) serveHistory(w http.ResponseWriter, _ *http.Request) {
	d.mu.Lock()
	pts := append([]HistoryPoint(nil), d.mu.history...)
	d.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"points": pts})
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
}

func (d *Daemon) serveCurve(w http.ResponseWriter, _ *http.Request) {
	a, _ := d.det.Last()
	v := CurveView{Points: d.det.Curve(), LambdaPerS: a.Lambda, LiveSessions: a.LiveSessions, CompletionPerS: a.CompletionRate,
		StableN: a.Equilibria.Stable, UnstableN: a.Equilibria.Unstable, Estimated: a.Equilibria.Estimated,
		NoEquilibrium: a.Equilibria.NoEquilibrium}
	if v.Points == nil {
		v.Points = []detector.CurvePoint{}
	}
	writeJSON(w, http.StatusOK, v)
}
