//go:build unix

package mcptools

import (
	"os/exec"
	"syscall"
)

// isolate starts a stdio server in a process group of its own, so the
// helpers it spawns (a package runner's child, a shell's) are stopped with
// it, and a terminal's Ctrl-C reaches the worker, which then stops it.
func isolate(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// killGroup kills what is left of a stdio server's process group.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
