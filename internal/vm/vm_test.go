package vm_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/debian"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hold"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/qemu/qemutest"
	"github.com/agent-vm/agent-vm/internal/sharejail"
	"github.com/agent-vm/agent-vm/internal/sshkeys"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// These tests boot real VMs (Debian, cloud-init, QEMU under TCG here) from
// the base image `agent-vm image build` makes. Each boot takes about a
// minute on the machines CI runs on; they are skipped under -short.

func imageDir() string {
	d, _ := image.DefaultCacheDir()
	return d
}

// plainManager is the real orchestration over a new state directory, with
// no backend.
func plainManager(t *testing.T) *vm.Manager {
	t.Helper()
	root, err := state.Open(hostdir.StateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: testWriter{t}})
	launcher, err := qemu.NewLauncher(execx.OS{}, log)
	if err != nil {
		t.Fatal(err)
	}
	dirs := hostdir.NewTable(hostdir.Roots{}, os.Getenv, os.Geteuid())
	launcher.Egress = dirs.Egress
	m := vm.New(root, execx.OS{}, log, []driver.Driver{qemu.NewDriver(launcher)})
	// Registered as agent-vm registers any state directory: the test's VMs
	// and those of agent-vm runs beside it (integration-test, a user's)
	// do not take each other's ports.
	m.Registry = &state.Registry{Dir: dirs.Registry}
	if err := m.Registry.Add(root.Dir); err != nil {
		t.Fatal(err)
	}
	return m
}

// newManager wires the real orchestration with the qemu backend.
func newManager(t *testing.T) *vm.Manager {
	t.Helper()
	if testing.Short() {
		t.Skip("boots VMs; skipped under -short")
	}
	tu.Program(t, "qemu-system-x86_64")
	_, err := image.Lookup(imageDir(), image.DefaultBuildName)
	tu.Need(t, err == nil, "no base image: run `agent-vm image build`")
	m := plainManager(t)
	exe := tu.AgentVMBinary(t)
	be := &debian.Backend{Run: execx.OS{}, Log: m.Log, ImageDir: imageDir(), Executable: func() (string, error) { return exe, nil }}
	m.Backends[be.Name()] = be
	m.Executable = func() (string, error) { return exe, nil } // the egress proxy and relays
	kernels, _ := filepath.Glob(filepath.Join(imageDir(), "*", "vmlinuz*"))
	prober := &accel.Prober{Run: execx.OS{}, QEMU: "qemu-system-x86_64", Kernels: kernels, Override: os.Getenv("AGENT_VM_ACCEL"),
		CacheDir: hostdir.Top(t.TempDir(), 0o700, hostdir.InXDG)}
	m.Accel = prober.Probe
	return m
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// TestMain removes the agent-vm binary the tests built, once they are done.
func TestMain(m *testing.M) {
	qemutest.Main()
	code := m.Run()
	tu.RemoveAgentVMBinary()
	os.Exit(code)
}

func create(t *testing.T, m *vm.Manager, branch string) state.Entry {
	t.Helper()
	return createWith(t, m, vm.CreateOptions{Branch: branch})
}

// createWith creates o.Branch's qemu VM (1 CPU, 1 GiB) of a new repository
// with a remote, with o's ports, and stops it when the test ends.
func createWith(t *testing.T, m *vm.Manager, o vm.CreateOptions) state.Entry {
	t.Helper()
	branch := o.Branch
	o.Repo, o.Backend, o.CPUs, o.MemoryMiB = tu.Repo(t, true), vm.BackendQEMU, 1, 1024
	if _, err := m.Create(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	e, err := m.Find(context.Background(), branch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if t.Failed() {
			t.Logf("serial console of %s:\n%s", branch, driver.TailFile(e.Layout.Log(qemu.ConsoleLog), 40))
		}
		m.Stop(ctx, branch)
	})
	return e
}

func start(t *testing.T, m *vm.Manager, branch string) *vm.StartResult {
	t.Helper()
	ctx := tu.Context(t, "VM start")
	res, err := m.Start(ctx, branch, vm.StartOptions{})
	if err != nil {
		t.Fatalf("start %s: %v", branch, err)
	}
	t.Logf("%s: SSH after %s, agent-mcp after %s (%s)", branch, res.SSHReady, res.HealthReady, res.Info.Accel)
	return res
}

// guestSh is a function that runs a shell script in branch's guest (as
// exec does) and returns its output, trimmed; a failure is fatal.
func guestSh(t *testing.T, m *vm.Manager, branch string) func(script string) string {
	return func(script string) string {
		t.Helper()
		code, out, errs := run(t, m, branch, "sh", "-c", script)
		if code != 0 {
			t.Fatalf("%s: %s: exit %d: %s", branch, script, code, errs)
		}
		return strings.TrimSpace(out)
	}
}

func run(t *testing.T, m *vm.Manager, branch string, argv ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code, err := m.Exec(context.Background(), branch, argv, nil, &out, &errb)
	if err != nil {
		t.Fatalf("exec %v: %v", argv, err)
	}
	return code, out.String(), errb.String()
}

// Allowed names that the egress proxy resolves itself (egress.TestHostsEnv):
// tlsTestName to the host's loopback, hostAddrTestName to the host's
// primary address, cgnatTestName to cgnatTestAddr (shared address space,
// as a tailnet's machines have).
const (
	tlsTestName      = "itest-tls.test"
	hostAddrTestName = "itest-host-addr.test"
	cgnatTestName    = "itest-cgnat.test"
	cgnatTestAddr    = "100.64.0.7"
)

// lifecycle is a qemu VM's life on the host m manages (TestNewHost runs
// it): the first boot, the network's containment, the held connection,
// exec, shell, logs, the workspace, the pinned host key. started is
// called once the first start returned, with the VM running; o gives the
// VM's ports (0: allocate). It returns the VM, running.
func lifecycle(t *testing.T, m *vm.Manager, o vm.CreateOptions, started func(state.Entry, vminfo.Info)) state.Entry {
	// The host "added" a CA (as a TLS-inspecting proxy's is here); an HTTPS
	// server on the host's loopback presents a certificate it signed.
	caPEM, tlsServer := hostCAAndServer(t)
	_, untrustedServer := hostCAAndServer(t) // a CA the host did not add
	m.HostCAs = func() ([]string, error) { return []string{caPEM}, nil }
	primary := primaryAddr(t)
	// Inherited by the egress proxy.
	t.Setenv(egress.TestHostsEnv, tlsTestName+"=127.0.0.1,"+hostAddrTestName+"="+primary+","+cgnatTestName+"="+cgnatTestAddr)
	o.Branch = "life"
	e := createWith(t, m, o)
	// The proxy checks the test names' addresses as any name's: the TLS
	// server on the host's loopback is reached because 127.0.0.1 itself is
	// allowed. The host's primary address is not.
	if _, err := netpolicy.Allow(context.Background(), m, "life", []string{tlsTestName, "127.0.0.1", hostAddrTestName, cgnatTestName}); err != nil {
		t.Fatal(err)
	}
	res := start(t, m, "life")
	info := res.Info
	if info.State != vminfo.StateRunning || info.Agent.State != "healthy" || info.Share == "" {
		t.Fatalf("after start: state %s, agent %+v, share %q", info.State, info.Agent, info.Share)
	}
	started(e, info)
	// start returned after the first boot's setup ended (its last step
	// switches cloud-init off), so a kill from now on loses none of it.
	if code, _, errs := run(t, m, "life", "test", "-e", "/etc/cloud/cloud-init.disabled"); code != 0 {
		t.Errorf("start returned before the guest's first-boot setup ended (%d): %s", code, errs)
	}

	// Commands reach the guest through the VM's holder (the held
	// connection, internal/hold), which start left serving on a socket
	// only the owner can use. Without it they dial the guest directly, and
	// start on the running VM starts it again.
	heldCheck(t, m, e, info)

	// The guest trusts the host's CA: curl verifies the server's
	// certificate, through the egress proxy (configured in the guest's
	// environment), which leads the allowed test name to the host's
	// loopback and passes TLS through untouched.
	if code, out, errs := run(t, m, "life", "curl", "-sS", "--max-time", "60", "https://"+tlsTestName+":"+tlsServer); code != 0 || out != "trusted\n" {
		t.Errorf("HTTPS from the guest to a server whose certificate the host's CA signed: exit %d, %q %s", code, out, errs)
	}
	if code, _, _ := run(t, m, "life", "curl", "-sS", "--max-time", "60", "https://"+tlsTestName+":"+untrustedServer); code != 60 {
		t.Errorf("HTTPS to a server signed by a CA nobody added: curl exit %d, want 60 (certificate not trusted)", code)
	}
	// The host's loopback is not reachable directly (restrict=on)...
	if code, out, errs := run(t, m, "life", "curl", "-sS", "--noproxy", "*", "--max-time", "20", "-k", "https://10.0.2.2:"+tlsServer); code == 0 {
		t.Errorf("the guest reached the host's loopback at 10.0.2.2 directly: %q %s", out, errs)
	}
	// Through the proxy, a name not allowed is refused with the rule and
	// the command that allows it.
	if code, out, _ := run(t, m, "life", "curl", "-sS", "--max-time", "20", "http://not-allowed.test/"); code != 0 ||
		!strings.Contains(out, "rule: not on the allow-list") || !strings.Contains(out, "agent-vm net allow --vm life not-allowed.test") {
		t.Errorf("a denied name through the proxy: exit %d, %q", code, out)
	}
	// An allowed name that leads to the host's own address does not reach
	// a host service listening on all addresses: the proxy answers 502
	// with its refusal (curl, without -f, prints it).
	hostURL := "http://" + net.JoinHostPort(hostAddrTestName, hostServiceOnAllAddrs(t)) + "/"
	want := hostAddrTestName + " resolves to " + primary + ", an address of this host"
	if code, out, errs := run(t, m, "life", "curl", "-sS", "--max-time", "20", hostURL); strings.Contains(out, "host service") || !strings.Contains(out, want) {
		t.Errorf("an allowed name leading to the host's own address %s: exit %d, %q %s; want the proxy's refusal %q", primary, code, out, errs, want)
	}
	// Nor does one that leads to a range that is not globally reachable
	// (the proxy refuses before it dials: nothing leaves this machine).
	want = cgnatTestName + " resolves to " + cgnatTestAddr + ", in 100.64.0.0/10 (shared address space, CGNAT), which is not globally reachable"
	if code, out, errs := run(t, m, "life", "curl", "-sS", "--max-time", "20", "http://"+cgnatTestName+"/"); !strings.Contains(out, want) {
		t.Errorf("an allowed name leading to %s: exit %d, %q %s; want the proxy's refusal %q", cgnatTestAddr, code, out, errs, want)
	}

	// As root, QEMU, the share's virtiofsd and the proxy that parsed those
	// requests run as agent-vm's own account, which the root-owned
	// workspace was handed to: never root, never a person's account.
	if os.Geteuid() == 0 {
		uid, gid, ok, err := hostpkgs.Host{}.AccountIDs()
		if err != nil || !ok {
			t.Fatalf("as root, no account %s after create: %v", hostpkgs.Account, err)
		}
		netDir := filepath.Join(e.Layout.Dir, netpolicy.Dir)
		var proxy, jail int
		des, _ := os.ReadDir("/proc")
		for _, de := range des {
			b, _ := os.ReadFile(filepath.Join("/proc", de.Name(), "cmdline"))
			args := strings.Split(string(b), "\x00")
			if len(args) > 2 && args[1] == "__net-proxy" && slices.Contains(args, netDir) {
				proxy, _ = strconv.Atoi(de.Name())
			}
			if len(args) > 2 && args[1] == sharejail.Command && strings.Contains(string(b), e.Layout.Dir) {
				jail, _ = strconv.Atoi(de.Name())
			}
		}
		virtiofsd := 0
		for _, de := range des {
			b, _ := os.ReadFile(filepath.Join("/proc", de.Name(), "stat"))
			// "pid (comm) state ppid ...", comm being anything.
			if i := strings.LastIndex(string(b), ") "); i > 0 && jail > 0 {
				if f := strings.Fields(string(b[i+2:])); len(f) > 1 && f[1] == strconv.Itoa(jail) {
					virtiofsd, _ = strconv.Atoi(de.Name())
				}
			}
		}
		ids := func(pid int) string {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			_, u, _ := strings.Cut(string(b), "\nUid:\t")
			u, _, _ = strings.Cut(u, "\t")
			_, g, _ := strings.Cut(string(b), "\nGid:\t")
			g, _, _ = strings.Cut(g, "\t")
			return u + ":" + g
		}
		want := strconv.Itoa(uid) + ":" + strconv.Itoa(gid)
		procs := []struct {
			what string
			pid  int
		}{{"QEMU", info.Pid}, {"the egress proxy", proxy}}
		if info.Share == string(driver.ShareVirtiofs) {
			procs = append(procs, struct {
				what string
				pid  int
			}{"virtiofsd (the jail's child)", virtiofsd})
		}
		for _, p := range procs {
			if got := ids(p.pid); p.pid == 0 || got != want {
				t.Errorf("%s (pid %d) runs as %q, want agent-vm's account %s", p.what, p.pid, got, want)
			}
		}
		if fi, err := os.Stat(e.Layout.Workspace()); err != nil || fi.Sys().(*syscall.Stat_t).Uid != uint32(uid) {
			t.Errorf("the workspace is not the account's: %v", err)
		}
	}

	// The guidance note in dev's home tells agents where they are; the
	// directories it lives in are dev's.
	if code, out, errs := run(t, m, "life", "sh", "-c", "stat -c %U ~/.claude ~/.codex ~/.gemini && grep -l 'branch `life`' ~/.claude/CLAUDE.md ~/.codex/AGENTS.md ~/.gemini/GEMINI.md ~/AGENTS.md | wc -l"); code != 0 || out != "dev\ndev\ndev\n4\n" {
		t.Errorf("guidance notes: exit %d, %q %s", code, out, errs)
	}

	// /health through the forwarded port, on 127.0.0.1 only.
	resp, err := http.Get(info.MCP.Health)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"status"`) {
		t.Errorf("/health: %d %s", resp.StatusCode, body)
	}
	for _, addr := range nonLoopbackAddrs(t) {
		if c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, fmt.Sprint(info.Ports.MCP)), time.Second); err == nil {
			c.Close()
			t.Errorf("the MCP port answers on %s, not only on 127.0.0.1", addr)
		}
	}

	// The workspace, both ways, with the workspace owner's ownership.
	ws := e.Layout.Workspace()
	tu.WriteFile(t, filepath.Join(ws, "from-host.txt"), "hello from the host\n")
	if code, out, _ := run(t, m, "life", "cat", "from-host.txt"); code != 0 || out != "hello from the host\n" {
		t.Errorf("guest reading the host's file: %d %q", code, out)
	}
	if code, _, errs := run(t, m, "life", "sh", "-c", "echo from the guest > from-guest.txt"); code != 0 {
		t.Fatalf("guest writing: %d %s", code, errs)
	}
	b, err := os.ReadFile(filepath.Join(ws, "from-guest.txt"))
	if err != nil || string(b) != "from the guest\n" {
		t.Errorf("host reading the guest's file: %q %v", b, err)
	}
	wsInfo, _ := os.Stat(ws)
	fi, _ := os.Stat(filepath.Join(ws, "from-guest.txt"))
	if fi != nil && fi.Sys().(*syscall.Stat_t).Uid != wsInfo.Sys().(*syscall.Stat_t).Uid {
		t.Errorf("the guest's file belongs to uid %d, the workspace to %d", fi.Sys().(*syscall.Stat_t).Uid, wsInfo.Sys().(*syscall.Stat_t).Uid)
	}

	// Exit codes and separate streams.
	if code, out, errs := run(t, m, "life", "sh", "-c", "echo out; echo err >&2; exit 3"); code != 3 || out != "out\n" || errs != "err\n" {
		t.Errorf("exit 3: code %d out %q err %q", code, out, errs)
	}
	if code, _, _ := run(t, m, "life", "no-such-command"); code != 127 {
		t.Errorf("a missing command: code %d, want 127", code)
	}

	// shell, on a real terminal (script(1) gives it a PTY): raw mode, the
	// remote shell's output, and its exit status.
	script := tu.Program(t, "script")
	cmd := exec.Command(script, "-qec", tu.AgentVMBinary(t)+" --state-dir "+m.Root.Dir+" shell life", "/dev/null")
	cmd.Dir = t.TempDir() // outside any repository: "life" names the one VM there is
	cmd.Stdin = strings.NewReader("echo shell-says-$((6*7)); tty; exit 7\n")
	out, _ := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 7 || !strings.Contains(string(out), "shell-says-42") || !strings.Contains(string(out), "/dev/pts/") {
		t.Errorf("shell: exit %d, output:\n%s", code, out)
	}

	// logs: the serial console and agent-mcp's journal.
	var logs bytes.Buffer
	if err := m.Logs(context.Background(), "life", vm.LogsOptions{Lines: 100}, &logs); err != nil {
		t.Errorf("logs: %v", err)
	}
	if l := logs.String(); !strings.Contains(l, "==> serial console") || !strings.Contains(l, "==> agent-mcp journal") || !strings.Contains(l, "serving MCP") {
		t.Errorf("logs lack the console or agent-mcp's journal:\n%s", l)
	}

	// A host key other than the pinned one is refused.
	impostor, _ := sshkeys.Generate("impostor")
	kh := filepath.Join(t.TempDir(), "known_hosts")
	os.WriteFile(kh, []byte(sshkeys.KnownHostsLine(info.Ports.SSH, impostor.Public)), 0o600)
	_, err = sshx.Dial(context.Background(), sshx.Target{Addr: fmt.Sprintf("127.0.0.1:%d", info.Ports.SSH), User: "dev",
		KeyFile: e.Layout.ClientKey(), KnownHosts: kh}, 30*time.Second)
	if !errors.Is(err, sshx.ErrHostKeyMismatch) {
		t.Errorf("a different pinned key: got %v, want a host key mismatch", err)
	}

	// A stop and a second boot (no process left, cloud-init not run
	// again, the workspace kept), a crash (SIGKILL to QEMU: status says
	// crashed, no process of the VM left) and the restart that recovers it
	// are the integration test's lifecycle scenario's: each boot here
	// costs a minute of CI's under TCG.
	return e
}

// Bad inputs that fail before anything boots. A port the user chose
// (--ssh-port) that another program holds is refused, naming it; one
// agent-vm picked moves instead (TestTemplate's second VM).
func TestStartRefusesATakenPort(t *testing.T) {
	m := newManager(t)
	e := createWith(t, m, vm.CreateOptions{Branch: "taken", SSHPort: quietPort(t, 2)})
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", e.Record.Ports.SSH))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = m.Start(context.Background(), "taken", vm.StartOptions{})
	if !errors.Is(err, ports.ErrTaken) || !strings.Contains(err.Error(), fmt.Sprint(e.Record.Ports.SSH)) {
		t.Errorf("got %v, want a port-taken error naming %d", err, e.Record.Ports.SSH)
	}
	if procs := processesMentioning(e.Layout.Dir); len(procs) > 0 {
		t.Errorf("a refused start left %v", procs)
	}
}

func TestCreateRefusesABadImage(t *testing.T) {
	m := newManager(t)
	repo := tu.Repo(t, false)
	notImage := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(notImage, []byte(strings.Repeat("just text\n", 200000)), 0o644)
	for path, want := range map[string]string{filepath.Join(t.TempDir(), "missing.qcow2"): "does not exist", notImage: notImage} {
		_, err := m.Create(context.Background(), vm.CreateOptions{Repo: repo, Branch: "img", Backend: vm.BackendQEMU, Image: path})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("--image %s: got %v, want it to mention %q", path, err, want)
		}
	}
	if entries, _ := m.Root.List(); len(entries) != 0 {
		t.Errorf("a refused create left %d VM dirs", len(entries))
	}
}

// processesMentioning lists live processes whose command line mentions s.
func processesMentioning(s string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		if stat, _ := os.ReadFile(filepath.Join(d, "stat")); bytes.Contains(stat, []byte(") Z ")) {
			continue
		}
		cmd := strings.ReplaceAll(string(b), "\x00", " ")
		if strings.Contains(cmd, s) {
			out = append(out, filepath.Base(d)+": "+cmd)
		}
	}
	return out
}

// nonLoopbackAddrs are this host's IPv4 addresses other than 127.0.0.0/8.
func nonLoopbackAddrs(t *testing.T) []string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			out = append(out, ipn.IP.String())
		}
	}
	return out
}

// primaryAddr is the host's first global-unicast IPv4 address other than
// loopback.
func primaryAddr(t *testing.T) string {
	t.Helper()
	for _, a := range nonLoopbackAddrs(t) {
		if net.ParseIP(a).IsGlobalUnicast() {
			return a
		}
	}
	t.Fatal("this host has no global-unicast IPv4 address other than loopback: the check that the egress proxy refuses the host's own address needs one")
	return ""
}

// hostServiceOnAllAddrs serves "host service" on all of the host's
// addresses until the test ends, and returns its port.
func hostServiceOnAllAddrs(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "host service") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// hostCAAndServer makes a CA and an HTTPS server on 127.0.0.1 whose
// certificate (for 10.0.2.2, the host as QEMU's user network shows it to
// the guest) that CA signed. It returns the CA's PEM and the server's port.
func hostCAAndServer(t *testing.T) (caPEM, port string) {
	t.Helper()
	caPEM, ca, caKey := tu.SelfSigned(t, "agent-vm test host CA", true)
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "10.0.2.2"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("10.0.2.2")}, DNSNames: []string{tlsTestName}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "trusted") }))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: leafKey}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	_, port, _ = net.SplitHostPort(srv.Listener.Addr().String())
	return caPEM, port
}

// heldCheck: the VM's holder serves a 0600 socket; killed, commands still
// work (dialing the guest directly); start brings it back.
func heldCheck(t *testing.T, m *vm.Manager, e state.Entry, info vminfo.Info) {
	t.Helper()
	if info.SSH.Held == "" {
		t.Fatalf("after start no holder serves the VM; its log %s:\n%s", e.Layout.Log(hold.LogName), driver.TailFile(e.Layout.Log(hold.LogName), 10))
	}
	if fi, err := os.Lstat(info.SSH.Held); err != nil || fi.Mode() != os.ModeSocket|0o600 {
		t.Errorf("the holder's socket %s: %v %v, want a socket, mode 0600", info.SSH.Held, fi, err)
	}
	if code, out, _ := run(t, m, "life", "echo", "held"); code != 0 || out != "held\n" {
		t.Errorf("exec through the holder: %d %q", code, out)
	}
	b, _ := os.ReadFile(e.Layout.Run(hold.PidName))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 0 || syscall.Kill(pid, syscall.SIGKILL) != nil {
		t.Fatalf("no holder pid in %s: %q", e.Layout.Run(hold.PidName), b)
	}
	tu.WaitFor(t, "the killed holder to be gone", func() bool { return m.Status(context.Background(), e, false).SSH.Held == "" })
	if code, out, _ := run(t, m, "life", "echo", "direct"); code != 0 || out != "direct\n" {
		t.Errorf("exec without the holder (its socket left stale): %d %q", code, out)
	}
	ctx := tu.Context(t, "start of the running VM")
	res, err := m.Start(ctx, "life", vm.StartOptions{})
	if err != nil || !res.AlreadyRunning || res.Info.SSH.Held == "" {
		t.Errorf("start on the running VM: %v, already running %v, holder %q", err, res != nil && res.AlreadyRunning, res.Info.SSH.Held)
	}
	if code, out, _ := run(t, m, "life", "echo", "held again"); code != 0 || out != "held again\n" {
		t.Errorf("exec through the new holder: %d %q", code, out)
	}
}
