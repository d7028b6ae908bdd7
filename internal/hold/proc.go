package hold

import (
	"context"
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// Command is the hidden agent-vm command that runs a VM's holder.
const Command = "__hold"

// Launch starts the holder of f detached, unless one runs: the agent-vm
// binary self names, run as `agent-vm __hold --vm-dir marker`, its output
// to logPath, its pid in f.Pid.
func Launch(run execx.Runner, self func() (string, error), f Files, marker, logPath string) error {
	if Pid(f, marker) != 0 {
		return nil
	}
	exe, err := self()
	if err != nil {
		return err
	}
	p, err := run.Start(execx.Detached{Path: exe, Args: []string{Command, "--vm-dir", marker}, StdoutPath: logPath})
	if err != nil {
		return err
	}
	return os.WriteFile(f.Pid, []byte(strconv.Itoa(p.Pid())+"\n"), 0o600)
}

// Wait waits, up to limit, until the holder of f serves its socket (it
// does once its own connection to the guest is up), and says whether it
// does; a holder that is gone does not.
func Wait(ctx context.Context, f Files, marker string, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for delay := 20 * time.Millisecond; ; delay = min(delay*2, 500*time.Millisecond) {
		if _, err := os.Lstat(f.Socket); err == nil {
			return true
		}
		if Pid(f, marker) == 0 || time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return true // not waited for: nothing to say
		case <-time.After(delay):
		}
	}
}

// Socket is f's socket when its holder runs, else "".
func Socket(f Files, marker string) string {
	if Pid(f, marker) == 0 {
		return ""
	}
	return f.Socket
}

// Pid returns the pid of the holder recorded in f.Pid when it is alive and
// its command line holds marker (what names its VM: a recycled pid never
// matches), or 0.
func Pid(f Files, marker string) int {
	b, err := os.ReadFile(f.Pid)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 || !cmdlineHas(pid, marker) {
		return 0
	}
	return pid
}

func cmdlineHas(pid int, marker string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && marker != "" && slices.Contains(strings.Split(string(b), "\x00"), marker)
}

// Stop ends the holder of f (Pid's marker), SIGTERM then SIGKILL after
// grace, and removes its files; a holder that is gone already only has its
// files removed. The holder removes them itself when it ends on SIGTERM;
// after a SIGKILL, or a holder that died, they would be stale.
func Stop(ctx context.Context, f Files, marker string, grace time.Duration) error {
	var err error
	if pid := Pid(f, marker); pid != 0 {
		err = sendSignal(pid, syscall.SIGTERM)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		deadline := time.After(grace)
	wait:
		for cmdlineHas(pid, marker) {
			select {
			case <-ctx.Done():
				break wait
			case <-deadline:
				break wait
			case <-t.C:
			}
		}
		if cmdlineHas(pid, marker) {
			err = sendSignal(pid, syscall.SIGKILL)
		}
	}
	for _, p := range []string{f.Pid, f.Socket, f.Key, f.HostKey} {
		_ = os.Remove(p)
	}
	return err
}

func sendSignal(pid int, sig syscall.Signal) error {
	if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}
