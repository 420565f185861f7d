// Package yamlconftest holds the check the configuration parsers' tests and fuzz targets share:
// every problem an error reports names its line or its key.
package yamlconftest

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
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
