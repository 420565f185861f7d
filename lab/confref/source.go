package confref

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ModuleRoot finds the directory holding go.mod, walking up from dir, and returns it with the
// module path go.mod declares.
func ModuleRoot(dir string) (root, module string, err error) {
	dir, err = filepath.Abs(dir)
	if err != nil {
		return "", "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil {
			return dir, modulePath(data), nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", "", err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", "", errors.New("confref: no go.mod above the working directory")
		}
		dir = parent
	}
}

// modulePath reads the module line of go.mod.
func modulePath(gomod []byte) string {
	for line := range strings.Lines(string(gomod)) {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}

// pkgDocs is what the Go source of one package says: the doc comment of each struct field
// ("Type.Field"), of each constant, and the value of each constant simple enough to evaluate
// (string and number literals, products and shifts of them, time units).
type pkgDocs struct {
	fields map[string]string
	consts map[string]string
	values map[string]string
}

// sources parses packages on demand, keyed by import path.
type sources struct {
	root, module string
	pkgs         map[string]*pkgDocs
}

func newSources(root, module string) *sources {
	return &sources{root: root, module: module, pkgs: map[string]*pkgDocs{}}
}

// pkg parses the non-test Go files of the package with this import path.
func (s *sources) pkg(path string) (*pkgDocs, error) {
	if p, ok := s.pkgs[path]; ok {
		return p, nil
	}
	rel, ok := strings.CutPrefix(path, s.module)
	if !ok {
		return nil, fmt.Errorf("confref: package %s is outside module %s", path, s.module)
	}
	dir := filepath.Join(s.root, filepath.FromSlash(strings.TrimPrefix(rel, "/")))
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("confref: %w", err)
	}
	p := &pkgDocs{fields: map[string]string{}, consts: map[string]string{}, values: map[string]string{}}
	fset := token.NewFileSet()
	type pending struct {
		name string
		expr ast.Expr
	}
	var exprs []pending
	for _, e := range ents {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("confref: %w", err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok {
				continue
			}
			switch g.Tok {
			case token.TYPE:
				for _, sp := range g.Specs {
					ts := sp.(*ast.TypeSpec)
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					for _, fl := range st.Fields.List {
						doc := fl.Doc
						if doc == nil {
							doc = fl.Comment
						}
						for _, name := range fl.Names {
							p.fields[ts.Name.Name+"."+name.Name] = oneLine(doc)
						}
					}
				}
			case token.CONST:
				prev := ""
				for _, sp := range g.Specs {
					vs := sp.(*ast.ValueSpec)
					doc := oneLine(vs.Doc)
					if doc == "" && vs.Comment != nil {
						doc = oneLine(vs.Comment)
					}
					for i, name := range vs.Names {
						d := doc
						// A constant without a comment of its own, in a group, shares the
						// previous one's when that comment names it ("DefaultA and DefaultB …").
						if d == "" && containsWord(prev, name.Name) {
							d = prev
						}
						p.consts[name.Name] = d
						if i < len(vs.Values) {
							exprs = append(exprs, pending{name.Name, vs.Values[i]})
						}
					}
					if doc != "" {
						prev = doc
					}
				}
			}
		}
	}
	// Evaluate in rounds so constants defined by other constants resolve whatever the file order.
	raw := map[string]value{}
	for range 4 {
		for _, e := range exprs {
			if _, done := raw[e.name]; done {
				continue
			}
			if v, ok := eval(e.expr, raw); ok {
				raw[e.name] = v
			}
		}
	}
	for n, v := range raw {
		p.values[n] = v.String()
	}
	s.pkgs[path] = p
	return p, nil
}

// oneLine joins a comment group into one line.
func oneLine(g *ast.CommentGroup) string {
	if g == nil {
		return ""
	}
	return strings.Join(strings.Fields(g.Text()), " ")
}

// value is a constant: a string, a number, or a duration.
type value struct {
	s     *string
	n     float64
	isDur bool
}

func (v value) String() string {
	switch {
	case v.s != nil:
		return *v.s
	case v.isDur:
		return time.Duration(v.n).String()
	}
	return strconv.FormatFloat(v.n, 'g', -1, 64)
}

var timeUnits = map[string]time.Duration{"Nanosecond": time.Nanosecond, "Microsecond": time.Microsecond,
	"Millisecond": time.Millisecond, "Second": time.Second, "Minute": time.Minute, "Hour": time.Hour}

// eval evaluates the constant expressions config defaults are written with; ok is false for
// anything else (those constants are left as they are written).
func eval(e ast.Expr, known map[string]value) (value, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		switch e.Kind {
		case token.STRING:
			s, err := strconv.Unquote(e.Value)
			return value{s: &s}, err == nil
		case token.INT, token.FLOAT:
			f, err := strconv.ParseFloat(strings.ReplaceAll(e.Value, "_", ""), 64)
			return value{n: f}, err == nil
		}
	case *ast.ParenExpr:
		return eval(e.X, known)
	case *ast.Ident:
		v, ok := known[e.Name]
		return v, ok
	case *ast.SelectorExpr:
		if x, ok := e.X.(*ast.Ident); ok && x.Name == "time" {
			if d, ok := timeUnits[e.Sel.Name]; ok {
				return value{n: float64(d), isDur: true}, true
			}
		}
	case *ast.BinaryExpr:
		x, ok1 := eval(e.X, known)
		y, ok2 := eval(e.Y, known)
		if !ok1 || !ok2 || x.s != nil || y.s != nil {
			break
		}
		switch e.Op {
		case token.MUL:
			return value{n: x.n * y.n, isDur: x.isDur || y.isDur}, true
		case token.SHL:
			return value{n: x.n * float64(uint64(1)<<uint(y.n))}, true
		}
	}
	return value{}, false
}

// containsWord reports whether text holds word as a whole word.
func containsWord(text, word string) bool {
	for _, f := range strings.FieldsFunc(text, func(r rune) bool {
		return !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) {
		if f == word {
			return true
		}
	}
	return false
}
