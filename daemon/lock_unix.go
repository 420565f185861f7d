//go:build unix

package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// lockDataDir takes an exclusive advisory lock on data_dir/lock, so that a second daemon started
// on the same data directory fails instead of appending to the same audit log and acting twice.
// The lock belongs to the open file: the kernel releases it when the process dies, however it
// dies, so a crash never leaves a stale lock behind.
func lockDataDir(dir string) (release func() error, err error) {
	path := filepath.Join(dir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data_dir: %s is in use by another basin daemon (it holds %s)", dir, path)
		}
		return nil, fmt.Errorf("data_dir: locking %s: %w", path, err)
	}
	return sync.OnceValue(f.Close), nil
}
