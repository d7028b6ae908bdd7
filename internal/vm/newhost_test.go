package vm_test

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
	"github.com/agent-vm/agent-vm/internal/vagrant"
	"github.com/agent-vm/agent-vm/internal/vagrantbox"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/vminfo"
	"github.com/agent-vm/agent-vm/internal/wire"
)

// TestNewHost runs what a new user runs, in that order, on a host where
// none of agent-vm's directories exist: setup (which builds the base image
// in the empty cache; where this machine has built one, as CI's own setup
// just did on a new machine, setup is given that image cache and finds it,
// since a second build is minutes of mmdebstrap that check nothing new),
// a qemu VM's whole life (lifecycle, then on the same
// VM workspaceCoherence and suspendResume), then a vagrant VM's
// (vagrantLife). While each VM runs, and at the end, it checks every
// directory agent-vm made against who must pass through or read it:
// libvirt's QEMU (user libvirt-qemu) for the vagrant VM's files, the
// workspace's owner (whom the qemu VM's QEMU, egress proxy and relays run
// as) for the egress sockets and the relay, and nobody else. It is how a
// directory made with the wrong mode by whichever command came first
// (/var/lib/agent-vm made 0700 by the state directories' registry, which
// broke every vagrant start as root on a new machine) is caught: a clean
// clone on a machine that ran agent-vm before hides it.
//
// The host's well-known roots (/var/lib/agent-vm, /run/agent-vm-egress,
// root's cache) are put under a temporary directory standing in for "/"
// (wire.Config.Roots), with /var/lib, /run and /root as Debian has them.
func TestNewHost(t *testing.T) {
	if testing.Short() {
		t.Skip("builds an image and boots a qemu and a vagrant VM (minutes under TCG); not with -short")
	}
	tu.Need(t, os.Geteuid() == 0, "runs as root: what a new root user runs (setup installs packages and builds the base image; the vagrant backend's files go under /var/lib/agent-vm)")
	for _, p := range []string{"qemu-system-x86_64", "mmdebstrap", "vagrant", "ruby", "sh"} {
		tu.Program(t, p)
	}
	h := newHostRoot(t)
	if _, err := image.Lookup(imageDir(), image.DefaultBuildName); err == nil {
		h.roots.Images = imageDir()
	}
	m := h.open(t)
	ctx := tu.Context(t, "a new host's setup and its qemu VM")

	began := time.Now()
	rep, err := m.Host.Setup(ctx, true, "", func([]string) (bool, error) { return true, nil })
	if err != nil {
		t.Fatalf("setup --yes --tests: %v", err)
	}
	if h.roots.Images == "" && rep.Image == "" {
		t.Fatalf("setup built no base image in the new host's empty cache (report %+v)", rep)
	}
	t.Logf("setup (base image %s) in %s", map[bool]string{true: "built", false: "this machine's, found"}[rep.Image != ""], time.Since(began).Round(time.Second))

	t.Run("qemu", func(t *testing.T) {
		e := lifecycle(t, m, vm.CreateOptions{SSHPort: quietPort(t, 0), MCPPort: quietPort(t, 1)}, func(e state.Entry, info vminfo.Info) {
			h.checkEgress(t, info)
		})
		// The same VM (each check its own boot cost a minute of CI's):
		t.Run("workspace", func(t *testing.T) { workspaceCoherence(t, m, e) })
		t.Run("suspend", func(t *testing.T) { suspendResume(t, m, e) })
	})
	t.Run("vagrant", func(t *testing.T) { vagrantLife(t, m, h) })

	// Every well-known directory, as each must be whichever command made
	// it first (the registry was first here: setup opened the manager).
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{
		{h.roots.Lib, 0o711},                              // libvirt's QEMU passes through, nobody lists
		{filepath.Join(h.roots.Lib, "state-dirs"), 0o700}, // the registry
		{filepath.Join(h.roots.Lib, "libvirt"), 0o711},    // the vagrant handoff
		{filepath.Join(h.roots.Lib, "vagrant"), 0o755},    // VAGRANT_HOME
		{h.roots.Egress, 0o711},                           // the relays pass through
		{m.Root.Dir, 0o700},                               // the state directory
		{filepath.Join(h.home, ".local", "share"), 0o700}, // its XDG parent, made for it
		{filepath.Join(h.top, "var", "lib"), 0o755},       // the system's, untouched
	} {
		wantDir(t, d.path, d.mode, 0)
	}
	private := []string{h.roots.Lib, h.roots.Egress, filepath.Join(h.roots.Lib, "libvirt")}
	// The cache and its images, where setup built the image in the new
	// host's cache (with this machine's image found, it made none).
	if h.roots.Images == "" {
		wantDir(t, h.roots.Cache, 0o711, 0) // the cache
		wantDir(t, m.ImageDir(), 0o755, 0)  // the base images
		private = append(private, h.roots.Cache)
	}
	if _, err := os.Stat(filepath.Join(h.roots.Cache, "templates")); err == nil {
		wantDir(t, filepath.Join(h.roots.Cache, "templates"), 0o700, 0)
	}
	nobody := credOf(t, "nobody")
	for _, d := range private {
		if can(t, nobody, "-r", d) {
			t.Errorf("another user can list %s", d)
		}
	}
}

// hostRoot is a new host's "/": /var/lib, /run and /root as Debian has
// them, and none of agent-vm's directories.
type hostRoot struct {
	top, home string
	roots     hostdir.Roots
	env       map[string]string
}

func newHostRoot(t *testing.T) *hostRoot {
	t.Helper()
	// Not t.TempDir(): its directories are 0700, and libvirt's QEMU must
	// pass through this one as through "/".
	top, err := os.MkdirTemp("", "agent-vm-newhost-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	for _, d := range []struct {
		path string
		mode fs.FileMode
	}{{"", 0o755}, {"var", 0o755}, {"var/lib", 0o755}, {"run", 0o755}, {"root", 0o700}} {
		p := filepath.Join(top, d.path)
		if err := os.MkdirAll(p, d.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			t.Fatal(err)
		}
	}
	h := &hostRoot{top: top, home: filepath.Join(top, "root"),
		roots: hostdir.Roots{Lib: filepath.Join(top, "var", "lib", "agent-vm"), Egress: filepath.Join(top, "run", "agent-vm-egress"),
			Cache: filepath.Join(top, "root", ".cache", "agent-vm")}}
	// What agent-vm reads of its environment: a new root login's, without
	// CI's or the developer's AGENT_VM_* and XDG settings.
	h.env = map[string]string{"HOME": h.home, "PATH": os.Getenv("PATH"), "AGENT_VM_ACCEL": os.Getenv("AGENT_VM_ACCEL")}
	return h
}

func (h *hostRoot) getenv(k string) string { return h.env[k] }

// open is wire.Open as the CLI calls it, on this host's roots and the
// default state directory in its root's home.
func (h *hostRoot) open(t *testing.T) *vm.Manager {
	t.Helper()
	exe := tu.AgentVMBinary(t)
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: testWriter{t}})
	m, err := wire.Open(wire.Config{StateDir: wire.DefaultStateDir(h.getenv), Getenv: h.getenv, Log: log, Progress: testWriter{t},
		Executable: func() (string, error) { return exe, nil }, Roots: h.roots})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// checkEgress checks, while the qemu VM runs, what its QEMU's user (the
// workspace's owner: guestfwd's relays run as it, and the egress proxy
// drops to it) must reach: the egress directory and the VM's own in it,
// each root's and 0711, its sockets, and the relay program.
func (h *hostRoot) checkEgress(t *testing.T, info vminfo.Info) {
	t.Helper()
	owner := procCred(t, info.Pid)
	if owner.Uid == 0 {
		t.Errorf("QEMU (pid %d) runs as root: the egress directory's modes prove nothing", info.Pid)
		return
	}
	wantDir(t, h.roots.Egress, 0o711, 0)
	vmDirs, _ := filepath.Glob(filepath.Join(h.roots.Egress, "*", ""))
	vmDirs = slices.DeleteFunc(vmDirs, func(p string) bool { fi, err := os.Stat(p); return err != nil || !fi.IsDir() })
	if len(vmDirs) != 1 {
		t.Errorf("the egress directory %s holds %v; want the running VM's directory", h.roots.Egress, vmDirs)
		return
	}
	wantDir(t, vmDirs[0], 0o711, 0)
	socks, _ := filepath.Glob(filepath.Join(vmDirs[0], "*.sock"))
	if len(socks) == 0 {
		t.Errorf("no egress socket in %s", vmDirs[0])
	}
	for _, s := range socks {
		if !can(t, owner, "-w", s) {
			t.Errorf("QEMU's user (uid %d) cannot use the egress socket %s", owner.Uid, s)
		}
	}
	relays, _ := filepath.Glob(filepath.Join(h.roots.Egress, "relay-*"))
	if len(relays) == 0 {
		t.Errorf("no relay program in %s", h.roots.Egress)
	}
	for _, r := range relays {
		if !can(t, owner, "-x", r) {
			t.Errorf("QEMU's user (uid %d) cannot run the relay %s", owner.Uid, r)
		}
	}
	if can(t, owner, "-r", h.roots.Egress) {
		t.Errorf("QEMU's user (uid %d) can list %s", owner.Uid, h.roots.Egress)
	}
}

// checkHandoff checks, while the vagrant VM runs, what libvirt's QEMU must
// reach: the machine's seed and credential copies in the handoff
// directory, and the box's kernel and initrd in VAGRANT_HOME; and that it
// lists none of agent-vm's directories on the way.
func (h *hostRoot) checkHandoff(t *testing.T) {
	t.Helper()
	qemuUser := credOf(t, "libvirt-qemu")
	handoff := filepath.Join(h.roots.Lib, "libvirt")
	machines, _ := filepath.Glob(filepath.Join(handoff, "agent-vm-vg-*"))
	if len(machines) != 1 {
		t.Fatalf("the handoff directory %s holds %v; want the vagrant VM's", handoff, machines)
	}
	wantDir(t, machines[0], 0o711, 0)
	var files []string
	filepath.WalkDir(machines[0], func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files = append(files, p)
		}
		return nil
	})
	if !slices.ContainsFunc(files, func(p string) bool { return filepath.Base(p) == vagrant.SeedFile }) {
		t.Errorf("no seed among the handed-over files %v", files)
	}
	var boot []string
	filepath.WalkDir(filepath.Join(h.roots.Lib, "vagrant"), func(p string, d fs.DirEntry, err error) error {
		if n := filepath.Base(p); err == nil && d.Type().IsRegular() && (strings.HasPrefix(n, "vmlinuz") || strings.HasPrefix(n, "initrd")) {
			boot = append(boot, p)
		}
		return nil
	})
	if len(boot) < 2 {
		t.Errorf("no kernel and initrd in VAGRANT_HOME: %v", boot)
	}
	for _, f := range append(files, boot...) {
		if !can(t, qemuUser, "-r", f) {
			t.Errorf("libvirt's QEMU (uid %d) cannot read %s", qemuUser.Uid, f)
		}
	}
	for _, d := range []string{h.roots.Lib, handoff, machines[0]} {
		if can(t, qemuUser, "-r", d) {
			t.Errorf("libvirt's QEMU can list %s", d)
		}
	}
}

// vagrantLife is a vagrant VM's life through agent-vm: real vagrant and
// vagrant-libvirt over the libvirtd fixture, agent-vm's own box made from
// the base image setup built, a real boot (TCG where KVM does not work).
// create -> start -> exec sees the workspace both ways, the network is
// said to be uncontained -> the share is not an escape -> suspend ->
// status suspended -> resume -> exec -> its QEMU killed -> status crashed
// -> start recovers it -> stop -> destroy, leaving no domain and no
// handed-over files. Timings are logged, never asserted.
func vagrantLife(t *testing.T, m *vm.Manager, h *hostRoot) {
	daemon := libvirtd.ForTest(t)
	img, err := image.Lookup(m.ImageDir(), image.DefaultBuildName)
	if err != nil {
		t.Fatal(err)
	}
	box, err := vagrantbox.For(img)
	if err != nil {
		t.Fatal(err)
	}
	ctx := tu.Context(t, "the vagrant VM's life")
	leftovers := func() (domains, handoffs []string) {
		out, _ := daemon.Virsh(context.Background(), "list", "--all", "--name")
		for _, d := range strings.Fields(out) {
			if strings.HasPrefix(d, "agent-vm-vg-") {
				domains = append(domains, d)
			}
		}
		handoffs, _ = filepath.Glob(filepath.Join(h.roots.Lib, "libvirt", "agent-vm-vg-*"))
		return domains, handoffs
	}
	domainsBefore, _ := leftovers()
	step := stepTimer(t)

	repo := tu.Repo(t, false)
	tu.WriteFile(t, filepath.Join(repo, "from-host.txt"), "hello from the host\n")
	tu.Git(t, repo, "add", ".")
	tu.Git(t, repo, "commit", "-qm", "from the host")
	// Ports outside the ranges VMs of other state directories (this
	// host's registry knows none of the real host's) pick from.
	if _, err := m.Create(ctx, vm.CreateOptions{Repo: repo, Branch: "vg", Backend: vm.BackendVagrant, CPUs: 2, MemoryMiB: 1536,
		SSHPort: quietPort(t, 2), MCPPort: quietPort(t, 3)}); err != nil {
		t.Fatalf("create --backend vagrant: %v", err)
	}
	e, err := m.Find(ctx, "vg")
	if err != nil {
		t.Fatal(err)
	}
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			if _, err := m.Destroy(ctx, "vg", true); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
		// The box's volume in libvirt's pool (none when vagrant never
		// uploaded it: then there is no pool either).
		if _, err := daemon.Virsh(context.Background(), "vol-delete", "--pool", "default", box.PoolVolume()); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Logf("deleting the box volume: %v", err)
		}
	})
	step("create --backend vagrant")

	if _, err := m.Start(ctx, "vg", vm.StartOptions{}); err != nil {
		t.Fatalf("start: %v\nvagrant's log ends:\n%s", err, tailOf(e.Layout.Log(vagrant.VagrantLog)))
	}
	step("start (box add, vagrant up, SSH, agent-mcp, cloud-init)")
	h.checkHandoff(t)
	status := func() vminfo.Info { t.Helper(); return m.Status(ctx, e, false) }
	held := func(after string) {
		t.Helper()
		if s := status(); s.SSH.Held == "" {
			t.Errorf("after %s: no holder (status: %s, %s)", after, s.State, s.Detail)
		}
	}
	held("start")
	if code, out, errs := run(t, m, "vg", "sh", "-c", "cat from-host.txt && echo from-guest > from-guest.txt"); code != 0 || out != "hello from the host\n" {
		t.Errorf("exec: the guest's /workspace shows %q (exit %d, %s)", out, code, errs)
	}
	if b, err := os.ReadFile(filepath.Join(e.Layout.Workspace(), "from-guest.txt")); err != nil || string(b) != "from-guest\n" {
		t.Errorf("the guest's write to /workspace on the host: %q, %v", b, err)
	}
	// The box's kernel has accel's TCG parameters from the Vagrantfile
	// (norandmaps: kernel.randomize_va_space 0), under TCG only.
	acc := status().Accel
	want := map[string]string{accel.TCG: "0\n", accel.KVM: "2\n"}[acc]
	if code, out, errs := run(t, m, "vg", "cat", "/proc/sys/kernel/randomize_va_space"); code != 0 || out != want {
		t.Errorf("the vagrant guest's kernel.randomize_va_space under %s: %q (exit %d, %s), want %q", acc, out, code, errs, want)
	}
	if s := status(); s.Net == nil || s.Net.Uncontained != "" {
		t.Errorf("status says the vagrant VM's network is not contained: %+v", s.Net)
	}
	if _, err := netpolicy.Allow(ctx, m, "vg", []string{"example.com"}); err != nil {
		t.Errorf("net allow on a vagrant VM: %v", err)
	}
	// The guest's only way out is its egress proxy at the proxy address.
	if code, out, errs := run(t, m, "vg", "sh", "-c", "ip -4 route; echo; cat /etc/environment"); code != 0 ||
		!strings.Contains(out, "10.0.2.100 via ") || strings.Contains(out, "default") || !strings.Contains(out, "http://10.0.2.100:3128") {
		t.Errorf("the guest's routes and proxy: exit %d\n%s%s", code, out, errs)
	}
	step("exec both ways, status, net")
	vagrantForwards(t, status())
	step("agent-mcp through vagrant's forwarded ports")
	shareNotAnEscape(t, e.Layout.Workspace(), func(script string) string {
		code, out, errs := run(t, m, "vg", "sh", "-c", script)
		if code != 0 {
			t.Fatalf("exec %q: exit %d: %s", script, code, errs)
		}
		return out
	})
	step("the share is not an escape")

	sus, err := m.Suspend(ctx, "vg", vm.SuspendOptions{})
	if err != nil {
		t.Fatalf("suspend: %v", err)
	}
	if !strings.Contains(sus.Detail, "still holds its memory") {
		t.Errorf("suspend does not say the paused VM holds its memory: %q", sus.Detail)
	}
	step("suspend")
	if s := status(); s.State != vminfo.StateSuspended || !strings.Contains(s.Detail, "still holds its memory") {
		t.Errorf("after suspend: %s (%s); want suspended, saying it holds its memory", s.State, s.Detail)
	}
	if _, err := m.Resume(ctx, "vg", vm.StartOptions{}); err != nil {
		t.Fatalf("resume: %v", err)
	}
	step("resume (SSH answering)")
	held("resume")
	if _, out, _ := run(t, m, "vg", "cat", "from-guest.txt"); out != "from-guest\n" {
		t.Errorf("exec after resume: %q", out)
	}

	// Killed: libvirt says crashed, vagrant only shutoff.
	pid := libvirtQEMUPid(t, e)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var s vminfo.Info
	// status answers from a 15 s cache: wait it out.
	tu.WaitFor(t, "status to say crashed", func() bool { s = status(); return s.State == vminfo.StateCrashed })
	if !strings.Contains(s.Detail, "agent-vm start vg") {
		t.Errorf("after its QEMU was killed: %s (%s); want crashed with the next step", s.State, s.Detail)
	}
	step("killed QEMU read as crashed")
	if _, err := m.Start(ctx, "vg", vm.StartOptions{}); err != nil {
		t.Fatalf("start after a crash: %v", err)
	}
	step("start recovers it (vagrant up)")
	if _, out, _ := run(t, m, "vg", "cat", "from-guest.txt"); out != "from-guest\n" {
		t.Errorf("exec after recovery: %q", out)
	}
	if _, err := m.Stop(ctx, "vg"); err != nil {
		t.Fatalf("stop: %v", err)
	}
	step("stop")
	if s := status(); s.State != vminfo.StateStopped {
		t.Errorf("after stop: %s (%s)", s.State, s.Detail)
	}
	// The contained network goes with the machine: its libvirt network
	// and its fence.
	if _, err := daemon.Virsh(ctx, "net-info", vagrant.UniqueName(e.Record.MachineName, e.Record.ID)); err == nil {
		t.Error("stop left the VM's libvirt network")
	}
	table := "agent_vm_" + strings.ReplaceAll(e.Record.ID, "-", "")[:8]
	if out, err := exec.Command(tu.Program(t, "nft"), "list", "table", "inet", table).CombinedOutput(); err == nil {
		t.Errorf("stop left the VM's nftables fence:\n%s", out)
	}
	if _, err := m.Destroy(ctx, "vg", true); err != nil {
		t.Fatalf("destroy: %v", err)
	}
	destroyed = true
	step("destroy")
	domains, handoffs := leftovers()
	for _, d := range domains {
		if !slices.Contains(domainsBefore, d) {
			t.Errorf("destroy left the libvirt domain %q", d)
		}
	}
	if len(handoffs) > 0 {
		t.Errorf("destroy left the machine's files for libvirt's QEMU: %v", handoffs)
	}
}

// vagrantForwards checks the ports vagrant forwards to a VM (its
// Vagrantfile's): agent-mcp answers /health on the MCP port without a
// token and refuses its endpoint without one, and both the MCP and SSH
// ports listen on 127.0.0.1 only (vagrant forwards on every address
// unless told otherwise).
func vagrantForwards(t *testing.T, info vminfo.Info) {
	t.Helper()
	resp, err := http.Get(info.MCP.Health)
	if err != nil {
		t.Fatalf("agent-mcp's /health through vagrant's forward: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: HTTP %d, want 200", info.MCP.Health, resp.StatusCode)
	}
	resp, err = http.Post(info.MCP.URL, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
	if err != nil {
		t.Fatalf("agent-mcp through vagrant's forward: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST %s without the token: HTTP %d, want 401", info.MCP.URL, resp.StatusCode)
	}
	for _, addr := range nonLoopbackAddrs(t) {
		for _, port := range []int{info.Ports.SSH, info.Ports.MCP} {
			if c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, strconv.Itoa(port)), time.Second); err == nil {
				c.Close()
				t.Errorf("vagrant's forward of port %d answers on %s, not only on 127.0.0.1", port, addr)
			}
		}
	}
}

// libvirtQEMUPid is the pid of the vagrant VM's QEMU, from libvirt's pid
// file of its domain (vagrant's one machine's name).
func libvirtQEMUPid(t *testing.T, e state.Entry) int {
	t.Helper()
	des, err := os.ReadDir(filepath.Join(e.Layout.Dir, "run", "vagrant", ".vagrant", "machines"))
	if err != nil || len(des) != 1 {
		t.Fatalf("vagrant's machines: %v, %v", des, err)
	}
	b, err := os.ReadFile(filepath.Join("/run/libvirt/qemu", des[0].Name()+".pid"))
	if err != nil {
		t.Fatalf("QEMU's pid file: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// wantDir checks that path is a directory of uid with exactly mode.
func wantDir(t *testing.T, path string, mode fs.FileMode, uid int) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Errorf("%v", err)
		return
	}
	if got := int(fi.Sys().(*syscall.Stat_t).Uid); !fi.IsDir() || fi.Mode().Perm() != mode || got != uid {
		t.Errorf("%s: %v, uid %d; want a directory of uid %d with mode %04o", path, fi.Mode(), got, uid, mode)
	}
}

// can asks the kernel whether a process with cred passes `test op path`
// (-r, -w, -x): a shell run as that user tries.
func can(t *testing.T, cred *syscall.Credential, op, path string) bool {
	t.Helper()
	cmd := exec.Command(tu.Program(t, "sh"), "-c", `test "$1" "$2"`, "sh", op, path)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	if _, exited := err.(*exec.ExitError); err != nil && (!exited || errb.Len() > 0) {
		t.Fatalf("test %s %s as uid %d: %v %s", op, path, cred.Uid, err, errb.String())
	}
	return err == nil
}

// credOf is a user's credentials, with its groups.
func credOf(t *testing.T, name string) *syscall.Credential {
	t.Helper()
	u, err := user.Lookup(name)
	if err != nil {
		tu.SkipOrFail(t, "no user %s here: %v", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	c := &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	gids, _ := u.GroupIds()
	for _, g := range gids {
		n, _ := strconv.Atoi(g)
		c.Groups = append(c.Groups, uint32(n))
	}
	return c
}

// procCred is a running process's user, group and supplementary groups.
func procCred(t *testing.T, pid int) *syscall.Credential {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	c := &syscall.Credential{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":\t")
		f := strings.Fields(v)
		switch {
		case k == "Uid" && len(f) > 1:
			n, _ := strconv.Atoi(f[1]) // effective
			c.Uid = uint32(n)
		case k == "Gid" && len(f) > 1:
			n, _ := strconv.Atoi(f[1])
			c.Gid = uint32(n)
		case k == "Groups":
			for _, g := range f {
				n, _ := strconv.Atoi(g)
				c.Groups = append(c.Groups, uint32(n))
			}
		}
	}
	return c
}

// quietPort is a free port of 20000 + n*1000 to 20999 + n*1000 (n: 0 to
// 3), a range no VM allocation and no outgoing connection takes ports
// from; each n is one of a test's VMs' ports.
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
// root-owned and a setuid file in the workspace (docs/security.md, "The
// workspace share"): on the host ws, what the guest writes belongs to the
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
