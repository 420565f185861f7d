// Package yamlconf reads basin's YAML files (scenarios, gateway and daemon configs) strictly:
// an unknown key or a bad value is an error that names the key and its line, because a typo in a
// config otherwise silently measures or enforces something else.
package yamlconf

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written the Go way in YAML ("30s", "10m").
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler, naming the line of a bad value. Its errors are
// yaml.TypeErrors, which the decoder collects and goes on after: any other error stops the
// decoding at the first bad duration and hides every mistake after it.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	bad := func(format string, args ...any) error {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf(format, args...)}}
	}
	var s string
	if err := n.Decode(&s); err != nil {
		return bad("line %d: duration: %v", n.Line, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return bad("line %d: duration %q: want a value like 30s or 10m", n.Line, s)
	}
	if v < 0 {
		return bad("line %d: duration %q: must not be negative", n.Line, s)
	}
	*d = Duration(v)
	return nil
}

// String prints the duration the way it is written ("30s").
func (d Duration) String() string { return time.Duration(d).String() }

// Decode decodes data into v, rejecting unknown keys, and returns the parsed document for
// LineOf. Errors read "line N: key: …", every bad key and value of the file at once. When the
// document parsed but did not decode (unknown keys, bad values), the document is returned with
// the error, and v holds what decoded: a caller can validate the rest and report it with Join.
func Decode(data []byte, v any) (*yaml.Node, error) {
	var root yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&root); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlError(err)
	}
	if len(root.Content) == 0 {
		return &root, nil
	}
	durErr := checkDurations(&root, reflect.TypeOf(v), "")
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return &root, joinLines(durErr, nameKeys(&root, yamlError(err)))
	}
	if durErr != nil {
		return &root, durErr
	}
	return &root, nil
}

// Join reports a decoding error and the validation of what did decode together, so one run
// names every mistake. A validation problem on a line the decoding already reported is left
// out: the key that failed to decode holds its zero value, and a complaint about that ("required")
// would be a second, misleading message about the same mistake.
func Join(decodeErr, validateErr error) error {
	if validateErr == nil || decodeErr == nil {
		return errors.Join(decodeErr, validateErr)
	}
	reported := map[int]bool{}
	for _, m := range splitMessages(decodeErr) {
		var line int
		if _, e := fmt.Sscanf(m, "line %d:", &line); e == nil {
			reported[line] = true
		}
	}
	out := []error{decodeErr}
	for _, m := range splitMessages(validateErr) {
		var line int
		if _, e := fmt.Sscanf(m, "line %d:", &line); e == nil && reported[line] {
			continue
		}
		out = append(out, errors.New(m))
	}
	return errors.Join(out...)
}

// joinLines joins errors of "line N: …" messages in the decoder's "; " form, one message a
// line: checkDurations and the decoder can both refuse one duration, the first error's says it.
func joinLines(errs ...error) error {
	var parts []string
	lines := map[int]bool{}
	for _, err := range errs {
		var these []int
		for _, m := range splitMessages(err) {
			var line int
			if _, e := fmt.Sscanf(m, "line %d:", &line); e == nil {
				if lines[line] {
					continue
				}
				these = append(these, line)
			}
			if !slices.Contains(parts, m) {
				parts = append(parts, m)
			}
		}
		for _, l := range these {
			lines[l] = true
		}
	}
	if len(parts) == 0 {
		return nil
	}
	return errors.New(strings.Join(parts, "; "))
}

// splitMessages splits an error into its messages ("; " and newline separated).
func splitMessages(err error) []string {
	if err == nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(err.Error(), "\n") {
		for _, m := range strings.Split(l, "; ") {
			if m = strings.TrimSpace(m); m != "" {
				out = append(out, m)
			}
		}
	}
	return out
}

// checkDurations makes every time.Duration field read the way Duration does: yaml.v3 parses a
// string ("30s") into one but takes a bare number as nanoseconds, so `step_interval: 120` would
// silently mean 120 ns. A number is refused, naming the key and its line.
func checkDurations(n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		return checkDurations(n.Content[0], t, path)
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	var errs []error
	switch {
	case t == reflect.TypeFor[time.Duration]():
		if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
			return nil
		}
		if _, err := time.ParseDuration(n.Value); err != nil || n.Tag != "!!str" {
			return fmt.Errorf("line %d: %s: duration %s: want a value like 30s or 10m", n.Line, path, n.Value)
		}
	case t.Kind() == reflect.Struct && t != reflect.TypeFor[time.Time]():
		if n.Kind != yaml.MappingNode {
			return nil
		}
		fields := map[string]reflect.Type{}
		var collect func(t reflect.Type)
		collect = func(t reflect.Type) {
			for i := range t.NumField() {
				f := t.Field(i)
				name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
				switch {
				case strings.Contains(opts, "inline"):
					ft := f.Type
					for ft.Kind() == reflect.Pointer {
						ft = ft.Elem()
					}
					if ft.Kind() == reflect.Struct {
						collect(ft)
					}
				case !f.IsExported() || name == "-":
				case name == "":
					fields[strings.ToLower(f.Name)] = f.Type
				default:
					fields[name] = f.Type
				}
			}
		}
		collect(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			if ft, ok := fields[n.Content[i].Value]; ok {
				errs = append(errs, checkDurations(n.Content[i+1], ft, join(path, n.Content[i].Value)))
			}
		}
	case t.Kind() == reflect.Slice || t.Kind() == reflect.Array:
		if n.Kind == yaml.SequenceNode {
			for i, c := range n.Content {
				errs = append(errs, checkDurations(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i)))
			}
		}
	case t.Kind() == reflect.Map:
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				errs = append(errs, checkDurations(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value)))
			}
		}
	}
	return errors.Join(errs...)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// Overlay decodes data onto v without the unknown-key check (Decode ran it), so that only the keys
// the file sets change v: how a file overrides a preset.
func Overlay(data []byte, v any) error {
	if err := yaml.Unmarshal(data, v); err != nil {
		return yamlError(err)
	}
	return nil
}

// yamlError rewrites yaml.v3's messages into "line N: …" form, naming unknown keys plainly.
func yamlError(err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, 0, len(te.Errors))
		for _, m := range te.Errors {
			if i := strings.Index(m, ": field "); i >= 0 && strings.Contains(m, " not found in type ") {
				key := m[i+len(": field "):]
				key = key[:strings.Index(key, " not found")]
				m = fmt.Sprintf("%s: unknown key %q", m[:i], key)
			}
			msgs = append(msgs, m)
		}
		return errors.New(strings.Join(msgs, "; "))
	}
	return errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
}

// nameKeys adds the key to "line N: …" messages that do not name one (type errors, bad
// durations), so that every error says both where and what.
func nameKeys(root *yaml.Node, err error) error {
	parts := strings.Split(err.Error(), "; ")
	for i, m := range parts {
		var line int
		if _, e := fmt.Sscanf(m, "line %d:", &line); e != nil || strings.Contains(m, "unknown key") {
			continue
		}
		if key := keyAt(root, line, ""); key != "" {
			prefix := fmt.Sprintf("line %d: ", line)
			parts[i] = prefix + key + ": " + strings.TrimPrefix(m, prefix)
		}
	}
	return errors.New(strings.Join(parts, "; "))
}

// keyAt finds the dotted path of the key whose value is on line (the innermost one).
func keyAt(n *yaml.Node, line int, path string) string {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if k := keyAt(c, line, path); k != "" {
				return k
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			if inner := keyAt(v, line, p); inner != "" {
				return inner
			}
			if v.Line == line || k.Line == line {
				return p
			}
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s.%d", path, i)
			if inner := keyAt(c, line, p); inner != "" {
				return inner
			}
			if c.Line == line && c.Kind == yaml.ScalarNode {
				return p
			}
		}
	}
	return ""
}

// LineOf finds the line of a key path ("admission", "budget_tokens") in a parsed document, 0 if
// the key is absent. A numeric path element indexes a sequence.
func LineOf(root *yaml.Node, path ...string) int {
	n := root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := 0
	for _, p := range path {
		switch n.Kind {
		case yaml.MappingNode:
			found := false
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == p {
					line = n.Content[i].Line
					n = n.Content[i+1]
					found = true
					break
				}
			}
			if !found {
				return 0
			}
		case yaml.SequenceNode:
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(n.Content) {
				return 0
			}
			n = n.Content[i]
			line = n.Line
		default:
			return 0
		}
	}
	return line
}

// Problems collects a configuration's bad values, each named by its key path and, when the file
// states the key, its line — so one run reports every mistake, not the first.
type Problems struct {
	root *yaml.Node
	errs []error
}

// NewProblems collects problems for the document root Decode returned.
func NewProblems(root *yaml.Node) *Problems { return &Problems{root: root} }

// Add records a problem at a key path ("admission", "budget_tokens").
func (p *Problems) Add(path []string, format string, args ...any) {
	msg := fmt.Sprintf("%s: %s", strings.Join(path, "."), fmt.Sprintf(format, args...))
	if l := LineOf(p.root, path...); l > 0 {
		msg = fmt.Sprintf("line %d: %s", l, msg)
	}
	p.errs = append(p.errs, errors.New(msg))
}

// Len is how many problems were recorded.
func (p *Problems) Len() int { return len(p.errs) }

// Err joins the problems, nil without any.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// Keys lists the YAML key paths of a configuration struct ("admission.budget_tokens"), in the
// order Walk visits them. Tests use it to keep a documented example complete: every key the code
// reads appears in it.
func Keys(v any) []string {
	var out []string
	Walk(v, func(f Field) { out = append(out, f.Key) })
	return out
}

// Field is one configuration key Walk visits.
type Field struct {
	// Key is the YAML key path: "admission.budget_tokens", "targets[].name".
	Key string
	// Parent is the struct that declares the field, and StructField the field.
	Parent      reflect.Type
	StructField reflect.StructField
	// Value is the field's value in the walked configuration; invalid inside list and map
	// elements (their keys exist for any element) and when Walk was given a type's zero pointer.
	Value reflect.Value
}

// Walk visits the YAML keys of a configuration struct (v, or a pointer to one) from their yaml
// tags, depth first in declaration order, recursing into structs and slices or maps of structs (a
// slice's elements as "targets[].name"). Fields tagged "-" and unexported ones are skipped,
// ",inline" ones flattened; an untagged field's key is its lower-cased name, as yaml.v3 does.
func Walk(v any, fn func(Field)) {
	var walk func(t reflect.Type, val reflect.Value, prefix string)
	walk = func(t reflect.Type, val reflect.Value, prefix string) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
			if val.IsValid() {
				val = val.Elem()
			}
		}
		if t.Kind() != reflect.Struct || t == reflect.TypeFor[time.Time]() {
			return
		}
		for i := range t.NumField() {
			f := t.Field(i)
			var fv reflect.Value
			if val.IsValid() {
				fv = val.Field(i)
			}
			name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if strings.Contains(opts, "inline") && (f.IsExported() || f.Anonymous) {
				walk(f.Type, fv, prefix)
				continue
			}
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			key := prefix + name
			fn(Field{Key: key, Parent: t, StructField: f, Value: fv})
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch ft.Kind() {
			case reflect.Struct:
				walk(f.Type, fv, key+".")
			case reflect.Slice, reflect.Map:
				walk(ft.Elem(), reflect.Value{}, key+"[].")
			}
		}
	}
	val := reflect.ValueOf(v)
	if val.Kind() == reflect.Pointer && val.IsNil() {
		val = reflect.Value{}
	}
	walk(reflect.TypeOf(v), val, "")
}

// Load reads a configuration file with parse, naming the file in errors, and resolves the
// relative paths it holds against the file's directory (so a config works from any working
// directory). paths picks the fields that hold paths.
func Load[T any](path, what string, parse func([]byte) (*T, error), paths func(*T) []*string) (*T, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	c, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	dir := filepath.Dir(path)
	for _, p := range paths(c) {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
	return c, nil
}
