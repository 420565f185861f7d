package inproc_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/gateway/admission/inproc"
	"github.com/basin-dev/basin/remediate"
	"github.com/basin-dev/basin/remediate/admissiontest"
)

var _ remediate.Admission = (*inproc.Admission)(nil)

// TestConformance runs the admission contract's suite against a core served in process, its
// sessions' calls finishing as soon as they go (each leaves a context of 110 tokens, as the
// gateway's conformance run's upstream reports).
func TestConformance(t *testing.T) {
	admissiontest.Run(t, func(t *testing.T, budget int64) admissiontest.Deployment {
		const prompt, context = 10, 110
		core, err := admission.New(admission.Options{Budget: budget, ReferenceBudget: budget})
		require.NoError(t, err)
		now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		var a *inproc.Admission
		// finish ends the calls the events let go; finishing may admit more.
		var finish func(evs []admission.Event)
		finish = func(evs []admission.Event) {
			for _, e := range evs {
				if e.Kind == admission.EventAdmitted || e.Kind == admission.EventResumed {
					finish(core.Finish(now, e.ID, context))
				}
			}
		}
		a, err = inproc.New(inproc.Options{Core: core, Now: func() time.Time { return now }, Deliver: finish})
		require.NoError(t, err)
		return admissiontest.Deployment{Admission: a, ContextTokens: context, Call: func(id string) {
			now = now.Add(time.Second)
			if core.BeginCall(now, id, prompt) == admission.CallPass {
				finish(core.Finish(now, id, context))
				return
			}
			if _, live := core.LiveSession(id); live {
				return // held: it goes on a resume
			}
			if d := core.Arrive(now, admission.Request{ID: id, FirstPrompt: prompt}); d.Verdict == admission.Admitted {
				finish(core.Finish(now, id, context))
			}
		}}
	})
}
