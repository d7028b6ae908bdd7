package qemu

import (
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/internal/proc"
)

// Adopt completes a machine known only by its directories (its record is
// unreadable, so its uuid is unknown) from its running QEMU: the process its
// pid file names or, failing that, one in the process table, either only if
// started with "-pidfile <m.RunDir>/qemu.pid". From that QEMU's command line
// it takes the uuid and the socket directory (which a long state
// path moves out of the run dir), so that Stop reaches it over QMP and finds
// its virtiofsd. pid is 0 when no QEMU of this run directory runs; m is then
// returned as it was, and Stop still ends a virtiofsd serving the run dir.
func Adopt(m Machine) (adopted Machine, pid int) {
	match := isQEMUIn(m.RunDir)
	pid, err := proc.ReadPid(m.runFile(PidFile))
	if err != nil || !proc.Verified(pid, match) {
		pid = proc.Find(match)
	}
	args := proc.Args(pid)
	if pid == 0 || args == nil || !match(args) {
		return m, 0
	}
	if v := argValues(args, "-uuid"); len(v) > 0 {
		m.UUID = v[len(v)-1] // QEMU takes the last
	}
	for _, q := range argValues(args, "-qmp") {
		if p, ok := strings.CutPrefix(q, "unix:"); ok && filepath.Base(unesc(p)) == QMPSocket {
			m.SocketDir = filepath.Dir(unesc(p))
		}
	}
	return m, pid
}
