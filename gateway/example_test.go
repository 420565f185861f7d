package gateway

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

// TestExampleDocumentsEveryKey: testdata/gateway.example.yaml is the configuration reference;
// every key the gateway reads appears in it, and it parses.
func TestExampleDocumentsEveryKey(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "gateway.example.yaml"))
	require.NoError(t, err)
	for _, key := range yamlconf.Keys(Config{}) {
		leaf := key[strings.LastIndex(key, ".")+1:]
		re := regexp.MustCompile(`(?m)(^|[\s{,#-])` + regexp.QuoteMeta(leaf) + `:`)
		assert.True(t, re.Match(b), "gateway.example.yaml does not document %s", key)
	}
	_, err = ParseConfig(b)
	require.NoError(t, err, "the example parses")
}
