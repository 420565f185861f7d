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
	// DaemonTerm is the highest Basin-Daemon-Term accepted (checkDaemonTerm).
	DaemonTerm uint64 `json:"daemon_term,omitempty"`
}

// saveState writes the state file, if one is configured: to a temporary file in the same
// directory, then renamed over it, so that a crash never leaves half a file. It compacts the
// journal: the state is exported and the journal moved aside under the gateway's lock, so that
// every record is either covered by this state or in the fresh journal, and the moved-aside
// records are dropped once the state file is written.
func (g *Gateway) saveState() error {
	path := g.cfg.StateFile
	if path == "" {
		return nil
	}
	g.saveMu.Lock()
	defer g.saveMu.Unlock()
	now := g.now()
	g.mu.Lock()
	aff := g.affinity.Load()
	st := stateFile{Version: stateVersion, SavedAt: now, Admission: g.core.Export(now), Affinity: &aff,
		Upstreams: map[string]string{}, DaemonTerm: g.daemonTerm.Load()}
	for _, ls := range st.Admission.Live {
		if si, ok := g.mu.sessions[ls.ID]; ok {
			st.Upstreams[ls.ID] = g.upstreams[si.upstream].url.String()
		}
	}
	var rotErr error
	if g.journal != nil {
		rotErr = g.journal.rotate()
	}
	g.mu.Unlock()
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("state file %s: %w", path, err)
	}
	if err := atomicfile.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return errors.Join(fmt.Errorf("state file %s: %w", path, err), rotErr)
	}
	if rotErr != nil {
		// The journal keeps its records; replaying them over this state changes nothing.
		return rotErr
	}
	if g.journal != nil {
		return g.journal.dropOld()
	}
	return nil
}

// restoreState loads the state file into the new gateway, if it exists, then replays the
// journal's records over it (a compaction that did not finish first), and opens the journal for
// this run. A state that cannot be read is an error: starting empty would admit every live
// session's next call as new. After a replay the journal is compacted at once.
func (g *Gateway) restoreState() error {
	path := g.cfg.StateFile
	if path == "" {
		return nil
	}
	st, found, err := readStateFile(path)
	if err != nil {
		return err
	}
	replayed, torn := 0, false
	for _, jp := range []string{path + journalOldSuffix, path + journalSuffix} {
		rep, err := replayJournal(jp, &st)
		if err != nil {
			return err
		}
		replayed += rep.records
		if rep.torn > 0 {
			torn = true
			g.log.Warn("journal: skipped a torn last record (the gateway stopped mid-write); "+
				"that change was not acknowledged to anyone", "file", jp, "line", rep.torn)
		}
	}
	if found || replayed > 0 {
		if err := g.applyState(st); err != nil {
			return fmt.Errorf("state file %s: %w", path, err)
		}
		snap := g.core.Snapshot(g.now(), false)
		g.log.Info("state restored", "file", path, "saved_at", st.SavedAt, "journal_records", replayed,
			"live_sessions", snap.Live, "budget_tokens", snap.Budget, "reference_budget_tokens", snap.ReferenceBudget,
			"affinity", g.affinity.Load())
	}
	if g.journal, err = openJournal(path); err != nil {
		return err
	}
	if replayed > 0 || torn {
		if err := g.saveState(); err != nil {
			_ = g.journal.close()
			g.journal = nil
			return fmt.Errorf("compacting the journal: %w", err)
		}
	}
	return nil
}

// readStateFile reads the state file; found is false when there is none.
func readStateFile(path string) (st stateFile, found bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return stateFile{Version: stateVersion}, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("state_file: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&st); err != nil {
		return st, false, fmt.Errorf("state file %s: corrupt (%v); move it away to start with no live sessions", path, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return st, false, fmt.Errorf("state file %s: corrupt (data after the state); move it away to start with no live sessions", path)
	}
	if st.Version != stateVersion {
		return st, false, fmt.Errorf("state file %s: version %d, this gateway reads version %d", path, st.Version, stateVersion)
	}
	return st, true, nil
}

// applyState loads a restored state into the core and the routing table.
func (g *Gateway) applyState(st stateFile) error {
	if err := g.core.Restore(g.now(), st.Admission); err != nil {
		return err
	}
	if st.Affinity != nil {
		g.affinity.Store(*st.Affinity)
	}
	g.raiseDaemonTerm(st.DaemonTerm)
	index := map[string]int{}
	for i, u := range g.upstreams {
		index[u.url.String()] = i
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, ls := range st.Admission.Live {
		i, ok := index[st.Upstreams[ls.ID]]
		if !ok {
			// Its upstream is gone from the config: the next call picks one.
			i = g.pickUpstream(ls.ID)
		}
		g.addSessionLocked(ls.ID, &sessionInfo{upstream: i, journaled: true})
	}
	return nil
}
