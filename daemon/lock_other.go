//go:build !unix

package daemon

// lockDataDir does nothing where flock(2) does not exist: two daemons on one data directory are
// not detected there.
func lockDataDir(string) (func() error, error) { return func() error { return nil }, nil }
