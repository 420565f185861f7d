package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/basin-dev/basin/gateway/admission"
)

// The journal is the state file's append-only companion. The state file is written every 10 s;
// a gateway killed between two writes (kill -9, OOM, a node lost) would forget every session
// admitted since the last one, and their next calls would queue as new sessions, or be refused.
// So each admission, end, budget change and affinity switch is appended to the journal as one
// JSON line, and an admitted session's first call is forwarded only once its line is fsync'd.
// Concurrent admissions share one write and one fsync (group commit: whoever finds no flush
// running writes out everything queued so far). At each periodic save the journal is compacted
// into the state file: under the gateway's lock the state is exported and the journal renamed to
// its .old twin (new records go to a fresh journal), then the state file is written and .old
// removed. At start the state file is read, then .old (a compaction that did not finish), then
// the journal, each record applied in order; replay is idempotent, so a record also covered by
// the state file changes nothing. A torn last line (the process died mid-write) is skipped and
// reported; any other unreadable line is an error naming the file and line.

// journalSuffix and journalOldSuffix name the journal files after the state file.
const (
	journalSuffix    = ".journal"
	journalOldSuffix = ".journal.old"
)

// Journal record operations.
const (
	opAdmit    = "admit"
	opEnd      = "end"
	opBudget   = "budget"
	opAffinity = "affinity"
)

// journalRecord is one line of the journal.
type journalRecord struct {
	Op string    `json:"op"`
	At time.Time `json:"at"`
	// Session is the admitted session (admit).
	Session *admission.LiveSession `json:"session,omitempty"`
	// Upstream is the admitted session's upstream URL (admit).
	Upstream string `json:"upstream,omitempty"`
	// ID is the ended session (end).
	ID string `json:"id,omitempty"`
	// Budget, ReferenceBudget and CountOnly are the admission budget after a change (budget).
	Budget          *int64 `json:"budget_tokens,omitempty"`
	ReferenceBudget *int64 `json:"reference_budget_tokens,omitempty"`
	CountOnly       *bool  `json:"count_only,omitempty"`
	// Affinity is the affinity switch after a change (affinity).
	Affinity *bool `json:"affinity_enabled,omitempty"`
}

// journal appends records with group commit. Its methods are safe for concurrent use; records are
// appended (add) in the order the gateway's lock decides, and made durable by sync.
type journal struct {
	path, oldPath string
	cond          *sync.Cond
	mu            struct {
		sync.Mutex
		f        *os.File
		size     int64  // bytes durably in f
		pending  []byte // records added and not yet written
		added    uint64 // records added so far
		synced   uint64 // records written and fsync'd (or failed, see failLo/failHi)
		flushing bool
		// failLo < n ≤ failHi: record n was lost in the last failed flush.
		failLo, failHi uint64
		failErr        error
	}
}

// openJournal opens (creating) the journal of the state file at statePath for appending.
func openJournal(statePath string) (*journal, error) {
	j := &journal{path: statePath + journalSuffix, oldPath: statePath + journalOldSuffix}
	j.cond = sync.NewCond(&j.mu)
	f, err := os.OpenFile(j.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("journal %s: %w", j.path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("journal %s: %w", j.path, err)
	}
	j.mu.f, j.mu.size = f, st.Size()
	return j, nil
}

// add queues a record; sync makes it durable. Callers hold the gateway's lock, so that records
// are in the order of the changes they describe.
func (j *journal) add(r journalRecord) {
	b, err := json.Marshal(r)
	if err != nil {
		panic(fmt.Sprintf("journal: encoding a record: %v", err)) // a bug: every field encodes
	}
	j.mu.Lock()
	j.mu.pending = append(append(j.mu.pending, b...), '\n')
	j.mu.added++
	j.mu.Unlock()
}

// sync returns once every record added before the call is written and fsync'd, writing them
// itself unless another caller's flush already covers them.
func (j *journal) sync() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	target := j.mu.added
	for j.mu.synced < target {
		if j.mu.flushing {
			j.cond.Wait()
			continue
		}
		j.flushLocked()
	}
	if j.mu.failErr != nil && target > j.mu.failLo && target <= j.mu.failHi {
		return j.mu.failErr
	}
	return nil
}

// flushLocked writes out the pending records (j.mu held; released during the write). A failed
// write is cut back off the file, so that the journal never holds half a record in its middle.
func (j *journal) flushLocked() {
	buf, upto, from := j.mu.pending, j.mu.added, j.mu.synced
	j.mu.pending = nil
	j.mu.flushing = true
	f, size := j.mu.f, j.mu.size
	j.mu.Unlock()
	_, err := f.Write(buf)
	if err == nil {
		err = f.Sync()
	}
	if err != nil {
		_ = f.Truncate(size)
	}
	j.mu.Lock()
	j.mu.flushing = false
	if err != nil {
		j.mu.failLo, j.mu.failHi, j.mu.failErr = from, upto, fmt.Errorf("journal %s: %w", j.path, err)
	} else {
		j.mu.size += int64(len(buf))
	}
	j.mu.synced = upto
	j.cond.Broadcast()
}

// flush writes out whatever is pending (records nobody waits for, such as ends).
func (j *journal) flush() error { return j.sync() }

// rotate begins a compaction (called with the gateway's lock held, right after the state to save
// was exported): it writes out what is pending and moves the journal's records to .old, so that
// records added from now on go to a fresh journal. If .old is still there (an earlier compaction
// whose state file was not written), the records are appended to it instead.
func (j *journal) rotate() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.mu.flushing {
		j.cond.Wait()
	}
	if j.mu.synced < j.mu.added {
		j.flushLocked()
		for j.mu.flushing {
			j.cond.Wait()
		}
	}
	if j.mu.size == 0 {
		return nil
	}
	if _, err := os.Stat(j.oldPath); err == nil {
		if err := appendFile(j.oldPath, j.path); err != nil {
			return fmt.Errorf("journal %s: %w", j.oldPath, err)
		}
		if err := j.mu.f.Truncate(0); err != nil {
			return fmt.Errorf("journal %s: %w", j.path, err)
		}
		j.mu.size = 0
		return nil
	}
	if err := os.Rename(j.path, j.oldPath); err != nil {
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	f, err := os.OpenFile(j.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_TRUNC, 0o600)
	if err != nil {
		// Keep appending to the renamed file: its records stay replayable as .old.
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	_ = j.mu.f.Close()
	j.mu.f, j.mu.size = f, 0
	return syncDirOf(j.path)
}

// dropOld ends a compaction once the state file is written: .old is covered by it.
func (j *journal) dropOld() error {
	if err := os.Remove(j.oldPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("journal %s: %w", j.oldPath, err)
	}
	return nil
}

// close writes out what is pending and closes the file.
func (j *journal) close() error {
	err := j.flush()
	j.mu.Lock()
	defer j.mu.Unlock()
	return errors.Join(err, j.mu.f.Close())
}

// appendFile appends the content of src to dst and fsyncs dst.
func appendFile(dst, src string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// syncDirOf makes a rename in path's directory durable; a file system that cannot sync a
// directory is not a failure.
func syncDirOf(path string) error {
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return nil
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return fmt.Errorf("sync %s: %w", filepath.Dir(path), err)
	}
	return nil
}

// replayReport is what replaying one journal file found.
type replayReport struct {
	records int
	// torn is the 1-based line number of a torn last line that was skipped (0: none).
	torn int
}

// replayJournal applies the records of a journal file to st, in order. A missing file is no
// records. A last line that does not decode is a record torn by a crash mid-write: it is skipped
// and reported. Any other line that does not decode is an error naming the file and line: the
// records after it may depend on it.
func replayJournal(path string, st *stateFile) (replayReport, error) {
	var rep replayReport
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("journal %s: %w", path, err)
	}
	live := map[string]admission.LiveSession{}
	for _, ls := range st.Admission.Live {
		live[ls.ID] = ls
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), len(data)+1)
	var lines [][]byte
	for sc.Scan() {
		lines = append(lines, sc.Bytes())
	}
	for i, line := range lines {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r journalRecord
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		err := dec.Decode(&r)
		if err == nil {
			if _, e := dec.Token(); !errors.Is(e, io.EOF) {
				err = errors.New("data after the record")
			}
		}
		if err == nil {
			err = applyRecord(r, st, live)
		}
		if err != nil {
			if i == len(lines)-1 {
				rep.torn = i + 1
				break
			}
			return rep, fmt.Errorf("journal %s: line %d: %v; move the file away to start without its records", path, i+1, err)
		}
		rep.records++
	}
	st.Admission.Live = st.Admission.Live[:0]
	for _, ls := range live {
		st.Admission.Live = append(st.Admission.Live, ls)
	}
	sort.Slice(st.Admission.Live, func(a, b int) bool { return st.Admission.Live[a].ID < st.Admission.Live[b].ID })
	return rep, nil
}

// applyRecord applies one record to the state being restored. Replay is idempotent: an admission
// of a session already live keeps what the state knows of it (a fresher context), an end of a
// session not live changes nothing.
func applyRecord(r journalRecord, st *stateFile, live map[string]admission.LiveSession) error {
	switch r.Op {
	case opAdmit:
		if r.Session == nil || r.Session.ID == "" {
			return errors.New("admit: no session")
		}
		if _, ok := live[r.Session.ID]; !ok {
			live[r.Session.ID] = *r.Session
		}
		if r.Upstream != "" {
			if st.Upstreams == nil {
				st.Upstreams = map[string]string{}
			}
			st.Upstreams[r.Session.ID] = r.Upstream
		}
		delete(st.Admission.Retry, r.Session.ID)
	case opEnd:
		if r.ID == "" {
			return errors.New("end: no id")
		}
		delete(live, r.ID)
		delete(st.Upstreams, r.ID)
	case opBudget:
		if r.Budget == nil || r.ReferenceBudget == nil {
			return errors.New("budget: budget_tokens and reference_budget_tokens required")
		}
		st.Admission.Budget, st.Admission.ReferenceBudget = *r.Budget, *r.ReferenceBudget
		st.Admission.CountOnly = r.CountOnly != nil && *r.CountOnly
	case opAffinity:
		if r.Affinity == nil {
			return errors.New("affinity: affinity_enabled required")
		}
		v := *r.Affinity
		st.Affinity = &v
	default:
		return fmt.Errorf("unknown op %q", r.Op)
	}
	return nil
}
