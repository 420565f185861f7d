package cli

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the tests if a goroutine started by the package (or by them) outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
