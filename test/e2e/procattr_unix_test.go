//go:build unix && !linux

package e2e

import "syscall"

// sysProcAttr puts a child in a process group of its own, so that stopping it stops anything it
// started. (Without Linux's Pdeathsig, a test binary killed before its cleanups leaves it running.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
