//go:build unix

package gateway

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/internal/yamlconf"
	"github.com/basin-dev/basin/test/redistest"
)

// BenchmarkReplicatedScale is replicated mode at scale, outside CI (docs/scaling.md):
//
//	go test -run '^$' -bench ReplicatedScale -benchtime 1x ./gateway/
//
// Three replicas in this process on a real redis-server (appendfsync everysec), the leader's
// table preloaded with 100,000 live sessions, then new sessions at 10,000 a minute for 20
// seconds, their first calls sent to the followers (and some to the leader, for comparison), and
// calls of sessions live in a follower's core. It reports the first-call round trip (p50, p99),
// the live call's, the leader's hand-over with the table, and the store's memory.
func BenchmarkReplicatedScale(b *testing.B) {
	const (
		preload = 100_000
		perMin  = 10_000
		runFor  = 20 * time.Second
	)
	srv := redistest.Start(b, "everysec")
	up := newFakeUpstream(b, okJSON(1000, 10))
	hs := make([]*harness, 3)
	for i := range hs {
		admin := httptest.NewUnstartedServer(nil)
		cfg := replicaConfig(b, fmt.Sprintf("gw-%d", i), srv.Addr(), admin, up.URL, "")
		cfg.Admission.BudgetTokens, cfg.Admission.ReferenceBudgetTokens = 1<<50, 1<<50
		cfg.Store.LeaseTTL, cfg.Store.OpTimeout = yamlconf.Duration(5*time.Second), yamlconf.Duration(2*time.Second)
		cfg.Replication.ReportInterval = yamlconf.Duration(100 * time.Millisecond)
		hs[i] = startOn(b, cfg, nil, admin)
	}
	leader, fs := leaderOf(b, hs)

	// The table: preload live sessions, as if admitted over the last hour.
	now := time.Now()
	st := admission.State{}
	for i := range preload {
		a := now.Add(-time.Duration(i) * 30 * time.Millisecond)
		st.Live = append(st.Live, admission.LiveSession{ID: fmt.Sprintf("live-%06d", i), Arrival: a, Admitted: a,
			LastDone: now, Context: 20_000 + int64(i%50_000), Peak: 20_000 + int64(i%50_000)})
	}
	_, err := leader.g.core.Merge(now, st)
	require.NoError(b, err)
	start := time.Now()
	leader.g.repl.SaveNow("preload")
	b.Logf("preloaded %d live sessions; the leader's full save took %v", preload, time.Since(start).Round(time.Millisecond))

	call := func(h *harness, id string) (time.Duration, error) {
		t0 := time.Now()
		r, err := h.do(context.Background(), http.MethodPost, "/v1/chat/completions",
			map[string]string{"Content-Type": "application/json", "x-session-id": id}, chatBody(50))
		if err == nil && r.status != http.StatusOK {
			err = fmt.Errorf("%s: %s", id, r)
		}
		return time.Since(t0), err
	}
	// Live sessions' first calls on each follower (one round trip each: the leader knows them),
	// then the calls measured: a live session's call from the follower's own core.
	for i := range 200 {
		for _, f := range fs {
			_, err := call(f, fmt.Sprintf("live-%06d", i))
			require.NoError(b, err)
		}
	}

	var mu sync.Mutex
	lat := map[string][]time.Duration{}
	var errs []error
	record := func(kind string, d time.Duration, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		lat[kind] = append(lat[kind], d)
	}
	b.ResetTimer()
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Minute / perMin)
	defer tick.Stop()
	deadline := time.Now().Add(runFor)
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; time.Now().Before(deadline); n++ {
		<-tick.C
		id := fmt.Sprintf("new-%06d", n)
		via, kind := fs[n%len(fs)], "first call via a follower"
		if n%10 == 9 {
			via, kind = leader, "first call via the leader"
		}
		live := fmt.Sprintf("live-%06d", rng.IntN(200))
		wg.Go(func() { d, err := call(via, id); record(kind, d, err) })
		wg.Go(func() { d, err := call(fs[n%len(fs)], live); record("live call via a follower", d, err) })
	}
	wg.Wait()
	b.StopTimer()
	require.Empty(b, errs)
	for _, kind := range []string{"first call via a follower", "first call via the leader", "live call via a follower"} {
		ds := lat[kind]
		slices.Sort(ds)
		p50, p99 := ds[len(ds)/2], ds[len(ds)*99/100]
		b.Logf("%s: %d calls, p50 %v, p99 %v", kind, len(ds), p50.Round(10*time.Microsecond), p99.Round(10*time.Microsecond))
		unit := strings.ReplaceAll(kind, " ", "_")
		b.ReportMetric(float64(p50.Microseconds()), "µs-p50-"+unit)
		b.ReportMetric(float64(p99.Microseconds()), "µs-p99-"+unit)
	}
	live := leader.state().Live
	b.Logf("live sessions in the leader's table: %d", live)

	// The store's memory with the table in it.
	info, err := srv.Client(b).Info(context.Background(), "memory").Result()
	require.NoError(b, err)
	used := infoField(info, "used_memory")
	b.Logf("redis used_memory: %.1f MiB for %d live sessions (%.0f B a session)", used/(1<<20), live, used/float64(live))
	b.ReportMetric(used/(1<<20), "MiB-redis")

	// Hand-over: the leader stops (releasing its lease); another takes the table.
	start = time.Now()
	require.NoError(b, leader.stop())
	var next *harness
	require.Eventually(b, func() bool {
		for _, f := range fs {
			if v := f.replication(); v.Leading && f.state().Live >= live {
				next = f
				return true
			}
		}
		return false
	}, 30*time.Second, 5*time.Millisecond)
	took := time.Since(start)
	b.Logf("hand-over to %s with %d sessions: %v (a crashed leader: its lease TTL, %v, plus this)", next.replication().ReplicaID,
		live, took.Round(time.Millisecond), time.Duration(next.cfg.Store.LeaseTTL))
	b.ReportMetric(float64(took.Milliseconds()), "ms-handover")
}

// infoField reads a numeric field of Redis' INFO output.
func infoField(info, name string) float64 {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}
