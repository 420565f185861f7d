package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/basin-dev/basin/collector"
	"github.com/basin-dev/basin/gateway"
	"github.com/basin-dev/basin/gateway/adminapi"
	"github.com/basin-dev/basin/gateway/admission"
	"github.com/basin-dev/basin/internal/scaledclock"
	"github.com/basin-dev/basin/test/testclock"
)

// benchWarmSteps is how many steps the daemon takes before its heap is measured: more than
// historyLen, so the status page's history is full and the measurement does not depend on how
// many iterations the benchmark happened to run.
const benchWarmSteps = historyLen + 40

// BenchmarkStepSessions is one daemon step (scrape the engines and the gateway over HTTP, detect,
// poll the gateway's /admin/state?queue_tail=16, decide) in front of a real gateway holding N live
// sessions, restored from a state file as after a restart.
//
// Metrics: ns/op, B/op and allocs/op are the step (the in-process gateway's answers included);
// daemon-heap-MiB is the live heap after a forced GC once the daemon has taken benchWarmSteps
// steps, minus the same just before the daemon was built (the gateway, its N sessions and what
// it keeps from answering are already in the baseline; the HTTP connections the daemon opens are
// not); heap-MiB is the whole process's live heap at the end (gateway included).
func BenchmarkStepSessions(b *testing.B) {
	for _, live := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("live=%d", live), func(b *testing.B) { benchStep(b, live) })
	}
}

func benchStep(b *testing.B, live int) {
	dir := b.TempDir()
	dep := healthy()
	var depMu sync.Mutex
	engine := func(body func() string) *httptest.Server {
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			depMu.Lock()
			s := body()
			depMu.Unlock()
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = io.WriteString(w, s)
		}))
		return ts
	}
	// The servers are closed by defer, not b.Cleanup: the testing package keeps a finished
	// benchmark's cleanup closures, which would keep this run's gateway alive during the next -count
	// run and into its heap measurement.
	prefill := engine(dep.prefill)
	defer prefill.Close()
	decode := engine(dep.decode)
	defer decode.Close()

	// The gateway's state file: live sessions whose contexts add up to the prefill cache, so the
	// deployment stays healthy and the policy has nothing to do.
	now := time.Now().UTC()
	perSession := int64(testCapacity / live)
	st := struct {
		Version   int               `json:"version"`
		SavedAt   time.Time         `json:"saved_at"`
		Admission admission.State   `json:"admission"`
		Upstreams map[string]string `json:"upstreams"`
	}{Version: 1, SavedAt: now, Upstreams: make(map[string]string, live),
		Admission: admission.State{Budget: 4 * testCapacity, ReferenceBudget: 4 * testCapacity,
			Live: make([]admission.LiveSession, live)}}
	for i := range live {
		id := fmt.Sprintf("session-%07d", i)
		st.Admission.Live[i] = admission.LiveSession{ID: id, Arrival: now.Add(-time.Minute), Admitted: now.Add(-time.Minute),
			LastDone: now, Context: perSession, Peak: perSession, PredictedPeak: perSession}
		st.Upstreams[id] = prefill.URL
	}
	data, err := json.Marshal(st)
	if err != nil {
		b.Fatal(err)
	}
	statePath := filepath.Join(dir, "gateway-state.json")
	writeFile(b, statePath, string(data))

	const gwToken = "bench-gateway-admin-token"
	gcfg, err := gateway.ParseConfig([]byte(fmt.Sprintf("upstreams: [%s]\nidle_timeout: 24h\nadmission: {budget_tokens: %d}\nstate_file: %s\n", prefill.URL, 4*testCapacity, statePath)))
	if err != nil {
		b.Fatal(err)
	}
	g, err := gateway.New(gateway.Options{Config: gcfg, Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler),
		Getenv: func(k string) string {
			if k == gateway.AdminTokenEnv {
				return gwToken
			}
			return ""
		}})
	if err != nil {
		b.Fatal(err)
	}
	gwAdmin := httptest.NewServer(g.AdminHandler())
	defer gwAdmin.Close()

	writeFile(b, filepath.Join(dir, "token"), testToken+"\n")
	writeFile(b, filepath.Join(dir, "gateway-token"), gwToken+"\n")
	if err := testCalibration().Save(filepath.Join(dir, "calibration.json")); err != nil {
		b.Fatal(err)
	}
	cfgYAML := fmt.Sprintf(`deployment: bench
token_file: token
data_dir: data
calibration: calibration.json
collector:
  targets:
    - {name: prefill-0, url: %q, role: prefill, dialect: sglang}
    - {name: decode-0, url: %q, role: decode, dialect: sglang}
    - {name: gateway, url: %q, role: gateway, dialect: basin-gateway}
gateway:
  admin_url: %q
  token_file: gateway-token
cron: {daily_summary: "-", knee_reestimate: "-"}
`, prefill.URL, decode.URL, gwAdmin.URL+"/metrics", gwAdmin.URL)
	writeFile(b, filepath.Join(dir, "basin.yaml"), cfgYAML)
	cfg, err := LoadConfig(filepath.Join(dir, "basin.yaml"))
	if err != nil {
		b.Fatal(err)
	}

	// Check the gateway restored every session before measuring anything.
	code, body := call(b, http.MethodGet, gwAdmin.URL+"/admin/state?queue_tail=0", gwToken, "")
	var view adminapi.StateView
	if code != http.StatusOK || json.Unmarshal(body, &view) != nil || view.Live != live {
		b.Fatalf("gateway state: %d, %d live sessions, want %d: %.200s", code, view.Live, live, body)
	}

	// Warm the gateway's side of the conversation before the baseline, so that what it keeps from
	// answering (buffers, pools) is not counted as the daemon's.
	for range 20 {
		for _, path := range []string{"/metrics", "/admin/state?queue_tail=16"} {
			if code, body := call(b, http.MethodGet, gwAdmin.URL+path, gwToken, ""); code != http.StatusOK {
				b.Fatalf("GET %s: %d %.200s", path, code, body)
			}
		}
	}
	clk := testclock.New(t0)
	wall, err := scaledclock.New(1, clk.Now)
	if err != nil {
		b.Fatal(err)
	}
	baseline := heapInUse()
	d, err := New(cfg, Options{Clock: wall, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	targets := d.col.Targets()
	// step is one loop iteration as Serve runs it: one scrape round, then Step.
	step := func() {
		depMu.Lock()
		dep.advance(stepEvery)
		depMu.Unlock()
		at := clk.Advance(stepEvery)
		for _, t := range targets {
			scrapeInto(b, d.col, at, t)
		}
		d.Step(ctx)
	}
	for range benchWarmSteps {
		step()
	}
	if s := d.StatusNow(); s.Gateway == nil || s.Gateway.Error != "" || s.Gateway.Live != live || s.StepError != "" {
		b.Fatalf("step: gateway %+v, step error %q, state %s %q", s.Gateway, s.StepError, s.Assessment.State, s.Assessment.Blind)
	}
	retained := heapInUse() - baseline

	b.ReportAllocs()
	for b.Loop() {
		step()
	}
	b.StopTimer()
	b.ReportMetric(float64(retained)/(1<<20), "daemon-heap-MiB")
	b.ReportMetric(float64(heapInUse())/(1<<20), "heap-MiB")
	runtime.KeepAlive(d)
	runtime.KeepAlive(g)
}

// scrapeInto GETs a target's exposition and ingests it as a scrape does.
func scrapeInto(b *testing.B, c *collector.Collector, at time.Time, t collector.Target) {
	resp, err := http.Get(t.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("scrape %s: %s", t.Name, resp.Status)
	}
	if err := c.IngestText(at, t, resp.Body); err != nil {
		b.Fatal(err)
	}
}

// heapInUse is the live heap after a forced collection: the bytes of reachable objects
// (MemStats.HeapAlloc right after a GC), which unlike HeapInuse does not count the free space of
// partly used spans.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

func writeFile(b *testing.B, path, s string) {
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		b.Fatal(err)
	}
}
