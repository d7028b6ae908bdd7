package scenario

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/agent-vm/agent-vm/blackbox"
	"github.com/agent-vm/agent-vm/integration/harness"
)

// checkHostToGuest writes a file into the workspace on the host and reads
// it in the guest, which runs commands in /workspace.
func checkHostToGuest(ctx context.Context, s *harness.S, st *blackbox.Status) error {
	content := "written by the host " + harness.RandHex(8)
	if err := os.WriteFile(filepath.Join(st.Paths.Workspace, "from-host.txt"), []byte(content+"\n"), 0o644); err != nil {
		return err
	}
	res, err := s.ExecOK(ctx, st.Branch, "pwd")
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(res.Stdout); got != "/workspace" {
		return harness.Failf(res, "exec runs in %q, want /workspace", got)
	}
	res, err = s.ExecOK(ctx, st.Branch, "cat", "from-host.txt")
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(res.Stdout); got != content {
		return harness.Failf(res, "the guest reads %q, want %q", got, content)
	}
	return nil
}

// checkGuestToHost has the guest write a file in /workspace and reads it
// on the host, where it must belong to the workspace's owner (the guest
// user maps to them).
func checkGuestToHost(ctx context.Context, s *harness.S, st *blackbox.Status, name string) error {
	content := "written by the guest " + harness.RandHex(8)
	if _, err := s.ExecOK(ctx, st.Branch, "sh", "-c", "printf '%s\\n' \"$1\" > \"$2\"", "sh", content, name); err != nil {
		return err
	}
	path := filepath.Join(st.Paths.Workspace, name)
	data, err := os.ReadFile(path)
	if err != nil {
		return harness.Failf(nil, "the host cannot read what the guest wrote: %v", err)
	}
	if got := strings.TrimSpace(string(data)); got != content {
		return harness.Failf(nil, "the host reads %q in %s, want %q", got, path, content)
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
		return harness.Failf(nil, "%s belongs to %d:%d on the host, the workspace to %d:%d", path, fileUID, fileGID, wsUID, wsGID)
	}
	return nil
}

// checkExec: exec's exit status is the command's, its stdout and stderr
// stay apart, and it runs as the guest user.
func checkExec(ctx context.Context, s *harness.S, st *blackbox.Status) error {
	b := st.Branch
	for _, c := range []struct {
		argv []string
		code int
	}{
		{[]string{"true"}, 0},
		{[]string{"sh", "-c", "exit 3"}, 3},
		{[]string{"no-such-command-itest"}, 127},
	} {
		res := s.Exec(ctx, b, c.argv...)
		if err := harness.Want(res, c.code); err != nil {
			return err
		}
	}
	res, err := s.ExecOK(ctx, b, "sh", "-c", "echo to-stdout; echo to-stderr >&2")
	if err != nil {
		return err
	}
	if res.Stdout != "to-stdout\n" || !strings.Contains(res.Stderr, "to-stderr") {
		return harness.Failf(res, "stdout %q and stderr %q: want to-stdout on stdout only and to-stderr on stderr", res.Stdout, res.Stderr)
	}
	args := []string{"a b", "it's", "$(echo no)", "*", `back\slash`, "ünï"}
	res, err = s.ExecOK(ctx, b, append([]string{"printf", "%s|"}, args...)...)
	if err != nil {
		return err
	}
	if want := strings.Join(args, "|") + "|"; res.Stdout != want {
		return harness.Failf(res, "exec passed the arguments as %q, want %q (each argument exactly as given)", res.Stdout, want)
	}
	res, err = s.ExecOK(ctx, b, "id", "-un")
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(res.Stdout); got != st.SSH.User {
		return harness.Failf(res, "exec runs as %q, want %q", got, st.SSH.User)
	}
	// A guest agent-vm boots itself (not a Vagrant box) runs under TCG
	// without randomised process maps, so that TCG reuses what it
	// translated (accel.TCGKernelParams); under KVM it keeps them.
	if want := map[string]string{"tcg": "0", "kvm": "2"}[st.Accel]; (st.Backend == "qemu" || st.Backend == "libvirt") && want != "" {
		res, err := s.ExecOK(ctx, b, "cat", "/proc/sys/kernel/randomize_va_space")
		if err != nil {
			return err
		}
		if got := strings.TrimSpace(res.Stdout); got != want {
			return harness.Failf(res, "the guest's kernel.randomize_va_space is %s under %s, want %s", got, st.Accel, want)
		}
	}
	return nil
}

// checkStop stops the VM: status says stopped, QEMU's process is gone, and
// nothing (virtiofsd) still works on the VM's files.
func checkStop(ctx context.Context, s *harness.S, st *blackbox.Status) error {
	if _, err := s.Stop(ctx, st.Branch); err != nil {
		return err
	}
	now, _, err := s.Status(ctx, st.Branch, harness.StatusKeys())
	if err != nil {
		return err
	}
	if now.State != "stopped" {
		return harness.Failf(nil, "after stop the VM is %q, want stopped", now.State)
	}
	return checkNoProcesses(st)
}

// checkNoProcesses: the VM's QEMU (st.Pid) has exited, and no process
// names the VM's directory any more.
func checkNoProcesses(st *blackbox.Status) error {
	if blackbox.Alive(st.Pid) {
		return harness.Failf(nil, "QEMU (pid %d, %s) is still running", st.Pid, harness.Truncate(harness.Cmdline(st.Pid), 100))
	}
	if ps := harness.ProcessesMentioning(st.Paths.Dir); len(ps) > 0 {
		return harness.Failf(nil, "pid %d (%s) still uses the VM's directory", ps[0].Pid, harness.Truncate(ps[0].CommandLine(), 120))
	}
	return nil
}

// bootID is the guest kernel's boot id: it changes with every boot.
func bootID(ctx context.Context, s *harness.S, branch string) (string, error) {
	res, err := s.ExecOK(ctx, branch, "cat", "/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(res.Stdout)
	if id == "" {
		return "", harness.Failf(res, "the guest has no boot id")
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

// waitGone waits until pid (what names it) has exited.
func waitGone(ctx context.Context, s *harness.S, pid int, what string) error {
	return s.Until(ctx, fmt.Sprintf("%s (pid %d) to exit", what, pid), func() (bool, error) {
		return !blackbox.Alive(pid), nil
	})
}

// libvirtName is the libvirt domain and network name of the VM whose
// directory is dir, on a libvirt run: its VM name and the first 8 hex
// digits of its id, from its record (the vagrant and libvirt drivers both
// name them so).
func libvirtName(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return "", err
	}
	var r struct {
		ID     string `json:"id"`
		VMName string `json:"vm_name"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return "", err
	}
	hex := strings.ReplaceAll(r.ID, "-", "")
	if r.VMName == "" || len(hex) < 8 {
		return "", fmt.Errorf("%s names no VM and id (%q, %q)", filepath.Join(dir, "config.json"), r.VMName, r.ID)
	}
	return r.VMName + "-" + hex[:8], nil
}

// checkNoLibvirtLeftovers: after a destroy, libvirt has no domain or
// network of that name, and agent-vm's storage pool no volume of its.
func checkNoLibvirtLeftovers(ctx context.Context, name string) error {
	for _, args := range [][]string{{"list", "--all", "--name"}, {"net-list", "--all", "--name"}, {"vol-list", "agent-vm"}} {
		out, err := exec.CommandContext(ctx, "virsh", append([]string{"-c", "qemu:///system"}, args...)...).CombinedOutput()
		if err != nil {
			if args[0] == "vol-list" && strings.Contains(string(out), "agent-vm") {
				continue // no pool: no volume (the vagrant backend's disks are in vagrant's)
			}
			return harness.Failf(nil, "virsh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		for _, f := range strings.Fields(string(out)) {
			if strings.HasPrefix(f, name) {
				return harness.Failf(nil, "libvirt still has %s after destroy (virsh %s)", f, args[0])
			}
		}
	}
	return nil
}
