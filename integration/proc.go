package integration

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// proc is a running process, from /proc.
type proc struct {
	Pid     int
	Cmdline string // arguments joined by spaces
}

// processesMentioning lists the live processes whose command line contains
// s (a VM's directory: its QEMU and virtiofsd name sockets and files there).
// It returns nothing where there is no /proc.
func processesMentioning(s string) []proc {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	self := os.Getpid()
	var out []proc
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == self {
			continue
		}
		cmd := cmdline(pid)
		if cmd != "" && strings.Contains(cmd, s) && alive(pid) {
			out = append(out, proc{Pid: pid, Cmdline: cmd})
		}
	}
	return out
}

// cmdline is a process's command line, "" if it is gone.
func cmdline(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
}

// alive reports whether pid is a process that has not exited (a zombie
// has).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !os.IsNotExist(err)
	}
	// pid (comm) STATE ...; comm may hold spaces and parentheses.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// isQEMU reports whether pid is a QEMU process.
func isQEMU(pid int) bool {
	return strings.Contains(cmdline(pid), "qemu-system")
}
