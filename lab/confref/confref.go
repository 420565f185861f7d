// Package confref generates docs/configuration.md, the reference of basin's two configuration
// files, from the code itself: the keys and types from the config structs (by reflection, the way
// package yamlconf reads them), the defaults by running the real ParseConfig on a minimal file,
// and the meanings from the fields' doc comments in the Go source. A test in this package fails
// when the page differs from what Generate produces, so the page cannot drift from the code.
//
// Regenerate with: go run ./lab/confref/cmd/gen -o docs/configuration.md
package confref

import (
	"bytes"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/basin-dev/basin/internal/yamlconf"
)

// Command regenerates the page; the test's failure message names it.
const Command = "go run ./lab/confref/cmd/gen -o docs/configuration.md"

// DocPath is the generated page, relative to the module root.
const DocPath = "docs/configuration.md"

// Row is one key of a configuration file.
type Row struct {
	Key, Type, Default, Meaning string
}

// File describes one configuration file and how to learn its defaults.
type File struct {
	// Title heads the file's section; Intro follows it.
	Title, Intro string
	// Minimal is the smallest valid file: the keys it sets are the required ones.
	Minimal string
	// Parse is the file's real ParseConfig; it returns a pointer to the config struct with the
	// defaults filled.
	Parse func([]byte) (any, error)
	// Downstream fills, on the parsed config, the defaults that code after ParseConfig applies
	// (through the real default-filling functions where they are exported).
	Downstream func(cfg any)
	// Defaults overrides the rendered default of a key: defaults applied outside ParseConfig that
	// no exported function fills, or that read better in words.
	Defaults map[string]string
	// Required qualifies the "required" of a key the minimal file sets.
	Required map[string]string
	// Provenance names the constant ("import/path.Name") whose doc comment explains a key's
	// default, when it is not Default<Field> in the field's own package.
	Provenance map[string]string
}

// Generator renders the reference from the Go source under a module root.
type Generator struct {
	src *sources
}

// NewGenerator reads sources from the module rooted at root (the directory of go.mod).
func NewGenerator(root, module string) *Generator {
	return &Generator{src: newSources(root, module)}
}

// Rows lists a file's keys in struct order.
func (g *Generator) Rows(f File) ([]Row, error) {
	cfg, err := f.Parse([]byte(f.Minimal))
	if err != nil {
		return nil, fmt.Errorf("confref: %s: minimal file does not parse: %w", f.Title, err)
	}
	if f.Downstream != nil {
		f.Downstream(cfg)
	}
	required, err := requiredKeys(f.Minimal)
	if err != nil {
		return nil, err
	}
	w := walker{g: g, f: f, required: required}
	yamlconf.Walk(cfg, w.visit)
	return w.rows, w.err
}

type walker struct {
	g        *Generator
	f        File
	required map[string]bool
	rows     []Row
	err      error
}

var durationTypes = map[reflect.Type]bool{reflect.TypeFor[time.Duration](): true, reflect.TypeFor[yamlconf.Duration](): true}

// visit is one key's row.
func (w *walker) visit(f yamlconf.Field) {
	meaning, err := w.g.meaning(f.Parent, f.StructField, w.f.Provenance[f.Key])
	if err != nil && w.err == nil {
		w.err = err
	}
	w.rows = append(w.rows, Row{Key: f.Key, Type: TypeName(f.StructField.Type), Default: w.def(f.Key, f.Value), Meaning: meaning})
}

// def renders a key's default: an override, "required", or the parsed value.
func (w *walker) def(key string, v reflect.Value) string {
	if d, ok := w.f.Defaults[key]; ok {
		return d
	}
	if w.required[key] {
		if q := w.f.Required[key]; q != "" {
			return "required " + q
		}
		return "required"
	}
	if !v.IsValid() {
		return "—"
	}
	return Render(key, v)
}

// requiredKeys lists the keys a YAML document sets: its leaves, and its lists as a whole.
func requiredKeys(doc string) (map[string]bool, error) {
	var root yaml.Node
	if err := yaml.Unmarshal([]byte(doc), &root); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := prefix+n.Content[i].Value, n.Content[i+1]
			if v.Kind == yaml.MappingNode {
				walk(v, k+".")
			} else {
				out[k] = true
			}
		}
	}
	if len(root.Content) > 0 {
		walk(root.Content[0], "")
	}
	return out, nil
}

// TypeName is a YAML-minded name of a field's type.
func TypeName(t reflect.Type) string {
	if durationTypes[t] {
		return "duration"
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Struct:
		return "object"
	case reflect.Pointer:
		return TypeName(t.Elem())
	case reflect.Slice, reflect.Array:
		return "list of " + plural(TypeName(t.Elem()))
	case reflect.Map:
		return "map of " + TypeName(t.Key()) + " to " + TypeName(t.Elem())
	}
	return t.String()
}

func plural(s string) string {
	if strings.HasPrefix(s, "list of ") || strings.HasPrefix(s, "map of ") {
		return s
	}
	return s + "s"
}

// Render prints a value as the default column shows it: "—" for an unset (zero) value, whose
// meaning the meaning column gives; code-formatted values otherwise.
func Render(key string, v reflect.Value) string {
	if durationTypes[v.Type()] {
		if v.Int() == 0 {
			return "—"
		}
		return code(time.Duration(v.Int()).String())
	}
	switch v.Kind() {
	case reflect.String:
		if v.String() == "" {
			return "—"
		}
		return code(v.String())
	case reflect.Bool:
		return code(strconv.FormatBool(v.Bool()))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n := v.Int()
		if n == 0 {
			return "—"
		}
		s := code(strconv.FormatInt(n, 10))
		if strings.HasSuffix(key, "bytes") && n%(1<<20) == 0 {
			s += fmt.Sprintf(" (%d MiB)", n>>20)
		}
		return s
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if v.Uint() == 0 {
			return "—"
		}
		return code(strconv.FormatUint(v.Uint(), 10))
	case reflect.Float32, reflect.Float64:
		if v.Float() == 0 {
			return "—"
		}
		return code(strconv.FormatFloat(v.Float(), 'g', -1, 64))
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return "—"
		}
		return Render(key, v.Elem())
	case reflect.Struct:
		return "—"
	case reflect.Slice, reflect.Array:
		if v.Len() == 0 {
			return "—"
		}
		parts := make([]string, v.Len())
		for i := range v.Len() {
			parts[i] = Render(key, v.Index(i))
		}
		return strings.Join(parts, ", ")
	case reflect.Map:
		if v.Len() == 0 {
			return "—"
		}
		parts := make([]string, 0, v.Len())
		for _, k := range v.MapKeys() {
			parts = append(parts, code(fmt.Sprint(k.Interface())+": "+fmt.Sprint(v.MapIndex(k).Interface())))
		}
		sort.Strings(parts)
		return strings.Join(parts, ", ")
	}
	return code(fmt.Sprint(v.Interface()))
}

func code(s string) string { return "`" + s + "`" }

var (
	defaultParen = regexp.MustCompile(`\s*\(Default[A-Z]\w*\)`)
	identRE      = regexp.MustCompile(`\b[A-Z][A-Za-z0-9]*\b`)
)

// meaning is the field's doc comment on one line, its leading field name dropped, sibling fields
// named by their YAML keys and constants by their values, followed by the explanation of its
// default when a constant documents one. An undocumented field gives "" (the test names it).
func (g *Generator) meaning(t reflect.Type, sf reflect.StructField, provenance string) (string, error) {
	p, err := g.src.pkg(t.PkgPath())
	if err != nil {
		return "", err
	}
	keys := yamlNames(t)
	doc := p.fields[t.Name()+"."+sf.Name]
	if doc == "" {
		return "", nil
	}
	doc = dropSubject(doc, sf.Name)
	doc = defaultParen.ReplaceAllString(doc, "")
	doc = g.idents(doc, keys, p, "")
	out := capitalize(doc)

	// Why the default: the named constant, else Default<Field> in the field's package.
	var why string
	if provenance != "" {
		i := strings.LastIndex(provenance, ".")
		pp, err := g.src.pkg(provenance[:i])
		if err != nil {
			return "", err
		}
		name := provenance[i+1:]
		why = pp.consts[name]
		why = strings.TrimPrefix(dropSubject(why, name), "the default ")
		why = g.idents(why, nil, pp, name)
	} else if c := "Default" + sf.Name; p.consts[c] != "" {
		why = p.consts[c]
		// A comment shared by several constants keeps their names (as YAML keys).
		if strings.Count(why, "Default") == 1 {
			why = dropSubject(why, c)
		}
		why = g.idents(why, keys, p, c)
	}
	if why != "" {
		out += " Why the default: " + why
	}
	return out, nil
}

// idents rewrites Go names in doc text: Default<Field> and <Field> of the struct become its YAML
// key, constants of the package with a known value become that value.
func (g *Generator) idents(s string, keys map[string]string, p *pkgDocs, self string) string {
	return identRE.ReplaceAllStringFunc(s, func(id string) string {
		if f, ok := strings.CutPrefix(id, "Default"); ok && keys[f] != "" {
			return code(keys[f])
		}
		if k := keys[id]; k != "" && !isUpper(id) {
			return code(k)
		}
		if v, ok := p.values[id]; ok && id != self {
			return code(v)
		}
		return id
	})
}

// yamlNames maps a struct's Go field names to their YAML keys.
func yamlNames(t reflect.Type) map[string]string {
	m := map[string]string{}
	for i := range t.NumField() {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if !sf.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = strings.ToLower(sf.Name)
		}
		m[sf.Name] = name
	}
	return m
}

// dropSubject drops a leading "Name", "Name:", "Name is" or "Name are" from a doc comment.
func dropSubject(doc, name string) string {
	rest, ok := strings.CutPrefix(doc, name)
	if !ok || rest != "" && rest[0] != ' ' && rest[0] != ':' {
		return doc
	}
	rest = strings.TrimLeft(rest, ": ")
	for _, verb := range []string{"is ", "are "} {
		if r, ok := strings.CutPrefix(rest, verb); ok {
			return r
		}
	}
	return rest
}

// capitalize starts a sentence, unless it starts with a one-letter symbol ("r in …") or a list
// of values ("sglang, vllm, …").
func capitalize(s string) string {
	first, _, _ := strings.Cut(s, " ")
	if len(first) <= 1 || strings.HasSuffix(first, ",") {
		return s
	}
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToUpper(r)) + s[n:]
}

func isUpper(s string) bool { return strings.ToUpper(s) == s }

// Cell escapes text for a Markdown table cell.
func Cell(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ")
}

// Generate renders the whole page.
func (g *Generator) Generate(intro string, files []File) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(intro)
	for _, f := range files {
		rows, err := g.Rows(f)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "\n## %s\n\n%s\n\n", f.Title, strings.TrimSpace(f.Intro))
		b.WriteString("| key | type | default | meaning |\n|---|---|---|---|\n")
		for _, r := range rows {
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", Cell(r.Key), Cell(r.Type), Cell(r.Default), Cell(r.Meaning))
		}
	}
	return b.Bytes(), nil
}
