package qemu

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// procState reads a process's state letter from /proc ("" when the pid
// does not exist).
func procState(pid int) byte {
	if pid <= 0 {
		return 0
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The state follows the parenthesised command name.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return 0
	}
	return stat[i+2]
}

// procArgs returns a live process's argv, or nil when it is gone, a zombie,
// exiting, or unreadable.
func procArgs(pid int) []string {
	if st := procState(pid); st == 0 || st == 'Z' || st == 'X' {
		return nil
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// exiting reports whether pid is still a live process whose command line is
// already gone: the kernel releases a process's memory (and with it
// /proc/pid/cmdline) before its open files, so its sockets and ports are
// still held.
func exiting(pid int) bool {
	st := procState(pid)
	if st == 0 || st == 'Z' || st == 'X' {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && len(b) == 0
}

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

// findProcess looks through the process table for a live process (not this
// one) that matches, and returns its pid, or 0.
func findProcess(match func([]string) bool) int {
	if pids := findProcesses(match); len(pids) > 0 {
		return pids[0]
	}
	return 0
}

// findProcesses lists every process, other than this one, that matches.
func findProcesses(match func([]string) bool) []int {
	des, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if verified(pid, match) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// verified reports whether pid is alive and matches.
func verified(pid int, match func([]string) bool) bool {
	args := procArgs(pid)
	return args != nil && match(args)
}

// killVerified sends SIGKILL to pid only if it still matches, and waits
// briefly for it to go. It never signals a PID that is not ours.
func killVerified(pid int, match func([]string) bool) bool {
	if !verified(pid, match) {
		return false
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	waitGone(pid, match, 5*time.Second)
	return true
}

// signalVerified sends sig to pid if it matches.
func signalVerified(pid int, match func([]string) bool, sig syscall.Signal) bool {
	if !verified(pid, match) {
		return false
	}
	return syscall.Kill(pid, sig) == nil
}

// waitGone polls until pid no longer matches or the timeout passes, and
// reports whether it went.
func waitGone(pid int, match func([]string) bool, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	b := newBackoff(5*time.Millisecond, 100*time.Millisecond)
	for {
		if !verified(pid, match) && !exiting(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(b.next())
	}
}

// readPid reads a pid file.
func readPid(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0, errors.New("bad pid file " + path)
	}
	return pid, nil
}

// Running reports whether pid is the live QEMU of machine m.
func Running(m Machine, pid int) bool { return verified(pid, m.isQEMU()) }
