package gateway

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
)

// memNet is an in-memory network of named listeners, for the tests that run the gateway in a
// testing/synctest bubble: I/O on a loopback socket is not durably blocking, so a bubble whose
// goroutines wait on one never sees its fake clock move, while a net.Pipe made in the bubble
// blocks on the bubble's own channels. Addresses are host:port as a URL's host dials them
// (http://upstream.test dials upstream.test:80).
type memNet struct {
	mu        sync.Mutex
	listeners map[string]*memListener
}

func newMemNet() *memNet { return &memNet{listeners: map[string]*memListener{}} }

// serve serves h on host (port 80) until the test ends and returns its base URL.
func (n *memNet) serve(t testing.TB, host string, h http.Handler) string {
	t.Helper()
	url, _ := n.serveUntil(t, host, h)
	return url
}

// serveUntil is serve with stop, which closes the server and its connections before the test
// ends (an upstream going away); it waits for the server's loop to return and may be called again.
func (n *memNet) serveUntil(t testing.TB, host string, h http.Handler) (url string, stop func()) {
	t.Helper()
	l := &memListener{addr: memAddr(host + ":80"), conns: make(chan net.Conn), closed: make(chan struct{})}
	n.mu.Lock()
	if _, dup := n.listeners[string(l.addr)]; dup {
		n.mu.Unlock()
		t.Fatalf("memNet: %s is served already", l.addr)
	}
	n.listeners[string(l.addr)] = l
	n.mu.Unlock()
	srv := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l) // http.ErrServerClosed once Close is called below
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = srv.Close() // closes the listener and every connection, idle or not
			<-done
		})
	}
	t.Cleanup(stop)
	return "http://" + host, stop
}

// client is an HTTP client that dials on n; its idle connections are closed when the test ends,
// so that none of its goroutines outlives the bubble.
func (n *memNet) client(t testing.TB) *http.Client {
	tr := &http.Transport{DialContext: n.dial}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// dial connects to the listener at addr; it is an http.Transport's DialContext.
func (n *memNet) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	n.mu.Lock()
	l, ok := n.listeners[addr]
	n.mu.Unlock()
	if !ok {
		return nil, &net.OpError{Op: "dial", Net: "mem", Err: fmt.Errorf("nothing listens on %s", addr)}
	}
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		return nil, &net.OpError{Op: "dial", Net: "mem", Err: fmt.Errorf("%s: %w", addr, net.ErrClosed)}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// memListener is a net.Listener whose connections are the server ends of pipes dialled on a memNet.
type memListener struct {
	addr   memAddr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *memListener) Addr() net.Addr { return l.addr }

// memAddr is the address of a memListener.
type memAddr string

func (memAddr) Network() string  { return "mem" }
func (a memAddr) String() string { return string(a) }
