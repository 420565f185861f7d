package gateway

import (
	"time"

	"github.com/basin-dev/basin/internal/trace"
)

// recorder turns the gateway's finished calls into rows of a basin trace (internal/trace's
// FORMAT.md). The format, the writing and the salted hashing that keeps raw session ids and
// tenants out of the file are trace.Recorder's; what is the gateway's own is how a call becomes a
// row: which turn it was, when it started, and that the reuse is left to the format's default.
type recorder struct{ rec *trace.Recorder }

func openRecorder(path string) (*recorder, error) {
	rec, err := trace.OpenRecorder(path)
	if err != nil {
		return nil, err
	}
	return &recorder{rec: rec}, nil
}

// sessionID is the trace id of a newly admitted session (a fresh one per admission).
func (r *recorder) sessionID(id string) string { return r.rec.SessionID(id) }

// tenant is the trace name of a tenant ("" stays "").
func (r *recorder) tenant(t string) string { return r.rec.Tenant(t) }

// record writes the row of a finished call. start is when the call reached the gateway (queueing
// included), so a replay sees the demand as the clients made it. reused_tokens is left to the
// reader's default (the previous prompt plus output): the gateway sees token counts, not
// prefixes, and that default is what an agent resending its history reuses.
func (r *recorder) record(si *sessionInfo, c *call, index int, gap time.Duration, end time.Time, prompt, output int64) error {
	human := false
	if index > 0 {
		human = c.req.LastRole == "user" // the conversation ends with a person's message, not a tool result
	} else {
		gap = 0
	}
	if end.Before(c.arrival) {
		end = c.arrival
	}
	return r.rec.Record(trace.Row{
		SessionID: si.traceID,
		Index:     index,
		Tenant:    si.traceTenant,
		TaskChars: max(0, si.taskChars),
		Call: trace.Call{
			Start:     c.arrival,
			End:       end,
			Prompt:    int(max(1, prompt)),
			Output:    int(max(0, output)),
			GapBefore: max(0, gap),
			Human:     human,
		},
		DefaultReuse: true,
	})
}

func (r *recorder) close() error { return r.rec.Close() }
