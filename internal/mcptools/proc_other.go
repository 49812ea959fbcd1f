//go:build !unix

package mcptools

import "os/exec"

// isolate does nothing where process groups do not exist.
func isolate(*exec.Cmd) {}

// killGroup kills the server process itself.
func killGroup(cmd *exec.Cmd) {
	if cmd.Process != nil {
		_ = cmd.Process.Kill()
	}
}
