package collector

import (
	"bytes"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// parseBytes parses a body in the Prometheus text exposition format (0.0.4 or 1.0.0) into metric
// families keyed by family name. Names are checked with the legacy scheme first (which accepts
// the colons of sglang: and vllm: names) and, if that rejects the body, with the UTF-8 scheme,
// which also accepts quoted names. _created families, missing HELP lines and NaN or ±Inf values
// are kept as they are; the collector ignores what it does not read. Duplicate series are kept
// too (the collector uses the first of each).
func parseBytes(body []byte) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err == nil {
		return fams, nil
	}
	u := expfmt.NewTextParser(model.UTF8Validation)
	fams, uerr := u.TextToMetricFamilies(bytes.NewReader(body))
	if uerr != nil {
		return nil, uerr
	}
	return fams, nil
}

// scanInfo is what filterText learns from every line of a body, read or not.
type scanInfo struct {
	samples int
	// Dialect hints: a sample name with the sglang:, vllm: or basin_gateway_ prefix was seen.
	sglang, vllm, gateway bool
}

// dialect returns the detected dialect, DialectAuto when none (or more than one engine kind)
// was seen. The gateway wins over engines only when no engine prefix was seen.
func (s scanInfo) dialect() Dialect {
	switch {
	case s.sglang && !s.vllm:
		return DialectSGLang
	case s.vllm && !s.sglang:
		return DialectVLLM
	case s.gateway && !s.sglang && !s.vllm:
		return DialectGateway
	}
	return DialectAuto
}

// filterText appends to dst the lines of src that belong to families the collector reads
// (HELP/TYPE comments and samples), dropping the rest before the comparatively slow expfmt
// parser sees them: a scrape of an engine is mostly histogram buckets the collector never reads.
// Lines it cannot attribute (quoted UTF-8 names) are kept, and so is a last line without its
// newline, so a truncated body still fails to parse. Every sample line is counted.
func filterText(dst *bytes.Buffer, src []byte) scanInfo {
	var info scanInfo
	for len(src) > 0 {
		var line []byte
		if i := bytes.IndexByte(src, '\n'); i >= 0 {
			line, src = src[:i+1], src[i+1:]
		} else {
			line, src = src, nil
			dst.Write(line)
			if len(bytes.TrimSpace(line)) > 0 && !bytes.HasPrefix(bytes.TrimLeft(line, " \t"), []byte("#")) {
				info.samples++
			}
			break
		}
		rest := bytes.TrimLeft(line, " \t")
		if len(rest) == 0 || rest[0] == '\n' {
			continue
		}
		if rest[0] == '#' {
			name, ok := commentName(rest[1:])
			if ok && (len(name) > 0 && name[0] == '"' || wantedName(name)) {
				dst.Write(line)
			}
			continue
		}
		info.samples++
		if rest[0] == '{' {
			dst.Write(line)
			continue
		}
		name := rest[:nameEnd(rest)]
		switch {
		case bytes.HasPrefix(name, prefixSGLang):
			info.sglang = true
		case bytes.HasPrefix(name, prefixVLLM):
			info.vllm = true
		case bytes.HasPrefix(name, prefixGateway):
			info.gateway = true
		}
		if wantedName(name) {
			dst.Write(line)
		}
	}
	return info
}

var (
	prefixSGLang  = []byte("sglang:")
	prefixVLLM    = []byte("vllm:")
	prefixGateway = []byte("basin_gateway_")
	commentHelp   = []byte("HELP")
	commentType   = []byte("TYPE")
)

// commentName returns the metric name of a HELP or TYPE comment (after the '#'); ok is false
// for other comments.
func commentName(c []byte) (name []byte, ok bool) {
	c = bytes.TrimLeft(c, " \t")
	if !bytes.HasPrefix(c, commentHelp) && !bytes.HasPrefix(c, commentType) {
		return nil, false
	}
	c = c[4:]
	if len(c) == 0 || (c[0] != ' ' && c[0] != '\t') {
		return nil, false
	}
	c = bytes.TrimLeft(c, " \t")
	return c[:nameEnd(c)], true
}

// nameEnd is the length of the metric name at the start of b: up to a brace, a blank or the
// newline.
func nameEnd(b []byte) int {
	for i, ch := range b {
		switch ch {
		case '{', ' ', '\t', '\n':
			return i
		}
	}
	return len(b)
}

// wantedName reports whether a metric name (a family, or a histogram's _bucket/_sum/_count
// series) is one the collector reads.
func wantedName(name []byte) bool {
	if _, ok := wantedFamilies[string(name)]; ok {
		return true
	}
	for _, suffix := range [...]string{"_bucket", "_count", "_sum"} {
		if bytes.HasSuffix(name, []byte(suffix)) {
			_, ok := wantedHistograms[string(name[:len(name)-len(suffix)])]
			return ok
		}
	}
	return false
}

// detectFamilies finds the dialect from family names, as filterText does from sample names.
func detectFamilies(fams map[string]*dto.MetricFamily) Dialect {
	var info scanInfo
	for name := range fams {
		switch {
		case len(name) >= len(prefixSGLang) && name[:len(prefixSGLang)] == string(prefixSGLang):
			info.sglang = true
		case len(name) >= len(prefixVLLM) && name[:len(prefixVLLM)] == string(prefixVLLM):
			info.vllm = true
		case len(name) >= len(prefixGateway) && name[:len(prefixGateway)] == string(prefixGateway):
			info.gateway = true
		}
	}
	return info.dialect()
}

// countSamples counts the samples of parsed or gathered families the way the text format shows
// them (a histogram is its buckets plus _sum and _count).
func countSamples(fams map[string]*dto.MetricFamily) int {
	n := 0
	for _, mf := range fams {
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetHistogram() != nil:
				n += len(m.GetHistogram().GetBucket()) + 2
			case m.GetSummary() != nil:
				n += len(m.GetSummary().GetQuantile()) + 2
			default:
				n++
			}
		}
	}
	return n
}
