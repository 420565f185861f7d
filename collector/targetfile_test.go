package collector

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadTargetFile(t *testing.T) {
	for _, tc := range []struct {
		name, file, body string
		want             []Target
		err              []string
	}{
		{
			name: "json", file: "t.json",
			body: `[
  {"targets": ["10.0.0.1:30000"], "labels": {"role": "prefill", "dialect": "sglang", "name": "prefill-0"}},
  {"targets": ["10.0.0.2:30000", "10.0.0.3:30000"], "labels": {"role": "decode", "name": "decode"}},
  {"targets": ["gw.internal:8081"], "labels": {"role": "gateway", "__scheme__": "https", "__metrics_path__": "/admin/metrics", "zone": "a"}}
]`,
			want: []Target{
				{Name: "prefill-0", URL: "http://10.0.0.1:30000/metrics", Role: RolePrefill, Dialect: DialectSGLang},
				{Name: "decode@10.0.0.2:30000", URL: "http://10.0.0.2:30000/metrics", Role: RoleDecode, Dialect: DialectAuto},
				{Name: "decode@10.0.0.3:30000", URL: "http://10.0.0.3:30000/metrics", Role: RoleDecode, Dialect: DialectAuto},
				{Name: "gw.internal:8081", URL: "https://gw.internal:8081/admin/metrics", Role: RoleGateway, Dialect: DialectAuto},
			},
		},
		{
			name: "yaml", file: "t.yaml",
			body: "- targets: ['[::1]:8000']\n  labels: {role: unified, dialect: vllm}\n",
			want: []Target{{Name: "[::1]:8000", URL: "http://[::1]:8000/metrics", Role: RoleUnified, Dialect: DialectVLLM}},
		},
		{name: "empty json list", file: "t.json", body: "[]", want: nil},
		{name: "empty yaml", file: "t.yml", body: "", want: nil},
		{name: "not json", file: "t.json", body: "[\n  {\"targets\": [\"h:1\"]},\n  {\"targets\": 7}\n]", err: []string{`t.json:3: json: field "targets": got a number, want a list of "host:port" strings`}},
		{name: "not a list", file: "t.json", body: `{"targets": ["h:1"]}`, err: []string{"t.json:1: json: got an object, want a list of target groups"}},
		{name: "not yaml", file: "t.yaml", body: "- targets: [h:1]\n  labels: {role: decode\n", err: []string{"t.yaml: yaml: line"}},
		{name: "unknown field", file: "t.json", body: `[{"targets": ["h:1"], "labels": {"role": "decode"}, "weight": 2}]`, err: []string{"unknown field"}},
		{name: "missing role", file: "t.json", body: `[{"targets": ["h:1"]}]`, err: []string{`t.json:1: group 0 target 0 "h:1"`, "role: must be one of"}},
		{name: "json: the target's own line", file: "t.json",
			body: "[\n  {\"targets\": [\"h:1\"], \"labels\": {\"role\": \"decode\"}},\n  {\"labels\": {\"role\": \"decode\"},\n   \"targets\": [\n     \"h:2\",\n     \"http://h:3\"]}\n]",
			err:  []string{`t.json:6: group 1 target 1 "http://h:3": want host or host:port`}},
		{name: "yaml: the target's own line", file: "t.yaml",
			body: "- targets: [h:1]\n  labels: {role: decode}\n- labels: {role: prefill}\n  targets:\n    - h:2\n    - h 3\n- targets: []\n  labels: {role: decode}\n",
			err:  []string{`t.yaml:6: group 1 target 1 "h 3"`, "t.yaml:7: group 2: no targets"}},
		{name: "role and dialect mismatch", file: "t.json", body: `[{"targets": ["h:1"], "labels": {"role": "gateway", "dialect": "vllm"}}]`,
			err: []string{"does not fit role gateway"}},
		{name: "url instead of address", file: "t.json", body: `[{"targets": ["http://h:1/metrics"], "labels": {"role": "decode"}}]`,
			err: []string{"want host or host:port"}},
		{name: "no targets", file: "t.json", body: `[{"targets": [], "labels": {"role": "decode"}}]`, err: []string{"t.json:1: group 0: no targets"}},
		{name: "duplicate names", file: "t.json", body: `[{"targets": ["h:1"], "labels": {"role": "decode", "name": "d"}}, {"targets": ["h:2"], "labels": {"role": "decode", "name": "d"}}]`,
			err: []string{`name "d" used twice`}},
		{name: "bad scheme", file: "t.json", body: `[{"targets": ["h:1"], "labels": {"role": "decode", "__scheme__": "ftp"}}]`,
			err: []string{"scheme must be http or https"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), tc.file)
			require.NoError(t, os.WriteFile(path, []byte(tc.body), 0o600))
			got, err := loadTargetFile(path)
			if len(tc.err) > 0 {
				require.Error(t, err)
				for _, e := range tc.err {
					assert.Contains(t, err.Error(), e)
				}
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// TestTargetFileReload adds a target, removes it, and survives a corrupt file.
func TestTargetFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "targets.json")
	mtime := time.Now().Add(-time.Hour)
	write := func(body string) {
		t.Helper()
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
		// Every version gets a distinct modification time, whatever the file system's
		// resolution.
		mtime = mtime.Add(time.Second)
		require.NoError(t, os.Chtimes(path, mtime, mtime))
	}
	one := `[{"targets": ["127.0.0.1:30001"], "labels": {"role": "prefill", "name": "prefill-0"}}]`
	two := `[{"targets": ["127.0.0.1:30001"], "labels": {"role": "prefill", "name": "prefill-0"}},
	         {"targets": ["127.0.0.1:30002"], "labels": {"role": "decode", "name": "decode-0"}}]`
	write(one)

	static := Target{Name: "gateway", URL: "http://127.0.0.1:8081/metrics", Role: RoleGateway}
	var logs bytes.Buffer
	c, reg, _ := newTest(t, Options{Targets: []Target{static}, TargetFile: path, Logger: slogTo(&logs)})
	names := func() []string {
		var out []string
		for _, t := range c.Targets() {
			out = append(out, t.Name)
		}
		return out
	}
	fileErrors := func() float64 {
		v, _ := metricValue(gather(t, reg), "basin_target_file_errors_total", map[string]string{})
		return v
	}
	require.Equal(t, []string{"gateway", "prefill-0"}, names())

	// Unchanged: nothing happens.
	c.reloadTargetFile()
	assert.Equal(t, []string{"gateway", "prefill-0"}, names())

	write(two)
	c.reloadTargetFile()
	assert.Equal(t, []string{"decode-0", "gateway", "prefill-0"}, names())
	require.NoError(t, c.Ingest(t0, Target{Name: "decode-0", Role: RoleDecode}, fixture(t, "sglang_pd_decode")))
	assertSignals(t, c.SnapshotAt(t0), map[Signal]want{DecodeCapacity: ok(800_000)})
	_, found := metricValue(gather(t, reg), "basin_scrape_samples", map[string]string{"target": "decode-0"})
	assert.True(t, found)
	n, _ := metricValue(gather(t, reg), "basin_targets", map[string]string{"role": "decode", "dialect": "sglang"})
	assert.Equal(t, 1.0, n)

	write(one)
	c.reloadTargetFile()
	assert.Equal(t, []string{"gateway", "prefill-0"}, names())
	_, found = metricValue(gather(t, reg), "basin_scrape_samples", map[string]string{"target": "decode-0"})
	assert.False(t, found, "a removed target's series go")
	// Its last value is kept (and goes stale); it no longer has fresh inputs.
	assert.Equal(t, Stale, c.SnapshotAt(t0.Add(time.Minute)).State(DecodeCapacity))

	for _, bad := range []struct{ body, problem string }{
		{`[{"targets": ["127.0.0.1:30003"], "labels": {"role": "prefil"}}]`, "role: must be one of"},
		{`[{"targets": ["127.0.0.1:30003"], "labels": {"role": "gateway", "name": "gateway"}}]`, "name already used by a configured target"},
		{`[{"targets": ["127.0.0.1:30003"],`, "json:"},
	} {
		logs.Reset()
		before := fileErrors()
		write(bad.body)
		c.reloadTargetFile()
		c.reloadTargetFile() // the same problem is reported once
		assert.Equal(t, []string{"gateway", "prefill-0"}, names(), "the previous list stays")
		assert.Equal(t, before+1, fileErrors())
		assert.Contains(t, logs.String(), path)
		assert.Contains(t, logs.String(), bad.problem)
	}

	// The file disappears: reported once, the list stays.
	before := fileErrors()
	require.NoError(t, os.Remove(path))
	c.reloadTargetFile()
	c.reloadTargetFile()
	assert.Equal(t, before+1, fileErrors())
	assert.Equal(t, []string{"gateway", "prefill-0"}, names())

	write(two)
	c.reloadTargetFile()
	assert.Equal(t, []string{"decode-0", "gateway", "prefill-0"}, names())
}
