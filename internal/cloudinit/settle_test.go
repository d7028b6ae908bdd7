package cloudinit

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/testutil"
)

// SettleCommand waits as `cloud-init status --wait` would, from the same
// files: run with sh in a mount namespace where /run/cloud-init,
// /etc/cloud and /proc/cmdline are the test's own, and a stand-in for
// sleep (labelled: it counts its calls, at the exec boundary), it ends
// without sleeping when this boot's result is written or cloud-init is
// off for the boot, and goes round its loop while the stages run (stopped
// once it has slept twice). No figure of time decides.
func TestSettleCommandWaitsAsCloudInitStatusDoes(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.SkipOrFail(t, "needs root: the guest's paths are mounted over in a mount namespace")
	}
	unshare := testutil.Program(t, "unshare")
	for _, c := range []struct {
		name                      string
		enabled, result, disabled bool
		cmdline                   string
		waits                     bool
	}{
		{name: "the stages run", enabled: true, cmdline: "root=/dev/vda", waits: true},
		{name: "the stages wrote their result", enabled: true, result: true, cmdline: "root=/dev/vda"},
		{name: "the generator left cloud-init off", cmdline: "root=/dev/vda"},
		{name: "the first boot's switch-off is written", enabled: true, disabled: true, cmdline: "root=/dev/vda"},
		{name: "a reprovisioning boot overrides the switch-off", enabled: true, disabled: true, cmdline: "root=/dev/vda " + ReprovisionKernelArg, waits: true},
		{name: "and ends with its result", enabled: true, disabled: true, result: true, cmdline: "root=/dev/vda " + ReprovisionKernelArg},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			run, etc, bin := filepath.Join(dir, "run"), filepath.Join(dir, "etc"), filepath.Join(dir, "bin")
			for _, d := range []string{run, etc, bin} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			write := func(p, s string, mode os.FileMode) {
				if err := os.WriteFile(p, []byte(s), mode); err != nil {
					t.Fatal(err)
				}
			}
			if c.enabled {
				write(filepath.Join(run, "enabled"), "", 0o644)
			}
			if c.result {
				write(filepath.Join(run, "result.json"), "{}", 0o644)
			}
			if c.disabled {
				write(filepath.Join(etc, filepath.Base(cloudInitDisabledFile)), "", 0o644)
			}
			cmdline, slept := filepath.Join(dir, "cmdline"), filepath.Join(dir, "slept")
			write(cmdline, c.cmdline+"\n", 0o644)
			write(filepath.Join(bin, "sleep"), "#!/bin/sh\necho \"$@\" >>"+slept+"\nexec /bin/sleep 0.1\n", 0o755)
			mounts := `set -e
mkdir -p /run/cloud-init /etc/cloud
mount --bind "$1" /run/cloud-init
mount --bind "$2" /etc/cloud
mount --bind "$3" /proc/cmdline
PATH=$4:$PATH exec sh -c "$5"`
			ctx, cancel := context.WithCancel(testutil.Context(t, "SettleCommand"))
			defer cancel()
			cmd := exec.CommandContext(ctx, unshare, "--mount", "--propagation", "private", "sh", "-c", mounts, "mounts", run, etc, cmdline, bin, SettleCommand)
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			sleeps := func() int {
				b, _ := os.ReadFile(slept)
				return strings.Count(string(b), "\n")
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			if c.waits {
				// Until it has slept twice, or ended.
				ended := false
				for !ended && sleeps() < 2 && ctx.Err() == nil {
					select {
					case err := <-done:
						ended = true
						done <- err
					case <-time.After(50 * time.Millisecond):
					}
				}
				cancel()
				<-done
				if n := sleeps(); n < 2 {
					t.Errorf("it did not go round its loop (slept %d times, ended: %v): %s", n, ended, out.String())
				}
				return
			}
			if err := <-done; err != nil {
				t.Fatalf("%v: %s", err, out.String())
			}
			if n := sleeps(); n != 0 {
				t.Errorf("it slept %d times before ending, want none", n)
			}
		})
	}
}
