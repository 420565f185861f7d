package replication

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/internal/store"
)

// TestReportedLiveAfterItsEnd: the leader does not take a session as live from a report older
// than the session's end (a replica cut off while it ended elsewhere), and does take a session
// admitted after an end of the same id.
func TestReportedLiveAfterItsEnd(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	r := &Replica{}
	r.mu.ended = map[string]time.Time{}
	r.endedAt("ended-after", t0.Add(time.Second))
	r.endedAt("ended-before", t0.Add(-time.Second))
	r.endedAt("ended-at", t0)
	r.endedAt("ended-at", t0.Add(-time.Minute)) // an older report of the same end changes nothing
	in := []admission.LiveSession{{ID: "ended-after", Admitted: t0}, {ID: "ended-before", Admitted: t0},
		{ID: "ended-at", Admitted: t0}, {ID: "never-ended", Admitted: t0}}
	var kept []string
	for _, ls := range r.notEnded(in) {
		kept = append(kept, ls.ID)
	}
	assert.Equal(t, []string{"ended-before", "never-ended"}, kept)
	assert.Len(t, in, 4, "the report is not changed")
}

// TestOptionsNameWhatIsMissing: a replica built without what it cannot run on fails at once,
// naming the option.
func TestOptionsNameWhatIsMissing(t *testing.T) {
	core, err := admission.New(admission.Options{Budget: 1})
	require.NoError(t, err)
	ok := func() Options {
		return Options{Store: store.Config{URL: "redis://127.0.0.1:1"}, ReplicaID: "gw-0", AdvertiseURL: "http://127.0.0.1:2",
			ReportInterval: 100 * time.Millisecond, DegradedAdmission: DegradedLocalSlice, Transport: &http.Transport{},
			Core: core, Host: nopHost{}}
	}
	for _, tc := range []struct {
		name  string
		tweak func(*Options)
		want  string
	}{
		{"no store", func(o *Options) { o.Store = store.Config{} }, "Store"},
		{"no replica id", func(o *Options) { o.ReplicaID = "" }, "ReplicaID"},
		{"no advertise url", func(o *Options) { o.AdvertiseURL = "" }, "AdvertiseURL"},
		{"no report interval", func(o *Options) { o.ReportInterval = 0 }, "ReportInterval"},
		{"unknown degraded admission", func(o *Options) { o.DegradedAdmission = "guess" }, `DegradedAdmission: want local_slice or refuse, got "guess"`},
		{"no transport", func(o *Options) { o.Transport = nil }, "Transport"},
		{"no core", func(o *Options) { o.Core = nil }, "Core"},
		{"no host", func(o *Options) { o.Host = nil }, "Host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ok()
			tc.tweak(&o)
			_, err := New(o)
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	o := ok()
	require.NoError(t, o.validate())
	assert.NotNil(t, o.Logger)
	assert.NotNil(t, o.Now)
}

// nopHost is a gateway with nothing waiting and nothing chained.
type nopHost struct{}

func (nopHost) Deliver([]admission.Event)                                   {}
func (nopHost) AskAgain([]string)                                           {}
func (nopHost) Admit(http.ResponseWriter, *http.Request, Call) (bool, bool) { return false, false }
func (nopHost) Hold([]string, []string) int                                 { return 0 }
func (nopHost) ChainLink(string) (string, int64, bool)                      { return "", 0, false }
func (nopHost) LinkChain(string, string, int64)                             {}
func (nopHost) ChainLinks() []ChainLink                                     { return nil }
func (nopHost) Settings() (bool, uint64)                                    { return false, 0 }
func (nopHost) RestoreSettings(*bool, uint64)                               {}

// TestKnownLiveFollowsTheLeadersLog: a follower's copy of the leader's live set takes the set
// whole, then the changes from where it is; a change list that does not start where the copy is
// resets its position, so the next report asks for the set whole.
func TestKnownLiveFollowsTheLeadersLog(t *testing.T) {
	at := func(seq uint64) livePosition { return livePosition{Epoch: 3, Seq: seq} }
	whole := liveUpdate{To: at(5), Whole: true, Live: []string{"a", "b"}, Held: []string{"b"}}
	for _, tc := range []struct {
		name        string
		from        livePosition
		update      liveUpdate
		wantAt      livePosition
		wantLive    []string
		wantHeld    []string
		wantChanged []string
		wantAll     bool
	}{
		{name: "nothing said", from: at(5), update: liveUpdate{}, wantAt: at(5), wantLive: []string{"a", "b"}, wantHeld: []string{"b"}},
		{name: "the set whole", from: livePosition{}, update: liveUpdate{To: at(9), Whole: true, Live: []string{"c"}},
			wantAt: at(9), wantLive: []string{"c"}, wantHeld: []string{}, wantAll: true},
		{name: "changes from here", from: at(5), update: liveUpdate{To: at(7), Changes: []admission.LiveChange{
			{ID: "a", Live: false}, {ID: "c", Live: true, Held: true}, {ID: "b", Live: true}}},
			wantAt: at(7), wantLive: []string{"b", "c"}, wantHeld: []string{"c"}, wantChanged: []string{"a", "c", "b"}},
		{name: "changes from elsewhere", from: at(4), update: liveUpdate{To: at(7), Changes: []admission.LiveChange{{ID: "c", Live: true}}},
			wantAt: livePosition{}, wantLive: []string{"a", "b"}, wantHeld: []string{"b"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var k knownLive
			k.apply(livePosition{}, whole)
			changed, all := k.apply(tc.from, tc.update)
			assert.Equal(t, tc.wantAt, k.at)
			assert.ElementsMatch(t, tc.wantLive, keys(k.ids))
			assert.ElementsMatch(t, tc.wantHeld, keys(k.held))
			assert.Equal(t, tc.wantChanged, changed)
			assert.Equal(t, tc.wantAll, all)
		})
	}
}

func keys(m map[string]struct{}) []string {
	out := []string{}
	for k := range m {
		out = append(out, k)
	}
	return out
}
