package daemon

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/basin-dev/basin/internal/yamlconf"
)

// TestExampleDocumentsEveryKey: examples/daemon.yaml is the configuration reference; every key
// the daemon reads appears in it (set, or commented out with its meaning), and it parses.
func TestExampleDocumentsEveryKey(t *testing.T) {
	path := filepath.Join("..", "..", "examples", "daemon.yaml")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, key := range yamlconf.Keys(Config{}) {
		leaf := key[strings.LastIndex(key, ".")+1:]
		re := regexp.MustCompile(`(?m)(^|[\s{,#-])` + regexp.QuoteMeta(leaf) + `:`)
		assert.True(t, re.Match(b), "examples/daemon.yaml does not document %s", key)
	}
	_, err = ParseConfig(b)
	require.NoError(t, err, "the example parses")
}
