//go:build unix

package main

import (
	"os"
	"os/exec"
	"syscall"
)

// ownProcessGroup puts a child in a process group of its own: Ctrl-C at
// the terminal reaches the fleet command alone, which then stops its
// members itself (and reports).
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// terminate asks a process to end (SIGTERM).
func terminate(p *os.Process) {
	p.Signal(syscall.SIGTERM)
}
