package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/internal/atomicfile"
)

// stateVersion is the version of the state file's format.
const stateVersion = 1

// stateFile is what the gateway keeps across restarts: the admission core's export (live
// sessions, the budget as last set, retry and shed memories), the affinity switch as last set and
// each live session's upstream, so that its calls keep going to the same one.
type stateFile struct {
	Version   int               `json:"version"`
	SavedAt   time.Time         `json:"saved_at"`
	Admission admission.State   `json:"admission"`
	Affinity  *bool             `json:"affinity_enabled,omitempty"`
	Upstreams map[string]string `json:"upstreams,omitempty"` // session id → upstream URL
}

// saveState writes the state file, if one is configured: to a temporary file in the same
// directory, then renamed over it, so that a crash never leaves half a file.
func (g *Gateway) saveState() error {
	path := g.cfg.StateFile
	if path == "" {
		return nil
	}
	g.saveMu.Lock()
	defer g.saveMu.Unlock()
	now := g.now()
	aff := g.affinity.Load()
	st := stateFile{Version: stateVersion, SavedAt: now, Admission: g.core.Export(now), Affinity: &aff,
		Upstreams: map[string]string{}}
	g.mu.Lock()
	for _, ls := range st.Admission.Live {
		if si, ok := g.mu.sessions[ls.ID]; ok {
			st.Upstreams[ls.ID] = g.upstreams[si.upstream].url.String()
		}
	}
	g.mu.Unlock()
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("state file %s: %w", path, err)
	}
	if err := atomicfile.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("state file %s: %w", path, err)
	}
	return nil
}

// restoreState loads the state file into the new gateway, if it exists. A file that cannot be
// read is an error: starting empty would admit every live session's next call as new.
func (g *Gateway) restoreState() error {
	path := g.cfg.StateFile
	if path == "" {
		return nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state_file: %w", err)
	}
	var st stateFile
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return fmt.Errorf("state file %s: corrupt (%v); move it away to start with no live sessions", path, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("state file %s: corrupt (data after the state); move it away to start with no live sessions", path)
	}
	if st.Version != stateVersion {
		return fmt.Errorf("state file %s: version %d, this gateway reads version %d", path, st.Version, stateVersion)
	}
	now := g.now()
	if err := g.core.Restore(now, st.Admission); err != nil {
		return fmt.Errorf("state file %s: %w", path, err)
	}
	if st.Affinity != nil {
		g.affinity.Store(*st.Affinity)
	}
	index := map[string]int{}
	for i, u := range g.upstreams {
		index[u.url.String()] = i
	}
	for id, u := range st.Upstreams {
		if i, ok := index[u]; ok && g.core.Live(id) {
			g.addSessionLocked(id, &sessionInfo{upstream: i})
		}
	}
	snap := g.core.Snapshot(now, false)
	g.log.Info("state restored", "file", path, "saved_at", st.SavedAt, "live_sessions", snap.Live,
		"budget_tokens", snap.Budget, "reference_budget_tokens", snap.ReferenceBudget, "affinity", g.affinity.Load())
	return nil
}
