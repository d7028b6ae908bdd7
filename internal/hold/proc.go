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
)

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
