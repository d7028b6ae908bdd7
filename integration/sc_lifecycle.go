package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func lifecycleScenario() Scenario {
	return Scenario{
		Name:    "lifecycle",
		Summary: "boot, files both ways through the workspace, exec, stop, boot again, destroy",
		NeedsVM: true,
		Verbs:   []string{"create", "status", "start", "exec", "stop", "destroy"},
		run:     runLifecycle,
	}
}

const lifeBranch = "itest/lifecycle"

// cloudInitFinished prints when cloud-init last finished its final stage
// (it rewrites the file on every boot it runs), or nothing where the guest
// has no cloud-init (NixOS).
const cloudInitFinished = "cat /var/lib/cloud/instance/boot-finished 2>/dev/null || true"

func runLifecycle(ctx context.Context, s *S) {
	var st *vmStatus
	var firstBoot, firstCloudInit string
	s.Step(ctx, "make a git repo and create a VM", func() error {
		_, err := s.prepare(ctx, lifeBranch, nil)
		return err
	})
	s.Step(ctx, "start boots it to SSH and a healthy agent", func() error {
		res, err := s.start(ctx, lifeBranch, 1)
		if err != nil {
			return err
		}
		if st, err = s.healthy(ctx, lifeBranch); err != nil {
			return err
		}
		sshShown := strings.Contains(res.Stdout, strconv.Itoa(st.Ports.SSH)) || strings.Contains(res.Stdout, st.SSH.Alias)
		if !strings.Contains(res.Stdout, st.MCP.URL) || !sshShown {
			return failf(res, "start did not print the endpoints: the MCP URL %s and SSH (port %d or host %s)", st.MCP.URL, st.Ports.SSH, st.SSH.Alias)
		}
		if (st.Accel != "kvm" && st.Accel != "tcg") || (st.Share != "virtiofs" && st.Share != "9p") {
			return failf(nil, "status says accel %q and share %q; want kvm|tcg and virtiofs|9p", st.Accel, st.Share)
		}
		s.notef("%s, workspace over %s, agent healthy", st.Accel, st.Share)
		return nil
	})
	s.Step(ctx, "the guest sees a file the host just wrote", func() error {
		return checkHostToGuest(ctx, s, st)
	})
	s.Step(ctx, "the host sees a guest's file, owned by the workspace owner", func() error {
		return checkGuestToHost(ctx, s, st, "from-guest.txt")
	})
	s.Step(ctx, "exec: exit codes propagate, stdout and stderr stay apart", func() error {
		return checkExec(ctx, s, st)
	})
	s.Step(ctx, "start on a running VM says so and changes nothing", func() error {
		res, err := s.start(ctx, lifeBranch, 1)
		if err != nil {
			return err
		}
		if !strings.Contains(strings.ToLower(res.Stdout+res.Stderr), "already running") {
			return failf(res, "start on a running VM does not say it is already running")
		}
		now, err := s.healthy(ctx, lifeBranch)
		if err != nil {
			return err
		}
		if now.Pid != st.Pid {
			return failf(nil, "QEMU's pid changed from %d to %d: start rebooted a running VM", st.Pid, now.Pid)
		}
		return nil
	})
	s.Step(ctx, "stop shuts it down and leaves no process behind", func() (err error) {
		if firstBoot, err = bootID(ctx, s, lifeBranch); err != nil {
			return err
		}
		res, err := s.execOK(ctx, lifeBranch, "sh", "-c", cloudInitFinished)
		if err != nil {
			return err
		}
		firstCloudInit = strings.TrimSpace(res.Stdout)
		return checkStop(ctx, s, st)
	})
	s.Step(ctx, "a second boot: workspace intact, no first-boot setup again", func() error {
		if _, err := s.start(ctx, lifeBranch, 1); err != nil {
			return err
		}
		var err error
		if st, err = s.healthy(ctx, lifeBranch); err != nil {
			return err
		}
		res, err := s.execOK(ctx, lifeBranch, "cat", "from-guest.txt")
		if err != nil {
			return err
		}
		if strings.TrimSpace(res.Stdout) == "" {
			return failf(res, "the file the guest wrote before the reboot is empty or gone")
		}
		second, err := bootID(ctx, s, lifeBranch)
		if err != nil {
			return err
		}
		if second == firstBoot {
			return failf(nil, "the guest's boot id is unchanged (%s): it did not reboot", second)
		}
		res, err = s.execOK(ctx, lifeBranch, "sh", "-c", cloudInitFinished)
		if err != nil {
			return err
		}
		switch again := strings.TrimSpace(res.Stdout); {
		case firstCloudInit == "":
			s.notef("no cloud-init in this guest")
		case again != firstCloudInit:
			return failf(res, "cloud-init ran again on the second boot: boot-finished was %q, now %q", firstCloudInit, again)
		default:
			s.notef("cloud-init did not run again")
		}
		return nil
	})
	s.Step(ctx, "destroy refuses while the workspace has untracked files", func() error {
		res := s.agentVM(ctx, "destroy", lifeBranch)
		if err := want(res, 1); err != nil {
			return err
		}
		if !strings.Contains(res.Stdout+res.Stderr, "from-guest.txt") {
			return failf(res, "the refusal does not name the untracked file from-guest.txt")
		}
		_, err := s.healthy(ctx, lifeBranch)
		return err
	})
	s.Step(ctx, "destroy --force stops it and leaves nothing", func() error {
		if _, err := s.ok(ctx, "destroy", "--force", lifeBranch); err != nil {
			return err
		}
		if err := checkGone(ctx, s, lifeBranch, st.Paths.Dir); err != nil {
			return err
		}
		return checkNoProcesses(st)
	})
}

// checkHostToGuest writes a file into the workspace on the host and reads
// it in the guest, which runs commands in /workspace.
func checkHostToGuest(ctx context.Context, s *S, st *vmStatus) error {
	content := "written by the host " + randHex(8)
	if err := os.WriteFile(filepath.Join(st.Paths.Workspace, "from-host.txt"), []byte(content+"\n"), 0o644); err != nil {
		return err
	}
	res, err := s.execOK(ctx, st.Branch, "pwd")
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(res.Stdout); got != "/workspace" {
		return failf(res, "exec runs in %q, want /workspace", got)
	}
	res, err = s.execOK(ctx, st.Branch, "cat", "from-host.txt")
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(res.Stdout); got != content {
		return failf(res, "the guest reads %q, want %q", got, content)
	}
	return nil
}

// checkGuestToHost has the guest write a file in /workspace and reads it
// on the host, where it must belong to the workspace's owner (the guest
// user maps to them).
func checkGuestToHost(ctx context.Context, s *S, st *vmStatus, name string) error {
	content := "written by the guest " + randHex(8)
	if _, err := s.execOK(ctx, st.Branch, "sh", "-c", "printf '%s\\n' \"$1\" > \"$2\"", "sh", content, name); err != nil {
		return err
	}
	path := filepath.Join(st.Paths.Workspace, name)
	data, err := os.ReadFile(path)
	if err != nil {
		return failf(nil, "the host cannot read what the guest wrote: %v", err)
	}
	if got := strings.TrimSpace(string(data)); got != content {
		return failf(nil, "the host reads %q in %s, want %q", got, path, content)
	}
	fileUID, fileGID, err := owner(path)
	if err != nil {
		return err
	}
	wsUID, wsGID, err := owner(st.Paths.Workspace)
	if err != nil {
		return err
	}
	if fileUID != wsUID || fileGID != wsGID {
		return failf(nil, "%s belongs to %d:%d on the host, the workspace to %d:%d", path, fileUID, fileGID, wsUID, wsGID)
	}
	return nil
}

// checkExec: exec's exit status is the command's, its stdout and stderr
// stay apart, and it runs as the guest user.
func checkExec(ctx context.Context, s *S, st *vmStatus) error {
	b := st.Branch
	for _, c := range []struct {
		argv []string
		code int
	}{
		{[]string{"true"}, 0},
		{[]string{"sh", "-c", "exit 3"}, 3},
		{[]string{"no-such-command-itest"}, 127},
	} {
		res := s.exec(ctx, b, c.argv...)
		if err := want(res, c.code); err != nil {
			return err
		}
	}
	res, err := s.execOK(ctx, b, "sh", "-c", "echo to-stdout; echo to-stderr >&2")
	if err != nil {
		return err
	}
	if res.Stdout != "to-stdout\n" || !strings.Contains(res.Stderr, "to-stderr") {
		return failf(res, "stdout %q and stderr %q: want to-stdout on stdout only and to-stderr on stderr", res.Stdout, res.Stderr)
	}
	args := []string{"a b", "it's", "$(echo no)", "*", `back\slash`, "ünï"}
	res, err = s.execOK(ctx, b, append([]string{"printf", "%s|"}, args...)...)
	if err != nil {
		return err
	}
	if want := strings.Join(args, "|") + "|"; res.Stdout != want {
		return failf(res, "exec passed the arguments as %q, want %q (each argument exactly as given)", res.Stdout, want)
	}
	res, err = s.execOK(ctx, b, "id", "-un")
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(res.Stdout); got != st.SSH.User {
		return failf(res, "exec runs as %q, want %q", got, st.SSH.User)
	}
	return nil
}

// checkStop stops the VM: status says stopped, QEMU's process is gone, and
// nothing (virtiofsd) still works on the VM's files.
func checkStop(ctx context.Context, s *S, st *vmStatus) error {
	if _, err := s.stop(ctx, st.Branch); err != nil {
		return err
	}
	now, _, err := s.status(ctx, st.Branch, statusKeys())
	if err != nil {
		return err
	}
	if now.State != "stopped" {
		return failf(nil, "after stop the VM is %q, want stopped", now.State)
	}
	return checkNoProcesses(st)
}

// checkNoProcesses: the VM's QEMU (st.Pid) has exited, and no process
// names the VM's directory any more.
func checkNoProcesses(st *vmStatus) error {
	if alive(st.Pid) {
		return failf(nil, "QEMU (pid %d, %s) is still running", st.Pid, truncate(cmdline(st.Pid), 100))
	}
	if ps := processesMentioning(st.Paths.Dir); len(ps) > 0 {
		return failf(nil, "pid %d (%s) still uses the VM's directory", ps[0].Pid, truncate(ps[0].Cmdline, 120))
	}
	return nil
}

// bootID is the guest kernel's boot id: it changes with every boot.
func bootID(ctx context.Context, s *S, branch string) (string, error) {
	res, err := s.execOK(ctx, branch, "cat", "/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(res.Stdout)
	if id == "" {
		return "", failf(res, "the guest has no boot id")
	}
	return id, nil
}

// owner is a file's uid and gid.
func owner(path string) (uid, gid uint32, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, 0, err
	}
	sys, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, 0, fmt.Errorf("no owner information for %s on this system", path)
	}
	return sys.Uid, sys.Gid, nil
}

// waitGone waits until pid has exited, for at most timeout.
func waitGone(ctx context.Context, pid int, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	delay := 20 * time.Millisecond
	for alive(pid) {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(delay):
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
	return true
}
