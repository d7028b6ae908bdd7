package scenario

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"

	"github.com/agent-vm/agent-vm/blackbox"
	"github.com/agent-vm/agent-vm/integration/harness"
	"github.com/agent-vm/agent-vm/integration/portcheck"
)

func lifecycleScenario() harness.Scenario {
	return harness.Scenario{
		Name:    "lifecycle",
		Summary: "boot with the repository's provisioning, files both ways through the workspace, the share not an escape, exec, a commit made in the guest brought back by sync, a guest port forwarded to the host, suspend and resume, a second boot (restart after its QEMU is killed: status says crashed, no process of the VM left; on another host, stop and start) that moves the SSH port another program took meanwhile, stop, reset, destroy",
		NeedsVM: true,
		// Its VMs' first boot is not what it checks.
		Template: "none",
		Verbs:    []string{"create", "status", "start", "exec", "port", "suspend", "resume", "stop", "restart", "logs", "reset", "destroy"},
		Run:      runLifecycle,
	}
}

const lifeBranch = "itest/lifecycle"

// cloudInitFinished waits for cloud-init (a VM stopped before its first boot
// finished rightly provisions again on the next), then prints when it last
// finished its final stage
// (it rewrites the file on every boot it runs), or nothing where the guest
// has no cloud-init (NixOS).
const cloudInitFinished = "if command -v cloud-init >/dev/null; then cloud-init status --wait >/dev/null 2>&1; fi; cat /var/lib/cloud/instance/boot-finished 2>/dev/null || true"

func runLifecycle(ctx context.Context, s *harness.S) {
	l := &lifecycle{s: s, branch: lifeBranch}
	s.Step(ctx, "make a git repo and create a VM", func() error {
		rp, err := s.Prepare(ctx, l.branch, provisionFiles)
		if err != nil {
			return err
		}
		l.repo = rp.Dir
		return s.AllowPackageSources(ctx, l.branch) // provisioning installs a package
	})
	s.Step(ctx, "start boots it to SSH and a healthy agent", func() error { return l.firstBoot(ctx) })
	s.Step(ctx, "the first boot installed the config's package and ran provision.sh", func() error {
		return checkProvisioned(ctx, s, l.branch)
	})
	s.Step(ctx, "the guest sees a file the host just wrote", func() error { return checkHostToGuest(ctx, s, l.st) })
	s.Step(ctx, "the host sees a guest's file, owned by the workspace owner", func() error {
		return checkGuestToHost(ctx, s, l.st, "from-guest.txt")
	})
	var canary string
	s.Step(ctx, "the share is not an escape: the guest's root makes no setuid, root-owned or special file on the host; its symlinks are not followed", func() (err error) {
		if canary, err = writeCanary(s.Dir()); err != nil {
			return err
		}
		return checkShareNotAnEscape(ctx, s, l.st, canary)
	})
	s.Step(ctx, "exec: exit codes propagate, stdout and stderr stay apart", func() error { return checkExec(ctx, s, l.st) })
	s.Step(ctx, "sync brings a commit made in the guest into the repository as refs/remotes/agent-vm/BRANCH", func() error { return l.sync(ctx) })
	s.StepUnless(ctx, "port add: a guest HTTP server answers on the host; port rm ends it", s.Lacks(harness.FeaturePorts), func() error {
		return portcheck.CheckForward(ctx, s, l.branch)
	})
	s.StepUnless(ctx, "port add refuses a host port another program holds, naming it", s.Lacks(harness.FeaturePorts), func() error {
		return portcheck.CheckTaken(ctx, s, l.branch)
	})
	s.Step(ctx, "suspend: status says suspended", func() error { return l.suspend(ctx) })
	s.Step(ctx, "resume: the same boot goes on, the workspace and exec work", func() error { return l.resume(ctx) })
	s.Step(ctx, "start on a running VM says so and changes nothing", func() error { return l.startAgain(ctx) })
	// The second boot: where this test can kill the VM's QEMU (not on
	// another host), the restart after the kill is it, which spares the
	// run a cold boot, and the stop comes after the reset; elsewhere a
	// stop and a start. Either way a forward added while the VM is not
	// running answers after it.
	onHost, crashSkip := s.Host() != "", ""
	if onHost {
		crashSkip = "the VM's QEMU runs on host " + s.Host() + ", not here, where the test kills it"
		s.Step(ctx, "stop shuts it down and leaves no process behind", func() error { return l.stop(ctx) })
	}
	s.StepUnless(ctx, "SIGKILL its QEMU: status says crashed, and its processes go with it", crashSkip, func() error { return l.crash(ctx) })
	var keptPort int
	s.StepUnless(ctx, "port add on the VM while it is not running is kept for the next start", s.Lacks(harness.FeaturePorts), func() error {
		var err error
		keptPort, err = portcheck.AddStopped(ctx, s, l.branch)
		return err
	})
	s.Step(ctx, "another program takes the SSH port agent-vm picked while the VM is down", func() error { return l.takeSSHPort(ctx) })
	if onHost {
		s.Step(ctx, "a second boot: workspace intact, no first-boot setup again", func() error { return l.secondBoot(ctx, "start") })
	}
	s.StepUnless(ctx, "restart recovers it, with a healthy agent: a second boot, workspace intact, no first-boot setup again", crashSkip, func() error {
		return l.secondBoot(ctx, "restart")
	})
	s.Step(ctx, "the boot moved the taken SSH port: a warning names both, status and ssh-config give the new one, exec uses it", func() error {
		return l.checkMovedSSHPort(ctx)
	})
	s.StepUnless(ctx, "the forward kept while not running answers after the boot", s.Lacks(harness.FeaturePorts), func() error {
		return portcheck.CheckAfterBoot(ctx, s, l.branch, keptPort)
	})
	s.Step(ctx, "reset refuses a running VM, naming stop and --force", func() error { return resetRefusesRunning(ctx, s, l.branch) })
	var knownHosts string
	s.Step(ctx, "reset --force, then a failing provision.sh fails start with its log tail", func() (err error) {
		knownHosts, err = resetWithFailingProvision(ctx, s, l.branch)
		return err
	})
	s.Step(ctx, "after reset: same host key, the workspace kept, the rest fresh", func() error {
		return checkAfterReset(ctx, s, l.branch, knownHosts)
	})
	if !onHost {
		s.Step(ctx, "stop shuts it down and leaves no process behind", func() error { return l.stop(ctx) })
	}
	s.Step(ctx, "destroy refuses while the workspace has untracked files", func() error {
		res := s.AgentVM(ctx, "destroy", l.branch)
		if err := harness.Want(res, 1); err != nil {
			return err
		}
		if !strings.Contains(res.Stdout+res.Stderr, "from-guest.txt") {
			return harness.Failf(res, "the refusal does not name the untracked file from-guest.txt")
		}
		if canary != "" {
			if err := checkNoCanary(ctx, s, canary, []string{"destroy", l.branch}); err != nil {
				return err
			}
		}
		if !onHost { // stopped, and left so
			_, err := s.WaitState(ctx, l.branch, "stopped")
			return err
		}
		_, err := s.Healthy(ctx, l.branch)
		return err
	})
	s.Step(ctx, "destroy --force stops it and leaves nothing", func() error {
		domain, err := libvirtName(l.st.Paths.Dir)
		if err != nil && s.OnLibvirt() {
			return err
		}
		if _, err := s.OK(ctx, "destroy", "--force", l.branch); err != nil {
			return err
		}
		if err := checkGone(ctx, s, l.branch, l.st.Paths.Dir); err != nil {
			return err
		}
		if s.OnLibvirt() {
			if err := checkNoLibvirtLeftovers(ctx, domain); err != nil {
				return err
			}
		}
		return checkNoProcesses(l.st)
	})
}

// lifecycle is what the lifecycle scenario learns as it goes.
type lifecycle struct {
	s      *harness.S
	branch string
	repo   string           // the repository the VM was created from
	st     *blackbox.Status // the latest status of the running VM
	// bootID and cloudInit are from the first boot, to compare with the
	// second.
	bootID, cloudInit string
	// taken holds the VM's SSH port from before its second boot, as
	// another program; lastBoot is that boot's output.
	taken    net.Listener
	lastBoot *harness.Result
}

// takeSSHPort listens on the VM's SSH port while the VM is down, as a
// VM of another user or state directory would after picking the same
// port.
func (l *lifecycle) takeSSHPort(ctx context.Context) error {
	st, _, err := l.s.Status(ctx, l.branch, nil)
	if err != nil {
		return err
	}
	if l.taken, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(st.Ports.SSH))); err != nil {
		return harness.Failf(nil, "the stopped VM's SSH port %d cannot be taken: %v", st.Ports.SSH, err)
	}
	l.s.Notef("port %d held", st.Ports.SSH)
	return nil
}

// checkMovedSSHPort: the boot after takeSSHPort moved the port agent-vm
// had picked, said so with both numbers, and the VM answers on the new
// one (exec through it, the pinned host key at its new port).
func (l *lifecycle) checkMovedSSHPort(ctx context.Context) error {
	if l.taken == nil || l.lastBoot == nil {
		return harness.Failf(nil, "no port was taken, or no second boot ran")
	}
	defer l.taken.Close()
	old := l.taken.Addr().(*net.TCPAddr).Port
	st, _, err := l.s.Status(ctx, l.branch, nil)
	if err != nil {
		return err
	}
	if st.Ports.SSH == old {
		return harness.Failf(l.lastBoot, "the VM still has SSH port %d, which another program holds", old)
	}
	if want := fmt.Sprintf("was=%d now=%d", old, st.Ports.SSH); !strings.Contains(l.lastBoot.Stderr, "moved to a free one") || !strings.Contains(l.lastBoot.Stderr, want) {
		return harness.Failf(l.lastBoot, "the boot did not warn that the SSH port moved (%s)", want)
	}
	res, err := l.s.OK(ctx, "ssh-config", l.branch)
	if err != nil {
		return err
	}
	if !strings.Contains(res.Stdout, fmt.Sprintf("\n  Port %d\n", st.Ports.SSH)) {
		return harness.Failf(res, "ssh-config does not give the new SSH port %d", st.Ports.SSH)
	}
	if _, err := l.s.ExecOK(ctx, l.branch, "true"); err != nil {
		return err
	}
	l.st = st
	l.s.Notef("SSH port %d -> %d", old, st.Ports.SSH)
	return nil
}

// firstBoot starts the VM: running, agent healthy, endpoints printed.
func (l *lifecycle) firstBoot(ctx context.Context) error {
	res, err := l.s.Start(ctx, l.branch)
	if err != nil {
		return err
	}
	st, err := l.s.Healthy(ctx, l.branch)
	if err != nil {
		return err
	}
	l.st = st
	sshShown := strings.Contains(res.Stdout, strconv.Itoa(st.Ports.SSH)) || strings.Contains(res.Stdout, st.SSH.Alias)
	if !strings.Contains(res.Stdout, st.MCP.URL) || !sshShown {
		return harness.Failf(res, "start did not print the endpoints: the MCP URL %s and SSH (port %d or host %s)", st.MCP.URL, st.Ports.SSH, st.SSH.Alias)
	}
	if (st.Accel != "kvm" && st.Accel != "tcg") || (st.Share != "virtiofs" && st.Share != "9p") {
		return harness.Failf(nil, "status says accel %q and share %q; want kvm|tcg and virtiofs|9p", st.Accel, st.Share)
	}
	l.s.Notef("%s, workspace over %s, agent healthy", st.Accel, st.Share)
	return nil
}

// startAgain starts the running VM: agent-vm says so and leaves it be.
func (l *lifecycle) startAgain(ctx context.Context) error {
	res, err := l.s.Start(ctx, l.branch)
	if err != nil {
		return err
	}
	if !strings.Contains(strings.ToLower(res.Stdout+res.Stderr), "already running") {
		return harness.Failf(res, "start on a running VM does not say it is already running")
	}
	now, err := l.s.Healthy(ctx, l.branch)
	if err != nil {
		return err
	}
	if now.Pid != l.st.Pid {
		return harness.Failf(nil, "QEMU's pid changed from %d to %d: start rebooted a running VM", l.st.Pid, now.Pid)
	}
	return nil
}

// suspend suspends the running VM (after noting its boot) and checks that
// status says so.
func (l *lifecycle) suspend(ctx context.Context) error {
	var err error
	if l.bootID, err = bootID(ctx, l.s, l.branch); err != nil {
		return err
	}
	if _, err := l.s.Boot(ctx, "suspend", l.branch); err != nil {
		return err
	}
	st, res, err := l.s.Status(ctx, l.branch, harness.StatusKeys())
	if err != nil {
		return err
	}
	if st.State != "suspended" {
		return harness.Failf(res, "after suspend %s is %s (%s), want suspended", l.branch, st.State, st.Detail)
	}
	return nil
}

// resume resumes the suspended VM: running with a healthy agent, the same
// boot (not a reboot), a file the host writes meanwhile seen in the guest.
func (l *lifecycle) resume(ctx context.Context) error {
	if _, err := l.s.Boot(ctx, "resume", l.branch); err != nil {
		return err
	}
	st, err := l.s.Healthy(ctx, l.branch)
	if err != nil {
		return err
	}
	l.st = st
	id, err := bootID(ctx, l.s, l.branch)
	if err != nil {
		return err
	}
	if id != l.bootID {
		return harness.Failf(nil, "the guest's boot id changed across suspend and resume (%s, then %s): it rebooted", l.bootID, id)
	}
	return checkHostToGuest(ctx, l.s, st)
}

// stop notes the boot (its id, cloud-init's last run), then stops the VM.
func (l *lifecycle) stop(ctx context.Context) error {
	if err := l.noteBoot(ctx); err != nil {
		return err
	}
	return checkStop(ctx, l.s, l.st)
}

// noteBoot notes the running guest's boot id and when cloud-init last
// finished, for the next boot to compare.
func (l *lifecycle) noteBoot(ctx context.Context) error {
	var err error
	if l.bootID, err = bootID(ctx, l.s, l.branch); err != nil {
		return err
	}
	res, err := l.s.ExecOK(ctx, l.branch, "sh", "-c", cloudInitFinished)
	if err != nil {
		return err
	}
	l.cloudInit = strings.TrimSpace(res.Stdout)
	return nil
}

// secondBoot boots the VM again with verb (start after a stop, restart
// after a kill): a new QEMU and a new boot, the agent healthy, the guest's
// file still there, and cloud-init's first-boot setup not run again.
func (l *lifecycle) secondBoot(ctx context.Context, verb string) error {
	before := l.st.Pid
	var err error
	if l.lastBoot, err = l.s.Boot(ctx, verb, l.branch); err != nil {
		return err
	}
	st, err := l.s.Healthy(ctx, l.branch)
	if err != nil {
		return err
	}
	if st.Pid == before {
		return harness.Failf(nil, "after %s the VM reports its last QEMU's pid %d", verb, before)
	}
	l.st = st
	res, err := l.s.ExecOK(ctx, l.branch, "cat", "from-guest.txt")
	if err != nil {
		return err
	}
	if strings.TrimSpace(res.Stdout) == "" {
		return harness.Failf(res, "the file the guest wrote before the reboot is empty or gone")
	}
	second, err := bootID(ctx, l.s, l.branch)
	if err != nil {
		return err
	}
	if second == l.bootID {
		return harness.Failf(nil, "the guest's boot id is unchanged (%s): it did not reboot", second)
	}
	if res, err = l.s.ExecOK(ctx, l.branch, "sh", "-c", cloudInitFinished); err != nil {
		return err
	}
	switch again := strings.TrimSpace(res.Stdout); {
	case l.cloudInit == "":
		l.s.Notef("no cloud-init in this guest")
	case again != l.cloudInit:
		return harness.Failf(res, "cloud-init ran again on the second boot: boot-finished was %q, now %q", l.cloudInit, again)
	default:
		l.s.Notef("cloud-init did not run again")
	}
	return nil
}

// crash kills the VM's QEMU (SIGKILL: no clean shutdown) and waits for
// status to say crashed.
func (l *lifecycle) crash(ctx context.Context) error {
	if err := l.noteBoot(ctx); err != nil {
		return err
	}
	pid := l.st.Pid
	if !harness.IsQEMU(pid) {
		return harness.Failf(nil, "status --json says pid %d, which is not a QEMU process (%q)", pid, harness.Cmdline(pid))
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return harness.Failf(nil, "kill -9 %d: %v", pid, err)
	}
	if err := waitGone(ctx, l.s, pid, "QEMU"); err != nil {
		return err
	}
	now, err := l.s.WaitState(ctx, l.branch, "crashed")
	if err != nil {
		return err
	}
	if now.Detail != "" {
		l.s.Notef("%s", harness.Truncate(now.Detail, 60))
	}
	if l.s.Backend() != "qemu" {
		return nil
	}
	// The qemu backend's virtiofsd, egress proxy, relays and forwards
	// watch their QEMU and go with it: none is left to hold the VM's
	// files or ports.
	return l.s.Until(ctx, "the VM's processes to exit after its QEMU", func() (bool, error) {
		if ps := harness.ProcessesMentioning(l.st.Paths.Dir); len(ps) > 0 {
			return false, fmt.Errorf("pid %d (%s) still uses the VM's directory", ps[0].Pid, harness.Truncate(ps[0].CommandLine(), 120))
		}
		return true, nil
	})
}

// sync: a commit the guest's user makes in the workspace reaches the
// repository the VM was created from as refs/remotes/agent-vm/BRANCH, and
// a second sync says it is up to date.
func (l *lifecycle) sync(ctx context.Context) error {
	s := l.s
	msg := "made in the guest " + harness.RandHex(4)
	if _, err := s.ExecOK(ctx, l.branch, "git", "-c", "user.name=agent", "-c", "user.email=agent@vm", "commit", "--allow-empty", "-q", "-m", msg); err != nil {
		return err
	}
	res, err := s.OK(ctx, "sync", l.branch)
	if err != nil {
		return err
	}
	ref := "refs/remotes/agent-vm/" + l.branch
	if !strings.Contains(res.Stdout, ref) || !strings.Contains(res.Stdout, "1 new commit") {
		return harness.Failf(res, "sync's line does not say it brought 1 new commit to %s", ref)
	}
	got, err := harness.Git(ctx, l.repo, "log", "-1", "--format=%s", ref)
	if err != nil || strings.TrimSpace(got) != msg {
		return harness.Failf(res, "%s in %s says %q (%v), not the guest's commit %q", ref, l.repo, got, err, msg)
	}
	again, err := s.OK(ctx, "sync", l.branch)
	if err != nil {
		return err
	}
	if !strings.Contains(again.Stdout, "up to date") {
		return harness.Failf(again, "a second sync does not say it is up to date")
	}
	return nil
}
