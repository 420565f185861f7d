package collector

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Labels of a file_sd target group that the collector reads; every other label is ignored.
const (
	fileLabelRole    = "role"             // required: prefill, decode, unified or gateway
	fileLabelDialect = "dialect"          // optional: auto (default), sglang, vllm, basin-gateway
	fileLabelName    = "name"             // optional: the target's name (default host:port)
	fileLabelPath    = "__metrics_path__" // optional: default /metrics
	fileLabelScheme  = "__scheme__"       // optional: http (default) or https
)

// fileGroup is one target group of a Prometheus file_sd file.
type fileGroup struct {
	Targets []string          `json:"targets" yaml:"targets"`
	Labels  map[string]string `json:"labels" yaml:"labels"`
}

// fileStamp identifies a version of the target file without reading it.
type fileStamp struct {
	mod  time.Time
	size int64
}

// statTargetFile returns the file's stamp.
func statTargetFile(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}, nil
}

// loadTargetFile reads and checks a file_sd file. JSON unless the name ends in .yml or .yaml.
func loadTargetFile(path string) ([]Target, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var groups []fileGroup
	var lines []groupLines
	switch strings.ToLower(filepath.Ext(path)) {
	case ".yml", ".yaml":
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		// An empty document is an empty list, as an empty JSON array is.
		if err := dec.Decode(&groups); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: %w", path, err) // yaml's own message names the line
		}
		lines = yamlLines(data)
	default:
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&groups); err != nil {
			return nil, fmt.Errorf("%s: %w", jsonAt(path, data, err, dec.InputOffset()), plainJSONError(err))
		}
		if dec.More() {
			return nil, fmt.Errorf("%s: json: data after the top-level array", jsonAt(path, data, nil, dec.InputOffset()))
		}
		lines = jsonLines(data)
	}
	return targetsFromGroups(path, groups, lines)
}

// jsonAt is path:line of a JSON decoding error: its own offset when it has one (syntax and type
// errors), else where the decoder stopped.
func jsonAt(path string, data []byte, err error, stopped int64) string {
	off := stopped
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		off = syn.Offset
	case errors.As(err, &typ):
		off = typ.Offset
	}
	off = min(max(off, 0), int64(len(data)))
	return fmt.Sprintf("%s:%d", path, bytes.Count(data[:off], []byte("\n"))+1)
}

// plainJSONError says a type mismatch in the file's terms (the field, a JSON kind) rather than
// encoding/json's, which names Go types ("Go struct field fileGroup.targets of type []string").
func plainJSONError(err error) error {
	var typ *json.UnmarshalTypeError
	if !errors.As(err, &typ) {
		return err
	}
	want := map[string]string{"[]string": `a list of "host:port" strings`, "map[string]string": "an object of string labels",
		"string": "a string"}[typ.Type.String()]
	if want == "" {
		want = "a target group" // the top level or a group
	}
	got := "a " + typ.Value
	if typ.Value != "" && strings.IndexByte("aeiou", typ.Value[0]) >= 0 {
		got = "an " + typ.Value
	}
	if typ.Field == "" {
		return fmt.Errorf("json: got %s, want a list of target groups", got)
	}
	return fmt.Errorf("json: field %q: got %s, want %s", typ.Field, got, want)
}

// groupLines is where a target group and each of its targets start in the file: 1-based lines, 0
// where unknown.
type groupLines struct {
	group   int
	targets []int
}

// yamlLines finds the groups' and targets' lines in a file the strict decoder has accepted.
func yamlLines(data []byte) []groupLines {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.SequenceNode {
		return nil
	}
	seq := doc.Content[0].Content
	out := make([]groupLines, len(seq))
	for i, g := range seq {
		out[i].group = g.Line
		for k := 0; g.Kind == yaml.MappingNode && k+1 < len(g.Content); k += 2 {
			if g.Content[k].Value == "targets" && g.Content[k+1].Kind == yaml.SequenceNode {
				for _, t := range g.Content[k+1].Content {
					out[i].targets = append(out[i].targets, t.Line)
				}
			}
		}
	}
	return out
}

// jsonLines finds the groups' and targets' lines in a file the strict decoder has accepted, by
// walking its tokens: encoding/json reports byte offsets, not lines.
func jsonLines(data []byte) []groupLines {
	dec := json.NewDecoder(bytes.NewReader(data))
	line := func() int { // the line of the next value: past white space and separators
		off := int(dec.InputOffset())
		for off < len(data) && strings.IndexByte(" \t\r\n,:", data[off]) >= 0 {
			off++
		}
		return bytes.Count(data[:off], []byte("\n")) + 1
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return nil
	}
	var out []groupLines
	for dec.More() {
		gl := groupLines{group: line()}
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			return out
		}
		for dec.More() {
			key, err := dec.Token()
			if err != nil {
				return out
			}
			if key != "targets" {
				var skip json.RawMessage
				if dec.Decode(&skip) != nil {
					return out
				}
				continue
			}
			if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
				return out
			}
			for dec.More() {
				at := line()
				var skip json.RawMessage
				if dec.Decode(&skip) != nil {
					return out
				}
				gl.targets = append(gl.targets, at)
			}
			if _, err := dec.Token(); err != nil { // ]
				return out
			}
		}
		if _, err := dec.Token(); err != nil { // }
			return out
		}
		out = append(out, gl)
	}
	return out
}

// targetsFromGroups turns target groups into targets; errors name the file and line, the group
// and the target.
func targetsFromGroups(file string, groups []fileGroup, lines []groupLines) ([]Target, error) {
	var out []Target
	var errs []error
	seen := map[string]bool{}
	at := func(gi, ti int) string {
		l := 0
		if gi < len(lines) {
			l = lines[gi].group
			if ti >= 0 && ti < len(lines[gi].targets) {
				l = lines[gi].targets[ti]
			}
		}
		if l == 0 {
			return file + ": "
		}
		return fmt.Sprintf("%s:%d: ", file, l)
	}
	for gi, g := range groups {
		role := Role(g.Labels[fileLabelRole])
		dialect := Dialect(g.Labels[fileLabelDialect])
		scheme := g.Labels[fileLabelScheme]
		if scheme == "" {
			scheme = "http"
		}
		path := g.Labels[fileLabelPath]
		if path == "" {
			path = "/metrics"
		}
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		if len(g.Targets) == 0 {
			errs = append(errs, fmt.Errorf("%sgroup %d: no targets", at(gi, -1), gi))
			continue
		}
		for ti, addr := range g.Targets {
			if err := checkAddress(addr); err != nil {
				errs = append(errs, fmt.Errorf("%sgroup %d target %d %q: %w", at(gi, ti), gi, ti, addr, err))
				continue
			}
			name := addr
			if n := g.Labels[fileLabelName]; n != "" {
				name = n
				if len(g.Targets) > 1 {
					name = n + "@" + addr
				}
			}
			u := url.URL{Scheme: scheme, Host: addr, Path: path}
			t := Target{Name: name, URL: u.String(), Role: role, Dialect: dialect}.withDefaults()
			if err := t.validate(true); err != nil {
				errs = append(errs, fmt.Errorf("%sgroup %d target %d %q: %w", at(gi, ti), gi, ti, addr, err))
				continue
			}
			if seen[name] {
				errs = append(errs, fmt.Errorf("%sgroup %d target %d %q: name %q used twice", at(gi, ti), gi, ti, addr, name))
				continue
			}
			seen[name] = true
			out = append(out, t)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// checkAddress accepts host or host:port, as file_sd targets are written.
func checkAddress(addr string) error {
	if addr == "" {
		return errors.New("empty address")
	}
	if strings.ContainsAny(addr, "/ \t?#@") {
		return errors.New("want host or host:port, without scheme or path")
	}
	host := addr
	if strings.Contains(addr, ":") && !strings.HasSuffix(addr, "]") {
		h, _, err := net.SplitHostPort(addr)
		if err != nil {
			return err
		}
		host = h
	}
	if host == "" {
		return errors.New("empty host")
	}
	return nil
}
