package blackbox

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Process is a live process, as /proc shows it.
type Process struct {
	Pid  int
	Argv []string
}

// Name is the base name of the program the process runs ("" without argv).
func (p Process) Name() string {
	if len(p.Argv) == 0 {
		return ""
	}
	return filepath.Base(p.Argv[0])
}

// Mentions reports whether one of the process's arguments contains s.
func (p Process) Mentions(s string) bool {
	for _, a := range p.Argv {
		if strings.Contains(a, s) {
			return true
		}
	}
	return false
}

// CommandLine is the process's arguments joined by spaces, for messages.
func (p Process) CommandLine() string { return strings.Join(p.Argv, " ") }

// Processes lists the live processes other than this one (kernel threads,
// which have no command line, left out). It returns nothing where there is
// no /proc.
func Processes() []Process {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	self := os.Getpid()
	var out []Process
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == self {
			continue
		}
		if argv := Cmdline(pid); len(argv) > 0 {
			out = append(out, Process{Pid: pid, Argv: argv})
		}
	}
	return out
}

// Cmdline is a process's argv, nil when it is gone (or a kernel thread).
func Cmdline(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
}

// Alive reports whether pid is a process that has not exited (a zombie
// has).
func Alive(pid int) bool {
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
