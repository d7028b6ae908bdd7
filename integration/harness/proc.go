package harness

import (
	"strings"

	"github.com/agent-vm/agent-vm/blackbox"
)

// ProcessesMentioning lists the live processes whose command line contains
// s (a VM's directory: its QEMU and virtiofsd name sockets and files there).
// It returns nothing where there is no /proc.
func ProcessesMentioning(s string) []blackbox.Process {
	var out []blackbox.Process
	for _, p := range blackbox.Processes() {
		if strings.Contains(p.CommandLine(), s) && blackbox.Alive(p.Pid) {
			out = append(out, p)
		}
	}
	return out
}

// Cmdline is a process's command line, "" if it is gone.
func Cmdline(pid int) string { return strings.Join(blackbox.Cmdline(pid), " ") }

// IsQEMU reports whether pid is a QEMU process.
func IsQEMU(pid int) bool {
	return strings.Contains(Cmdline(pid), "qemu-system")
}
