package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte("upstreams: [http://127.0.0.1:8000]\nadmission: {budget_tokens: 5000}\n"))
	require.NoError(t, err)
	assert.Equal(t, DefaultListen, c.Listen)
	assert.Equal(t, DefaultAdminListen, c.AdminListen)
	assert.Equal(t, defaultSessionHeaders, c.SessionHeaders)
	assert.Equal(t, Duration(10*time.Minute), c.IdleTimeout)
	assert.Equal(t, Duration(30*time.Second), c.MaxQueueWait)
	assert.Equal(t, int64(16<<20), c.MaxBodyBytes)
	assert.Equal(t, "current", c.Admission.Mode)
	assert.Equal(t, "X-SMG-Routing-Key", c.Affinity.Header)
	assert.False(t, c.Affinity.Enabled)
	assert.False(t, c.RejectAnonymous)
}

func TestParseConfigReplicationDefaults(t *testing.T) {
	c, err := ParseConfig([]byte("upstreams: [http://127.0.0.1:8000]\nadmission: {budget_tokens: 5000}\n" +
		"store: {url: \"redis://redis:6379/0\"}\nreplication: {replica_id: gw-0, advertise_url: \"http://10.0.0.5:8081\"}\n"))
	require.NoError(t, err)
	assert.Equal(t, "basin", c.Store.Prefix)
	assert.Equal(t, DefaultLeaseTTL, time.Duration(c.Store.LeaseTTL))
	assert.Equal(t, DefaultReportInterval, time.Duration(c.Replication.ReportInterval))
	assert.Equal(t, DegradedLocalSlice, c.Replication.DegradedAdmission)
	assert.Equal(t, "gw-0", c.Replication.ReplicaID)
}

func TestParseConfigErrorsNameKeyAndLine(t *testing.T) {
	const ok = "upstreams: [http://127.0.0.1:8000]\nadmission:\n  budget_tokens: 5000\n"
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown top-level key", ok + "lisen: 127.0.0.1:1\n", []string{"line 4", `unknown key "lisen"`}},
		{"unknown nested key", "upstreams: [http://127.0.0.1:8000]\nadmission:\n  budget_tokens: 5000\n  budjet: 3\n",
			[]string{"line 4", `unknown key "budjet"`}},
		{"wrong type", ok + "max_body_bytes: lots\n", []string{"line 4", "max_body_bytes", "lots"}},
		{"bad duration", ok + "max_queue_wait: soon\n", []string{"line 4", "max_queue_wait", `duration "soon"`}},
		{"negative duration", ok + "idle_timeout: -1s\n", []string{"line 4", "idle_timeout", "negative"}},
		{"no upstreams", "admission: {budget_tokens: 5}\n", []string{"upstreams: required"}},
		{"bad upstream scheme", "admission: {budget_tokens: 5}\nupstreams:\n  - http://a:1\n  - ftp://b\n",
			[]string{"line 4", "upstreams.1", "http or https"}},
		{"no budget", "upstreams: [http://a:1]\n", []string{"admission.budget_tokens: required"}},
		{"zero budget", "upstreams: [http://a:1]\nadmission:\n  budget_tokens: 0\n",
			[]string{"line 3", "admission.budget_tokens: must be > 0"}},
		{"bad mode", ok + "  mode: greedy\n", []string{"line 4", "admission.mode", `"greedy"`}},
		{"negative quota", ok + "  quotas:\n    acme: -1\n", []string{"line 5", "admission.quotas.acme"}},
		{"hold bound past the SDKs' timeout", ok + "  hold_bound: 12m\n", []string{"line 4", "admission.hold_bound", "under 10m0s"}},
		{"negative max lead", ok + "  max_lead: -1s\n", []string{"line 4", "admission.max_lead"}},
		{"bad header name", ok + "tenant_header: \"x tenant\"\n", []string{"line 4", "tenant_header"}},
		{"bad listen", ok + "listen: localhost\n", []string{"line 4", "listen", "host:port"}},
		{"empty session headers", ok + "session_headers: []\n", []string{"line 4", "session_headers"}},
		{"not YAML", "upstreams: [\n", []string{"line"}},
		{"count only with a budget", "upstreams: [http://a:1]\nadmission:\n  count_only: true\n  budget_tokens: 1000000000000\n",
			[]string{"line 4", "admission.budget_tokens: leave it out with count_only: true"}},
		{"count only with a reference budget", "upstreams: [http://a:1]\nadmission:\n  count_only: true\n  reference_budget_tokens: 5\n",
			[]string{"line 4", "admission.reference_budget_tokens: leave it out"}},
		{"no budget names count_only", "upstreams: [http://a:1]\n", []string{"count_only: true"}},
		{"replication without a store", ok + "replication:\n  replica_id: a\n",
			[]string{"line 5", "replication.replica_id: needs store.url"}},
		{"store fields without a url", ok + "store:\n  prefix: basin:prod\n", []string{"store.url: required"}},
		{"bad store url", ok + "store:\n  url: http://redis:6379\nreplication:\n  advertise_url: http://a:1\n",
			[]string{"line 5", "store.url"}},
		{"no advertise url", ok + "store:\n  url: redis://redis:6379\n", []string{"replication.advertise_url: required"}},
		{"state file with a store", ok + "state_file: s.json\nstore:\n  url: redis://redis:6379\nreplication:\n  advertise_url: http://a:1\n",
			[]string{"line 4", "state_file: leave it out with a store"}},
		{"bad degraded admission", ok + "store:\n  url: redis://redis:6379\nreplication:\n  advertise_url: http://a:1\n  degraded_admission: guess\n",
			[]string{"line 8", "replication.degraded_admission", `"guess"`}},
		{"report interval over half the lease", ok + "store:\n  url: redis://redis:6379\n  lease_ttl: 1s\nreplication:\n  advertise_url: http://a:1\n  report_interval: 600ms\n",
			[]string{"line 9", "replication.report_interval"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestExampleConfigParses(t *testing.T) {
	c, err := LoadConfig("testdata/gateway.example.yaml")
	require.NoError(t, err)
	assert.Equal(t, []string{"http://127.0.0.1:8000"}, c.Upstreams)
	assert.Equal(t, int64(1500000), c.Admission.BudgetTokens)
	assert.Equal(t, int64(1200000), c.Admission.ReferenceBudgetTokens)
	assert.Equal(t, map[string]int{"batch-evals": 20}, c.Admission.Quotas)
	assert.Equal(t, "x-tenant-id", c.TenantHeader)
	assert.Equal(t, defaultSessionHeaders, c.SessionHeaders)
	// Relative paths are resolved against the file's directory.
	assert.Equal(t, filepath.Join("testdata", "admin-token"), c.AdminTokenFile)
	assert.Equal(t, filepath.Join("testdata", "gateway-state.json"), c.StateFile)
	assert.Empty(t, c.Record.Path)
}

func TestLoadConfigNamesTheFile(t *testing.T) {
	_, err := LoadConfig(filepath.Join(t.TempDir(), "nope.yaml"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "nope.yaml")

	p := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(p, []byte("upstreams: [http://a:1]\nadmission: {budget_tokens: 1}\ncolour: red\n"), 0o600))
	_, err = LoadConfig(p)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad.yaml")
	assert.Contains(t, err.Error(), `line 3: unknown key "colour"`)
}

func TestNewFailsWithANamedCause(t *testing.T) {
	t.Run("no admin token", func(t *testing.T) {
		c := baseConfig(t, []string{"http://127.0.0.1:1"}, func(c *Config) { c.AdminTokenFile = "" })
		_, err := New(Options{Config: c, Getenv: func(string) string { return "" }})
		require.Error(t, err)
		assert.Contains(t, err.Error(), AdminTokenEnv)
		assert.Contains(t, err.Error(), "admin_token_file")
	})
	t.Run("token from the environment", func(t *testing.T) {
		c := baseConfig(t, []string{"http://127.0.0.1:1"}, func(c *Config) { c.AdminTokenFile = "" })
		g, err := New(Options{Config: c, Getenv: func(k string) string {
			if k == AdminTokenEnv {
				return "from-env"
			}
			return ""
		}})
		require.NoError(t, err)
		assert.Equal(t, []byte("from-env"), g.token)
	})
	t.Run("missing predictor model", func(t *testing.T) {
		model := filepath.Join(t.TempDir(), "peak-model.json")
		c := baseConfig(t, []string{"http://127.0.0.1:1"}, func(c *Config) { c.Predictor.Model = model })
		_, err := New(Options{Config: c})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "peak-model.json")
	})
	t.Run("corrupt state file", func(t *testing.T) {
		state := filepath.Join(t.TempDir(), "state.json")
		require.NoError(t, os.WriteFile(state, []byte(`{"version":1,"admission":{"live":[{"id":`), 0o600))
		c := baseConfig(t, []string{"http://127.0.0.1:1"}, func(c *Config) { c.StateFile = state })
		_, err := New(Options{Config: c})
		require.Error(t, err)
		assert.Contains(t, err.Error(), state)
		assert.Contains(t, err.Error(), "corrupt")
	})
}

func TestParseConfigCountOnly(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		countOnly  bool
		budget     int64
	}{
		{"count only needs no budget", "upstreams: [http://a:1]\nadmission: {count_only: true}\n", true, 0},
		{"the old out-of-reach budget stays valid", "upstreams: [http://a:1]\nadmission: {budget_tokens: 1000000000000}\n",
			false, 1_000_000_000_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.yaml))
			require.NoError(t, err)
			assert.Equal(t, tc.countOnly, c.Admission.CountOnly)
			assert.Equal(t, tc.budget, c.Admission.BudgetTokens)
		})
	}
}

// TestParseConfigReportsEveryBadValue: a file with several bad values hears of all of them at
// once, each with its key and line — the admission block's included when another block is bad
// too (an infinite priority_tokens_per_sec used to be reported only once the rest was right).
func TestParseConfigReportsEveryBadValue(t *testing.T) {
	for _, tc := range []struct {
		name string
		yaml string
		want []string
	}{
		{"every block", `listen: nope
upstreams: [ftp://x]
max_body_bytes: -1
admission:
  mode: bogus
  budget_tokens: -5
  tenant_quota: -1
affinity: {header: "bad header"}
replication:
  replica_id: x
`, []string{`line 1: listen: want host:port`, `line 2: upstreams.0: want an http or https URL`, `line 3: max_body_bytes: must be > 0`,
			`line 5: admission.mode: want current or peak`, `line 6: admission.budget_tokens: must be > 0`,
			`line 7: admission.tenant_quota: must be ≥ 0`, `line 8: affinity.header: not a header name`,
			`line 10: replication.replica_id: needs store.url`}},
		{"infinite priority beside a bad listen", `listen: nope
upstreams: [http://x]
admission: {budget_tokens: 100, priority_tokens_per_sec: .inf}
`, []string{`line 1: listen: want host:port`, `line 3: admission.priority_tokens_per_sec: must be a finite number > 0, got +Inf`}},
		{"not a number", `upstreams: [http://x]
admission: {budget_tokens: 100, priority_tokens_per_sec: .nan}
`, []string{`line 2: admission.priority_tokens_per_sec: must be a finite number > 0, got NaN`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.Len(t, strings.Split(strings.TrimSpace(err.Error()), "\n"), len(tc.want), "one line a problem, each once: %v", err)
		})
	}
}

// The queue's lead cap and dormancy reach the admission core as written; disable_dormancy turns
// dormancy off (the core's negative floor).
func TestAdmissionQueueAndDormancyKeys(t *testing.T) {
	for _, tc := range []struct {
		name, yaml  string
		lead, floor time.Duration
	}{
		{"defaults", "", 0, 0},
		{"set", "  max_lead: 15s\n  dormant_floor: 5m\n", 15 * time.Second, 5 * time.Minute},
		{"dormancy off", "  dormant_floor: 5m\n  disable_dormancy: true\n", 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte("upstreams: [http://127.0.0.1:8000]\nadmission:\n  budget_tokens: 5000\n" + tc.yaml))
			require.NoError(t, err)
			o := c.admissionOptions()
			assert.Equal(t, tc.lead, o.MaxLead)
			assert.Equal(t, tc.floor, o.DormantFloor)
			require.NoError(t, o.Validate())
		})
	}
}

// Values that fail to decode are reported together too (the decoder's own "; " form).
func TestParseConfigReportsEveryBadDuration(t *testing.T) {
	_, err := ParseConfig([]byte("upstreams: [http://x]\nidle_timeout: xyz\nmax_queue_wait: 5q\nadmission: {budget_tokens: 100}\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `line 2: idle_timeout: duration "xyz"`)
	assert.Contains(t, err.Error(), `line 3: max_queue_wait: duration "5q"`)
}
