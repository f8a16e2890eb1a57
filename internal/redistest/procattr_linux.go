package redistest

import (
	"os/exec"
	"syscall"
)

// setProcAttr kills the server with the test binary, so that a test that
// panics or times out leaves no redis-server behind.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
