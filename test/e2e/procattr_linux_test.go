package e2e

import "syscall"

// sysProcAttr puts a child in a process group of its own, so that stopping it stops anything it
// started, and has the kernel kill it if the test binary dies without running its cleanups (an
// interrupt, or `go test -timeout` panicking).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
