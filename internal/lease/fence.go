package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
)

// ErrFenced is what a write of a term that is no longer the store's current one fails with;
// errors.As to *FencedError gives the epochs.
var ErrFenced = errors.New("write fenced: the lease's epoch moved")

// FencedError is a write refused because the store's epoch is not the writer's.
type FencedError struct {
	// Epoch is the writer's term.
	Epoch uint64
	// Current is the store's epoch when the write was refused.
	Current uint64
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("%v: wrote at epoch %d, the store is at epoch %d", ErrFenced, e.Epoch, e.Current)
}

// Unwrap makes errors.Is(err, ErrFenced) true.
func (e *FencedError) Unwrap() error { return ErrFenced }

// Cmd is one command of a fenced write, called in the store as Name, Keys…, Args…: HSET key
// field value, XADD key * field value, DEL key… Commands whose keys do not come first cannot
// be expressed; none of the writes basin needs is one.
type Cmd struct {
	Name string
	Keys []string
	Args []any
}

// Write runs cmds in the store, in order and atomically with respect to other clients, only if
// the lease's epoch there is still epoch; otherwise nothing is written and the error is a
// *FencedError (errors.Is ErrFenced). Pass the epoch from Leader or the Change that granted it,
// taken before the work the write records: the check is in the store, so a leader paused
// between its own check and its write is refused once a successor has taken over. A command
// the store rejects stops the rest, but the commands before it stay written (scripts do not
// roll back). It returns each command's reply (int64, string, []any, or nil).
func (c *Campaign) Write(ctx context.Context, epoch uint64, cmds ...Cmd) ([]any, error) {
	keys := []string{c.opts.epochKey()}
	args := []any{strconv.FormatUint(epoch, 10), len(cmds)}
	for i, cmd := range cmds {
		if cmd.Name == "" {
			return nil, fmt.Errorf("lease: fenced write: command %d: Name is empty", i)
		}
		keys = append(keys, cmd.Keys...)
		args = append(args, cmd.Name, len(cmd.Keys), len(cmd.Args))
		args = append(args, cmd.Args...)
	}
	res, err := fenceScript.Run(ctx, c.client, keys, args...).Slice()
	if err != nil {
		c.metrics.errors.WithLabelValues("write").Inc()
		return nil, fmt.Errorf("lease: fenced write at epoch %d (%d commands): %w", epoch, len(cmds), err)
	}
	if len(res) != 2 {
		return nil, fmt.Errorf("lease: fenced write: script reply of %d elements, want 2", len(res))
	}
	if status, _ := res[0].(int64); status != 1 {
		cur, err := parseEpoch(res[1])
		if err != nil {
			return nil, fmt.Errorf("lease: fenced write: %w", err)
		}
		c.observe(cur)
		c.metrics.fenced.Inc()
		return nil, &FencedError{Epoch: epoch, Current: cur}
	}
	out, _ := res[1].([]any)
	return out, nil
}
