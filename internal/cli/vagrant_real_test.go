package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/ports"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
	"github.com/agent-vm/agent-vm/internal/vagrantbox"
)

// TestRealVagrantBackend is issue 15's proof through agent-vm itself: the
// built agent-vm binary, real vagrant and vagrant-libvirt over the libvirtd
// fixture, agent-vm's own box made from the cached base image, a real boot
// (TCG where KVM does not work). One sequence: create -> start -> exec sees
// the workspace both ways -> suspend -> status suspended -> resume -> exec
// -> its QEMU killed -> status crashed -> start recovers it -> stop ->
// destroy. Timings are logged, never asserted.
func TestRealVagrantBackend(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a VM through vagrant twice (minutes under TCG)")
	}
	for _, p := range []string{"vagrant", "qemu-system-x86_64", "ruby"} {
		tu.Program(t, p)
	}
	cache, err := image.DefaultCacheDir()
	if err != nil {
		t.Fatal(err)
	}
	img, err := image.Lookup(cache, image.DefaultBuildName)
	tu.Need(t, err == nil, "no base image to make the box from (run `agent-vm image build`)")
	box, err := vagrantbox.For(img)
	if err != nil {
		t.Fatal(err)
	}
	daemon := libvirtd.ForTest(t)
	bin := tu.AgentVMBinary(t)
	// What this test's VM leaves is what is there after it and was not
	// before (a run killed before its cleanup leaves its own).
	leftovers := func() (domains, handoffs []string) {
		out, _ := daemon.Virsh(context.Background(), "list", "--all", "--name")
		for _, d := range strings.Fields(out) {
			if strings.HasPrefix(d, "agent-vm-vg-") {
				domains = append(domains, d)
			}
		}
		handoffs, _ = filepath.Glob("/var/lib/agent-vm/libvirt/agent-vm-vg-*")
		return domains, handoffs
	}
	domainsBefore, handoffsBefore := leftovers()

	// libvirt's QEMU (libvirt-qemu) must reach VAGRANT_HOME (the box);
	// the state directory is 0700, as root's under /root: what QEMU opens
	// of a VM is handed over in root's default handoff directory,
	// /var/lib/agent-vm/libvirt.
	base, err := os.MkdirTemp("", "agent-vm-vagrant-cli-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	st := filepath.Join(t.TempDir(), "state")
	if err := os.Chmod(filepath.Dir(st), 0o700); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "NO_COLOR=1", "AGENT_VM_VAGRANT_HOME="+filepath.Join(base, "vagrant-home"))
	step := stepTimer(t)
	av := func(args ...string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"--state-dir", st}, args...)...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		cmd.Dir = base
		err := cmd.Run()
		if err != nil {
			return out.String(), &cmdError{args: args, err: err, stderr: errb.String()}
		}
		return out.String(), nil
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := av(args...)
		if err != nil {
			t.Fatalf("%v\nstdout:\n%s", err, out)
		}
		return out
	}
	status := func() (st struct {
		State, Detail string
		SSH           struct{ Held string }
	}) {
		t.Helper()
		if err := json.Unmarshal([]byte(must("status", "vg", "--json")), &st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	state := func() (string, string) {
		t.Helper()
		s := status()
		return s.State, s.Detail
	}
	// The held connection is driver-neutral: a vagrant VM has a holder
	// after start and after resume.
	held := func(after string) {
		t.Helper()
		if s := status(); s.SSH.Held == "" {
			t.Errorf("after %s: no holder (status: %s, %s)", after, s.State, s.Detail)
		}
	}

	repo := tu.Repo(t, false)
	tu.WriteFile(t, filepath.Join(repo, "from-host.txt"), "hello from the host\n")
	tu.Git(t, repo, "add", ".")
	tu.Git(t, repo, "commit", "-qm", "from the host")
	// --port, --ssh-port: ports outside the ranges other state
	// directories' VMs pick from, lowest up, and outside the ephemeral
	// range: on a shared host another VM took this one's SSH port while
	// vagrant booted it (the start then failed, saying so).
	cmd := exec.Command(bin, "--state-dir", st, "create", "--branch", "vg", "--backend", "vagrant", "--memory", "1536M", "--cpus", "2",
		"--port", strconv.Itoa(quietPort(t, 0)), "--ssh-port", strconv.Itoa(quietPort(t, 1)))
	cmd.Dir, cmd.Env = repo, env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("create --backend vagrant: %v\n%s", err, out)
	}
	destroyed := false // by the last step: then there is nothing to clean up
	t.Cleanup(func() {
		if !destroyed {
			if out, err := av("destroy", "vg", "--force"); err != nil {
				t.Errorf("cleanup: %v\n%s", err, out)
			}
		}
		if _, err := daemon.Virsh(context.Background(), "vol-delete", "--pool", "default", box.PoolVolume()); err != nil {
			t.Logf("deleting the box volume: %v", err)
		}
	})
	step("create --backend vagrant")

	if out, err := av("start", "vg"); err != nil {
		t.Fatalf("%v\nstdout:\n%s\nvagrant's log ends:\n%s", err, out, tailOf(filepath.Join(st, "vg", "logs", "vagrant.log")))
	}
	step("start (box add, vagrant up, SSH, agent-mcp, cloud-init)")
	held("start")
	if out := must("exec", "vg", "--", "sh", "-c", "cat from-host.txt && echo from-guest > from-guest.txt"); out != "hello from the host\n" {
		t.Errorf("exec: the guest's /workspace shows %q", out)
	}
	if b, err := os.ReadFile(filepath.Join(st, "vg", "workspace", "from-guest.txt")); err != nil || string(b) != "from-guest\n" {
		t.Errorf("the guest's write to /workspace on the host: %q, %v", b, err)
	}
	if out := must("status", "vg"); !strings.Contains(out, "NOT contained") {
		t.Errorf("status does not say the vagrant VM's network is not contained:\n%s", out)
	}
	if _, err := av("net", "allow", "vg", "example.com"); err == nil || !strings.Contains(err.Error(), "NOT contained") {
		t.Errorf("net allow on a vagrant VM: %v; want a refusal saying its network is not contained", err)
	}
	step("exec both ways, status, net")
	shareNotAnEscape(t, filepath.Join(st, "vg", "workspace"), func(script string) string { return must("exec", "vg", "--", "sh", "-c", script) })
	step("the share is not an escape")

	if out := must("suspend", "vg"); !strings.Contains(out, "still holds its memory") {
		t.Errorf("suspend's output does not say the paused VM holds its memory: %q", out)
	}
	step("suspend")
	if s, d := state(); s != "suspended" || !strings.Contains(d, "still holds its memory") {
		t.Errorf("after suspend: %s (%s); want suspended, saying it holds its memory", s, d)
	}
	must("resume", "vg")
	step("resume (SSH answering)")
	held("resume")
	if out := must("exec", "vg", "--", "cat", "from-guest.txt"); out != "from-guest\n" {
		t.Errorf("exec after resume: %q", out)
	}

	// Killed: libvirt says crashed, vagrant only shutoff.
	pidFile := filepath.Join("/run/libvirt/qemu", machineName(t, st)+".pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("QEMU's pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var s, d string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(3 * time.Second) {
		// status answers from a 15 s cache: wait it out.
		if s, d = state(); s == "crashed" {
			break
		}
	}
	if s != "crashed" || !strings.Contains(d, "agent-vm start vg") {
		t.Errorf("after its QEMU was killed: %s (%s); want crashed with the next step", s, d)
	}
	step("killed QEMU read as crashed")
	if out, err := av("start", "vg"); err != nil {
		t.Fatalf("start after a crash: %v\n%s", err, out)
	}
	step("start recovers it (vagrant up)")
	if out := must("exec", "vg", "--", "cat", "from-guest.txt"); out != "from-guest\n" {
		t.Errorf("exec after recovery: %q", out)
	}
	must("stop", "vg")
	step("stop")
	if s, d := state(); s != "stopped" {
		t.Errorf("after stop: %s (%s)", s, d)
	}
	must("destroy", "vg", "--force")
	destroyed = true
	step("destroy")
	domains, handoffs := leftovers()
	for _, d := range domains {
		if !slices.Contains(domainsBefore, d) {
			t.Errorf("destroy left the libvirt domain %q", d)
		}
	}
	for _, h := range handoffs {
		if !slices.Contains(handoffsBefore, h) {
			t.Errorf("destroy left the machine's files for libvirt's QEMU: %s", h)
		}
	}
}

// quietPort is a free port of 2n000-2n999 + 20000 (n: 0 or 1), a range
// no VM allocation and no outgoing connection takes ports from.
func quietPort(t *testing.T, n int) int {
	t.Helper()
	lo := 20000 + n*1000
	for range 50 {
		if p := lo + rand.IntN(1000); ports.Listenable(p) {
			return p
		}
	}
	t.Fatalf("no free port in %d-%d", lo, lo+999)
	return 0
}

type cmdError struct {
	args   []string
	err    error
	stderr string
}

func (e *cmdError) Error() string {
	return "agent-vm " + strings.Join(e.args, " ") + ": " + e.err.Error() + "\nstderr:\n" + e.stderr
}

// machineName is the VM's vagrant machine (and libvirt domain) name, the
// one entry in vagrant's machine directory.
func machineName(t *testing.T, st string) string {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(st, "vg", "run", "vagrant", ".vagrant", "machines"))
	if err != nil || len(des) != 1 {
		t.Fatalf("vagrant's machines: %v, %v", des, err)
	}
	return des[0].Name()
}

func tailOf(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := strings.Split(string(b), "\n")
	return strings.Join(lines[max(0, len(lines)-40):], "\n")
}

func stepTimer(t *testing.T) func(string) {
	last := time.Now()
	return func(what string) {
		t.Logf("%-60s %6.1fs", what, time.Since(last).Seconds())
		last = time.Now()
	}
}

// shareNotAnEscape has the guest's root (sudo, through exec) try to make a
// root-owned and a setuid file in the workspace (README, "The workspace
// share"): on the host ws, what the guest writes belongs to the
// workspace's owner, and nothing is setuid, setgid or owned by root.
func shareNotAnEscape(t *testing.T, ws string, exec func(script string) string) {
	t.Helper()
	exec(`cd /workspace && echo user > esc-user && sudo sh -c 'echo root > esc-root' 2>/dev/null
echo x > esc-suid; sudo chown 0:0 esc-suid 2>/dev/null; sudo chmod 4755 esc-suid 2>/dev/null; sudo chmod 2755 esc-suid 2>/dev/null; true`)
	var wsSt syscall.Stat_t
	if err := syscall.Stat(ws, &wsSt); err != nil {
		t.Fatal(err)
	}
	if wsSt.Uid == 0 {
		t.Fatalf("the workspace %s is root's: the check below would prove nothing", ws)
	}
	for _, name := range []string{"esc-user", "esc-root", "esc-suid"} {
		var fs syscall.Stat_t
		err := syscall.Lstat(filepath.Join(ws, name), &fs)
		switch {
		case os.IsNotExist(err) && name != "esc-user":
			continue // refused: as good
		case err != nil:
			t.Errorf("%s on the host: %v", name, err)
		case fs.Uid != wsSt.Uid || fs.Gid != wsSt.Gid:
			t.Errorf("the guest's %s is %d:%d on the host; want the workspace owner's %d:%d", name, fs.Uid, fs.Gid, wsSt.Uid, wsSt.Gid)
		case fs.Mode&(syscall.S_ISUID|syscall.S_ISGID) != 0:
			t.Errorf("the guest's %s is setuid or setgid on the host (mode %o)", name, fs.Mode)
		}
	}
}
