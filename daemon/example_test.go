package daemon

import (
	"path/filepath"
	"testing"

	"github.com/basin-dev/basin/test/yamlconftest"
)

// TestExampleDocumentsEveryKey: examples/daemon.yaml is the annotated example; every key the
// daemon reads appears in it (set, or commented out with its meaning), and it parses.
func TestExampleDocumentsEveryKey(t *testing.T) {
	yamlconftest.RequireDocumented(t, filepath.Join("..", "examples", "daemon.yaml"), Config{}, ParseConfig)
}
