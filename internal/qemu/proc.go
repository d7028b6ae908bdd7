package qemu

import (
	"path/filepath"
	"slices"

	"github.com/agent-vm/agent-vm/internal/proc"
)

// isQEMUFor matches the QEMU started for the VM with this UUID: its command
// line carries "-uuid <uuid>". A recycled PID never matches.
func isQEMUFor(uuid string) func(args []string) bool {
	return func(args []string) bool { return hasArg(args, "-uuid", uuid) }
}

// isQEMUIn matches the QEMU whose pid file is in runDir: how a VM's QEMU is
// known when its uuid is not (its record is unreadable). Every QEMU the
// launcher starts has "-pidfile <run dir>/qemu.pid" (controlArgs), and no
// two VMs share a run directory.
func isQEMUIn(runDir string) func(args []string) bool {
	pidfile := filepath.Join(runDir, PidFile)
	return func(args []string) bool { return hasArg(args, "-pidfile", pidfile) }
}

// hasArg reports whether args hold flag followed by value (never for an
// empty value).
func hasArg(args []string, flag, value string) bool {
	return value != "" && slices.Contains(argValues(args, flag), value)
}

// argValues returns the arguments that follow flag in args, in order.
func argValues(args []string, flag string) []string {
	var out []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == flag {
			out = append(out, args[i+1])
		}
	}
	return out
}

// isQEMU matches m's QEMU: by its uuid, or by its run directory when the
// uuid is unknown.
func (m Machine) isQEMU() func(args []string) bool {
	if m.UUID == "" {
		return isQEMUIn(m.RunDir)
	}
	return isQEMUFor(m.UUID)
}

// Running reports whether pid is the live QEMU of machine m.
func Running(m Machine, pid int) bool { return proc.Verified(pid, m.isQEMU()) }
