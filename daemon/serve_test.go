package daemon

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestServeEndsSilentConnections: a client that dialled and never sent a request (net/http's
// transport keeps such a connection when the request that dialled it was cancelled) is not idle
// to http.Server.Shutdown until it is five seconds old, so Shutdown waits for it until its own
// deadline and leaves it open. Serve must end it anyway: nothing the daemon accepted outlives
// Serve. Before the fix the connection stayed open after Serve returned and the read below hit
// its deadline.
func TestServeEndsSilentConnections(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "")
	d := e.daemon()
	ln := listen(t)
	served := make(chan error, 1)
	ctx, cancel := context.WithCancel(t.Context())
	go func() { served <- d.Serve(ctx, ln) }()

	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	time.Sleep(50 * time.Millisecond) // let the server accept it (no request is ever sent)
	cancel()
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(time.Second)))
	_, err = conn.Read(make([]byte, 1))
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the connection is still open after Serve returned")
	}
	assert.Error(t, err, "the server closed it (EOF or reset)")
}
