package gateway

import (
	"path/filepath"
	"testing"

	"github.com/basin-dev/basin/test/yamlconftest"
)

// TestExampleDocumentsEveryKey: testdata/gateway.example.yaml is the annotated example; every key
// the gateway reads appears in it, and it parses.
func TestExampleDocumentsEveryKey(t *testing.T) {
	yamlconftest.RequireDocumented(t, filepath.Join("testdata", "gateway.example.yaml"), Config{}, ParseConfig)
}
