package trace

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
)

// Recorder appends rows to a basin trace as calls finish, for a process that serves live traffic
// (the gateway). It never needs a raw session id or tenant in the file: SessionID and Tenant turn
// them into the first 16 hex digits of SHA-256 over a random salt drawn when the recorder is made,
// so the rows of one session group together while the id cannot be looked up, and two recordings
// cannot be joined on it. A Recorder is safe for concurrent use.
type Recorder struct {
	salt [16]byte
	mu   struct {
		sync.Mutex
		w      io.WriteCloser
		seq    uint64
		closed bool
	}
}

// OpenRecorder appends to the trace file at path, creating it (mode 0640: a trace describes a
// deployment's traffic) when it does not exist.
func OpenRecorder(path string) (*Recorder, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("open trace recorder: %w", err)
	}
	r, err := NewRecorder(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return r, nil
}

// NewRecorder records to w, which Close closes.
func NewRecorder(w io.WriteCloser) (*Recorder, error) {
	r := &Recorder{}
	if _, err := rand.Read(r.salt[:]); err != nil {
		return nil, fmt.Errorf("trace recorder salt: %w", err)
	}
	r.mu.w = w
	return r, nil
}

func (r *Recorder) hash(parts ...string) string {
	h := sha256.New()
	h.Write(r.salt[:])
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// SessionID is the trace id of a session being admitted under the id id. Every call gives a fresh
// trace id (the hash also covers a sequence number), so an id reused after its session ended, or
// a session that outlives a restart, starts a new trace session at call 0 rather than breaking
// the call numbering; the caller keeps the trace id for the session's life.
func (r *Recorder) SessionID(id string) string {
	r.mu.Lock()
	r.mu.seq++
	seq := r.mu.seq
	r.mu.Unlock()
	return r.hash(id, strconv.FormatUint(seq, 10))
}

// Tenant is the trace name of a tenant: the same for every session of the tenant, so a replay can
// still split load by tenant. An unknown tenant ("") stays "".
func (r *Recorder) Tenant(t string) string {
	if t == "" {
		return ""
	}
	return r.hash("tenant", t)
}

// Record appends one row (see WriteRow). It fails once the recorder is closed.
func (r *Recorder) Record(row Row) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.closed {
		return errors.New("record: trace already closed")
	}
	return WriteRow(r.mu.w, row)
}

// Close closes the trace; closing again does nothing.
func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mu.closed {
		return nil
	}
	r.mu.closed = true
	return r.mu.w.Close()
}
