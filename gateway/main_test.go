package gateway

import (
	"log/slog"
	"testing"

	"go.uber.org/goleak"

	"github.com/basin-dev/basin/internal/store"
)

// TestMain fails the package's tests if a goroutine is left running when they end: the gateway
// starts them for every call, its Run loop and its replication.
func TestMain(m *testing.M) {
	// The replicated-mode tests stop their store on purpose; the store client's dial errors
	// would fill the output.
	store.RouteClientLogs(slog.New(slog.DiscardHandler))
	goleak.VerifyTestMain(m)
}
