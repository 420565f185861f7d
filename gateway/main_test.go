package gateway

import (
	"log/slog"
	"os"
	"testing"

	"github.com/basin-dev/basin/internal/store"
)

func TestMain(m *testing.M) {
	// The replicated-mode tests stop their store on purpose; the store client's dial errors
	// would fill the output.
	store.RouteClientLogs(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}
