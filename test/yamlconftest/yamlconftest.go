// Package yamlconftest holds the checks the configuration parsers' tests and fuzz targets share:
// every problem an error reports names its line or its key, and an annotated example documents
// every key.
package yamlconftest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/basin-dev/basin/internal/yamlconf"
)

// problemPart is one problem of a configuration error: "line N: …" or "key.path: …".
var problemPart = regexp.MustCompile(`^(line \d+: |[A-Za-z0-9_-]+(\.[^ :]+)*: )`)

// RequireNamed fails unless err (from parsing data) is non-empty and each of its problems names a
// line or a key; only input that is not YAML at all may be reported without one, as the YAML
// library sometimes does. Validation joins one error per problem; a decode error is one message
// (quoted values in it may hold newlines, so its text is not split).
func RequireNamed(t testing.TB, data []byte, err error) {
	t.Helper()
	require.Error(t, err)
	msg := err.Error()
	require.NotEmpty(t, msg)
	var node yaml.Node
	syntaxErr := yaml.Unmarshal(data, &node) != nil
	probs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		probs = j.Unwrap()
	}
	for _, p := range probs {
		if !problemPart.MatchString(p.Error()) {
			require.True(t, syntaxErr, "problem %q names neither a line nor a key (in %q)", p, msg)
		}
	}
}

// RequireDocumented fails unless the annotated example file at path mentions every key of the
// configuration struct cfg (set, or commented out with its meaning: "# key:" counts) and parse
// accepts it: an example that is the configuration's documentation cannot fall behind the code.
func RequireDocumented[T any](t *testing.T, path string, cfg T, parse func([]byte) (*T, error)) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, key := range yamlconf.Keys(cfg) {
		leaf := key[strings.LastIndex(key, ".")+1:]
		re := regexp.MustCompile(`(?m)(^|[\s{,#-])` + regexp.QuoteMeta(leaf) + `:`)
		assert.True(t, re.Match(b), "%s does not document %s", filepath.Base(path), key)
	}
	_, err = parse(b)
	require.NoError(t, err, "%s parses", filepath.Base(path))
}
