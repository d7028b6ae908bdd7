// Package proc finds, signals and waits for host processes by their
// command line, read from /proc: a pid is acted on only while the process
// it names still matches, so a recycled pid is never mistaken for one of
// agent-vm's (a VM's QEMU, a share's virtiofsd). The matchers are the
// callers'; this package knows no program.
package proc

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Match tells from a process's argv whether it is the one looked for.
type Match func(args []string) bool

// state reads a process's state letter from /proc (0 when the pid does
// not exist).
func state(pid int) byte {
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

// Session returns the session a live process belongs to (the pid of the
// session's leader, which a detached start makes the started program), or
// 0 when it is gone. The kernel gives no new process a pid that is a
// session's id while a member of that session lives, so the members of a
// session outlive their leader without being mistaken for anything else.
func Session(pid int) int {
	if st := state(pid); st == 0 || st == 'Z' || st == 'X' {
		return 0
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := afterComm(stat)
	if len(f) < 4 {
		return 0
	}
	sid, err := strconv.Atoi(f[3])
	if err != nil {
		return 0
	}
	return sid
}

// afterComm splits /proc/PID/stat's fields after the parenthesised command
// name (state, ppid, pgrp, session, ...), which may itself hold spaces and
// parentheses.
func afterComm(stat []byte) []string {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(stat[i+1:]))
}

// Parents maps each process under procDir ("/proc", or a test's stand-in
// tree) to its parent's pid. A process gone while it is read is left out.
func Parents(procDir string) map[int]int {
	out := map[int]int{}
	des, _ := os.ReadDir(procDir)
	for _, de := range des {
		pid, err := strconv.Atoi(de.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(procDir + "/" + de.Name() + "/stat")
		if err != nil {
			continue
		}
		if f := afterComm(stat); len(f) >= 2 {
			if ppid, err := strconv.Atoi(f[1]); err == nil {
				out[pid] = ppid
			}
		}
	}
	return out
}

// Args returns a live process's argv, or nil when it is gone, a zombie,
// exiting, or unreadable.
func Args(pid int) []string {
	if st := state(pid); st == 0 || st == 'Z' || st == 'X' {
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
	st := state(pid)
	if st == 0 || st == 'Z' || st == 'X' {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && len(b) == 0
}

// Find looks through the process table for a live process (not this
// one) that matches, and returns its pid, or 0.
func Find(match Match) int {
	if pids := FindAll(match); len(pids) > 0 {
		return pids[0]
	}
	return 0
}

// FindAll lists every process, other than this one, that matches.
func FindAll(match Match) []int {
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
		if Verified(pid, match) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Verified reports whether pid is alive and matches.
func Verified(pid int, match Match) bool {
	args := Args(pid)
	return args != nil && match(args)
}

// Kill sends SIGKILL to pid only if it still matches, and waits briefly
// for it to go. It never signals a pid that is not ours.
func Kill(pid int, match Match) bool {
	if !Verified(pid, match) {
		return false
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	WaitGone(pid, match, 5*time.Second)
	return true
}

// Signal sends sig to pid if it matches.
func Signal(pid int, match Match, sig syscall.Signal) bool {
	if !Verified(pid, match) {
		return false
	}
	return syscall.Kill(pid, sig) == nil
}

// WaitGone polls until pid no longer matches (and is not exiting) or the
// timeout passes, and reports whether it went.
func WaitGone(pid int, match Match, timeout time.Duration) bool {
	return waitGone(context.Background(), pid, match, timeout, 5*time.Millisecond, 100*time.Millisecond)
}

// WaitGoneCtx is WaitGone that also ends, false, with ctx.
func WaitGoneCtx(ctx context.Context, pid int, match Match, timeout time.Duration) bool {
	return waitGone(ctx, pid, match, timeout, 20*time.Millisecond, 250*time.Millisecond)
}

// waitGone polls with delays doubling from first up to most.
func waitGone(ctx context.Context, pid int, match Match, timeout, first, most time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for wait := first; ; wait = min(2*wait, most) {
		if !Verified(pid, match) && !exiting(pid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
	}
}

// ReadPid reads a pid file.
func ReadPid(path string) (int, error) {
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

// ResidentBytes is the host RAM a process holds (its resident set, VmRSS
// in /proc/pid/status); ok is false when the process is gone or it cannot
// be read.
func ResidentBytes(pid int) (n int64, ok bool) {
	if pid <= 0 {
		return 0, false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		v, found := strings.CutPrefix(line, "VmRSS:")
		if !found {
			continue
		}
		kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return 0, false
		}
		return kib << 10, true
	}
	return 0, false
}
