package benchreport

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNamedBenchmarksExist checks every benchmark a report row names against the repository: its
// function is declared in the package the table says. (Sub-benchmark names are often computed, so
// TestRenderRecorded checks them against a recorded run.) A renamed or moved benchmark fails here
// instead of showing as "not measured" in the next docs/benchmarks.md.
func TestNamedBenchmarksExist(t *testing.T) {
	root := filepath.Join("..", "..")
	funcs := map[string]map[string]*ast.FuncDecl{} // package dir → function name → declaration
	for name, dir := range namedBenchmarks {
		if funcs[dir] == nil {
			funcs[dir] = benchmarkFuncs(t, filepath.Join(root, filepath.FromSlash(dir)))
		}
		base, _, _ := strings.Cut(name, "/")
		assert.Contains(t, funcs[dir], base, "%s: no func %s in %s", name, base, dir)
	}
}

// benchmarkFuncs are the Benchmark functions of the test files in dir.
func benchmarkFuncs(t *testing.T, dir string) map[string]*ast.FuncDecl {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string]*ast.FuncDecl{}
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, 0)
		require.NoError(t, err)
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Benchmark") {
				out[fn.Name.Name] = fn
			}
		}
	}
	return out
}
