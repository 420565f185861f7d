package collector

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

const benchTargets, benchSeries = 64, 2000

// benchBodies builds 64 bodies of 2,000 samples each: one gateway, 21 prefill and 42 decode
// instances, each its fixture plus what a busy engine adds — mostly histogram buckets
// (per-stage latencies, token-count histograms, KV transfer), which the collector does not
// read.
func benchBodies(t testing.TB) ([]Target, [][]byte) {
	t.Helper()
	var targets []Target
	var bodies [][]byte
	for i := range benchTargets {
		var tg Target
		var base, prefix, labels string
		switch {
		case i == 0:
			tg, base, prefix, labels = Target{Name: "gateway", Role: RoleGateway}, "gateway", "basin_gateway_", ""
		case i <= 21:
			tg, base, prefix, labels = Target{Name: fmt.Sprintf("prefill-%d", i)}, "sglang_pd_prefill", "sglang:",
				`engine_type="prefill",model_name="qwen3-coder",`
			tg.Role = RolePrefill
		default:
			tg, base, prefix, labels = Target{Name: fmt.Sprintf("decode-%d", i)}, "sglang_pd_decode", "sglang:",
				`engine_type="decode",model_name="qwen3-coder",`
			tg.Role = RoleDecode
		}
		body := fixtureBytes(t, base)
		bodies = append(bodies, pad(body, prefix, labels, benchSeries))
		targets = append(targets, tg)
	}
	return targets, bodies
}

// pad appends histogram families until body has n samples.
func pad(body []byte, prefix, labels string, n int) []byte {
	var b bytes.Buffer
	b.Write(body)
	count := countSampleLines(body)
	stages := []string{"prefill_waiting", "prefill_bootstrap", "prefill_forward", "prefill_transfer_kv_cache",
		"decode_prepare", "decode_bootstrap", "decode_waiting", "decode_transfer", "decode_forward", "decode_detokenize",
		"tokenize", "detokenize", "router_dispatch", "grammar_compile", "queue_admission", "chunked_prefill"}
	for fam := 0; count < n; fam++ {
		name := fmt.Sprintf("%sper_stage_req_latency_seconds_%d", prefix, fam)
		fmt.Fprintf(&b, "# HELP %s Per-stage request latency in seconds.\n# TYPE %s histogram\n", name, name)
		for _, stage := range stages {
			if count >= n {
				break
			}
			cum := 0
			for k := range 21 {
				if count >= n-3 {
					break
				}
				cum += (k * 37) % 101
				le := strings.TrimSuffix(fmt.Sprintf("%.6f", 0.001*math.Pow(2, float64(k))), "0")
				fmt.Fprintf(&b, "%s_bucket{%sle=\"%s\",stage=%q} %d.0\n", name, labels, le, stage, cum)
				count++
			}
			fmt.Fprintf(&b, "%s_bucket{%sle=\"+Inf\",stage=%q} %d.0\n", name, labels, stage, cum)
			fmt.Fprintf(&b, "%s_count{%sstage=%q} %d.0\n", name, labels, stage, cum)
			fmt.Fprintf(&b, "%s_sum{%sstage=%q} %d.25\n", name, labels, stage, cum*3)
			count += 3
		}
	}
	return b.Bytes()
}

func countSampleLines(body []byte) int {
	n := 0
	for _, l := range bytes.Split(body, []byte("\n")) {
		if len(l) > 0 && l[0] != '#' {
			n++
		}
	}
	return n
}

func TestBenchBodies(t *testing.T) {
	targets, bodies := benchBodies(t)
	require.Len(t, bodies, benchTargets)
	c, _, _ := newTest(t, Options{})
	for i, body := range bodies {
		assert := require.New(t)
		assert.Equal(benchSeries, countSampleLines(body), targets[i].Name)
		assert.NoError(c.IngestText(t0, targets[i], bytes.NewReader(body)))
	}
	snap := c.SnapshotAt(t0)
	require.Equal(t, OK, snap.State(DecodeCapacity))
	require.Equal(t, 42*800_000.0, snap.Signals[DecodeCapacity].V)
}

// BenchmarkRawParse64x2000 is the baseline: expfmt's text parser over the 64 bodies.
func BenchmarkRawParse64x2000(b *testing.B) {
	_, bodies := benchBodies(b)
	b.SetBytes(totalLen(bodies))
	b.ReportAllocs()
	for b.Loop() {
		for _, body := range bodies {
			p := expfmt.NewTextParser(model.LegacyValidation)
			if _, err := p.TextToMetricFamilies(bytes.NewReader(body)); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkSnapshot64x2000 is one full pass as Run does it: 64 bodies → readings → windows →
// Snapshot.
func BenchmarkSnapshot64x2000(b *testing.B) {
	targets, bodies := benchBodies(b)
	c, _, _ := newTest(b, Options{})
	now := t0
	b.SetBytes(totalLen(bodies))
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(5 * time.Second)
		for i, body := range bodies {
			if err := c.IngestText(now, targets[i], bytes.NewReader(body)); err != nil {
				b.Fatal(err)
			}
		}
		if c.SnapshotAt(now).State(DecodeCapacity) != OK {
			b.Fatal("no decode capacity")
		}
	}
}

// BenchmarkSnapshotFullParse64x2000 is the same pass with every family parsed (the scrape
// path's parser without its line filter) and Ingest, for comparison with the filtered path.
func BenchmarkSnapshotFullParse64x2000(b *testing.B) {
	targets, bodies := benchBodies(b)
	c, _, _ := newTest(b, Options{})
	now := t0
	b.SetBytes(totalLen(bodies))
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(5 * time.Second)
		for i, body := range bodies {
			fams, err := parseBytes(body)
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Ingest(now, targets[i], fams); err != nil {
				b.Fatal(err)
			}
		}
		if c.SnapshotAt(now).State(DecodeCapacity) != OK {
			b.Fatal("no decode capacity")
		}
	}
}

func totalLen(bodies [][]byte) int64 {
	var n int64
	for _, b := range bodies {
		n += int64(len(b))
	}
	return n
}
