package hosts

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/virtpool"
)

// remote is the host the FAKE tests check: a qemu+ssh URI, whose
// virtiofsd is looked for over ssh (through the fake too).
var remote = Host{Name: "big", URI: "qemu+ssh://ann@big.example.com:2222/system?keyfile=/k/id"}

const checksURI = "qemu+ssh://ann@big.example.com:2222/system?keyfile=/k/id&no_tty=1"

// fakeHost is what the FAKE virsh and ssh (execxtest, the exec boundary)
// answer for a host; its zero value is a host where all is well.
type fakeHost struct {
	unreachable string // virsh's stderr when libvirt cannot be reached
	noKVM       bool
	noQEMU      bool
	pools       []string // nil: default and agent-vm
	poolState   string   // "": running
	poolAt      string   // agent-vm's pool's directory ("": /var/lib/agent-vm/pool)
	nets        []string // nil: default
	activeNets  []string // nil: as nets
	virtiofsd   int      // ssh's exit: 0 found, 1 not found, 255 ssh failed
	noNetProgs  string   // what the network programs' script prints missing ("": none)
	hang        bool     // virsh version never answers (until its context ends)
	vendor      string   // its CPU's vendor_id ("": no such line, as on arm64)
}

func (h fakeHost) runner(t *testing.T) *execxtest.Fake {
	if h.pools == nil {
		h.pools = []string{"default", "agent-vm"}
	}
	if h.poolAt == "" {
		h.poolAt = "/var/lib/agent-vm/pool"
	}
	if h.nets == nil {
		h.nets = []string{"default"}
	}
	if h.activeNets == nil {
		h.activeNets = h.nets
	}
	fail := func(msg string) execxtest.Reply { return execxtest.Reply{ExitCode: 1, Stderr: msg} }
	f := execxtest.New(t)
	f.On("virsh", func(c execxtest.Call) execxtest.Reply {
		if len(c.Args) < 3 || c.Args[0] != "-c" || c.Args[1] != checksURI {
			t.Errorf("virsh %q: want -c %s first", c.Args, checksURI)
		}
		if h.unreachable != "" {
			return fail(h.unreachable)
		}
		switch cmd := strings.Join(c.Args[2:], " "); cmd {
		case "version":
			return execxtest.Reply{Stdout: "Compiled against library: libvirt 9.0.0\nUsing library: libvirt 9.0.0\nUsing API: QEMU 9.0.0\nRunning hypervisor: QEMU 7.2.0\n"}
		case "domcapabilities --virttype kvm":
			if h.noKVM || h.noQEMU {
				return fail("error: failed to get emulator capabilities\nerror: invalid argument: KVM is not supported by '/usr/bin/qemu-system-x86_64' on this host")
			}
			return execxtest.Reply{Stdout: "<domainCapabilities/>"}
		case "domcapabilities --virttype qemu":
			if h.noQEMU {
				return fail("error: failed to get emulator capabilities\nerror: unable to find any emulator to serve 'x86_64' architecture")
			}
			return execxtest.Reply{Stdout: "<domainCapabilities/>"}
		case "nodeinfo":
			return execxtest.Reply{Stdout: "CPU model:           x86_64\nCPU(s):              32\nCPU frequency:       2400 MHz\nNUMA cell(s):        1\nMemory size:         104857600 KiB\n\n"}
		case "nodememstats":
			return execxtest.Reply{Stdout: "total  :            131072000 KiB\nfree   :             52428800 KiB\nbuffers:              1048576 KiB\ncached :             10485760 KiB\n"}
		case "pool-list --all --name":
			return execxtest.Reply{Stdout: strings.Join(h.pools, "\n") + "\n\n"}
		case "pool-dumpxml agent-vm":
			return execxtest.Reply{Stdout: "<pool type='dir'>\n  <name>agent-vm</name>\n  <target>\n    <path>" + h.poolAt + "</path>\n  </target>\n</pool>\n"}
		case "pool-info agent-vm":
			state := h.poolState
			if state == "" {
				state = "running"
			}
			return execxtest.Reply{Stdout: "Name:           agent-vm\nState:          " + state + "\nCapacity:       900.00 GiB\nAvailable:      512.50 GiB\n"}
		case "net-list --all --name":
			return execxtest.Reply{Stdout: strings.Join(h.nets, "\n") + "\n\n"}
		case "net-list --name":
			return execxtest.Reply{Stdout: strings.Join(h.activeNets, "\n") + "\n\n"}
		default:
			t.Errorf("unexpected virsh %s", cmd)
			return fail("unexpected")
		}
	})
	f.On("ssh", func(c execxtest.Call) execxtest.Reply {
		want := []string{"-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-p", "2222", "-i", "/k/id", "-l", "ann", "--", "big.example.com"}
		if len(c.Args) != len(want)+1 || !slices.Equal(c.Args[:len(want)], want) {
			t.Errorf("ssh %q\nwant %q SCRIPT", c.Args, want)
			return fail("unexpected")
		}
		switch script := c.Args[len(want)]; {
		case h.virtiofsd == 255:
			return execxtest.Reply{ExitCode: 255, Stderr: "ann@big.example.com: Permission denied (publickey)."}
		case script == findNetPrograms && h.noNetProgs != "":
			return execxtest.Reply{ExitCode: 1, Stdout: h.noNetProgs + "\n"}
		case script == findNetPrograms:
			return execxtest.Reply{}
		case script == readCPUVendor && h.vendor != "":
			return execxtest.Reply{Stdout: "vendor_id\t: " + h.vendor + "\n"}
		case script == readCPUVendor:
			return execxtest.Reply{}
		case script != findVirtiofsd:
			t.Errorf("ssh runs %q", script)
			return fail("unexpected")
		case h.virtiofsd == 0:
			return execxtest.Reply{Stdout: "/usr/libexec/virtiofsd\n"}
		}
		return execxtest.Reply{ExitCode: 1}
	})
	return f
}

// check runs the doctor on remote with h's fake and returns its report
// and its lines by name.
func (h fakeHost) check(t *testing.T) (Report, map[string]Check) {
	t.Helper()
	r := (&Doctor{Run: h.runner(t)}).Check(context.Background(), remote)
	byName := map[string]Check{}
	for _, c := range r.Checks {
		byName[c.Name] = c
	}
	return r, byName
}

func TestDoctorAllWell(t *testing.T) {
	r, checks := fakeHost{}.check(t)
	// Six of virsh's, and the last, agent-vm's link, not set up (fine
	// until VMs are placed there).
	if !r.OK || !r.Reachable || r.Err() != nil || len(r.Checks) != 7 || !strings.Contains(checks["agent-vm's link"].Hint, "agent-vm host link big") {
		t.Fatalf("report: %+v (err %v)", r, r.Err())
	}
	for name, want := range map[string]string{
		"libvirt":         "libvirt 9.0.0, hypervisor QEMU 7.2.0",
		"KVM":             "libvirt offers KVM (its domain capabilities; no guest was booted to prove it)",
		"CPUs and memory": "32 CPUs, 125.0 GiB memory, 61.0 GiB available",
		"storage pool":    "agent-vm's pool agent-vm in /var/lib/agent-vm/pool: active, 512.50 GiB available",
		"network":         "dnsmasq and nft on big.example.com (each VM gets an isolated network of agent-vm's)",
		"virtiofsd":       "/usr/libexec/virtiofsd on big.example.com",
	} {
		if c := checks[name]; !c.OK || c.Detail != want {
			t.Errorf("%s: %+v, want ok %q", name, c, want)
		}
	}
	if r.Accel != "kvm" || r.Node == nil || r.Node.CPUs != 32 || r.Node.MemoryKiB != 131072000 || r.Node.AvailableKiB != 52428800+1048576+10485760 ||
		r.Pool == nil || !r.Pool.Exists || !r.Pool.Active || r.Virtiofsd != "/usr/libexec/virtiofsd" || len(r.Networks) != 1 || !r.Networks[0].Active {
		t.Errorf("facts: accel %s node %+v pool %+v virtiofsd %q networks %+v", r.Accel, r.Node, r.Pool, r.Virtiofsd, r.Networks)
	}
}

// An unreachable host: one line of virsh's, the others not made (and the
// link's, not set up); the error names the host and says how to log in
// without a prompt.
func TestDoctorUnreachableHost(t *testing.T) {
	r, checks := fakeHost{unreachable: "error: failed to connect to the hypervisor\nerror: Cannot recv data: Host key verification failed.: Connection reset by peer"}.check(t)
	if r.OK || r.Reachable || len(r.Checks) != 2 {
		t.Fatalf("report: %+v", r)
	}
	if c := checks["libvirt"]; c.OK || !strings.Contains(c.Detail, "Host key verification failed") {
		t.Errorf("libvirt line: %+v", c)
	}
	err := r.Err()
	for _, want := range []string{"host big", remote.URI, "not reachable", "ssh -p 2222 -i /k/id ann@big.example.com true", "known_hosts", "libvirtd"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v; want it to say %q", err, want)
		}
	}
}

// A host that does not answer ends at the timeout, not later.
func TestDoctorTimesOut(t *testing.T) {
	f := execxtest.New(t).On("virsh", func(c execxtest.Call) execxtest.Reply {
		return execxtest.Reply{ExitCode: -1, Err: context.DeadlineExceeded}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := &Doctor{Run: blockingRunner{f}, Timeout: 50 * time.Millisecond}
	start := time.Now()
	r := d.Check(ctx, remote)
	if r.Reachable || r.Checks[0].OK || !strings.Contains(r.Checks[0].Detail, "no answer in 50ms") {
		t.Errorf("report: %+v", r)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("the doctor took %s", time.Since(start))
	}
}

// blockingRunner waits for the call's context to end before the fake
// answers, as a virsh whose ssh never connects would.
type blockingRunner struct{ *execxtest.Fake }

func (b blockingRunner) Run(ctx context.Context, c execx.Cmd) (execx.Result, error) {
	<-ctx.Done()
	return b.Fake.Run(ctx, c)
}

// No pool of agent-vm's yet is well: the first VM placed there makes it
// (libvirt's default pool is not agent-vm's).
func TestDoctorNoPoolYet(t *testing.T) {
	r, checks := fakeHost{pools: []string{"images"}}.check(t)
	c := checks["storage pool"]
	if !r.OK || !c.OK || c.Detail != "none yet: the first VM placed here makes agent-vm's pool agent-vm in /var/lib/agent-vm/pool" {
		t.Errorf("pool line: %+v (report ok %v)", c, r.OK)
	}
	if r.Pool == nil || r.Pool.Exists || r.Pool.Name != "agent-vm" || !slices.Equal(r.Pool.Others, []string{"images"}) {
		t.Errorf("pool: %+v", r.Pool)
	}
}

// An inactive pool is started by a VM's start.
func TestDoctorInactivePool(t *testing.T) {
	r, checks := fakeHost{poolState: "inactive"}.check(t)
	c := checks["storage pool"]
	if !r.OK || !c.OK || c.Detail != "agent-vm's pool agent-vm in /var/lib/agent-vm/pool: inactive (a VM's start starts it)" {
		t.Errorf("pool line: %+v", c)
	}
	if r.Pool == nil || !r.Pool.Exists || r.Pool.Active {
		t.Errorf("pool: %+v", r.Pool)
	}
}

// A pool of agent-vm's name in another directory would fail the first
// VM's start: the line fails, naming both directories and the ways out.
func TestDoctorPoolElsewhere(t *testing.T) {
	r, checks := fakeHost{poolAt: "/srv/images"}.check(t)
	c := checks["storage pool"]
	if r.OK || c.OK || c.Detail != "pool agent-vm is of type dir at /srv/images, not agent-vm's at /var/lib/agent-vm/pool" ||
		!strings.Contains(c.Hint, "pool-destroy agent-vm") || !strings.Contains(c.Hint, "pool-undefine agent-vm") || !strings.Contains(c.Hint, "--dir DIR") {
		t.Errorf("pool line: %+v", c)
	}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "1 of 7 checks failed") {
		t.Errorf("error: %v", err)
	}
}

// A host with an agent-vm directory of its own has a pool of its own.
func TestDoctorPoolOfTheHostsDir(t *testing.T) {
	h := remote
	h.Dir = "/srv/agent-vm"
	name := virtpool.NameFor(h.Dir, hostlink.DefaultDir)
	if name == virtpool.DefaultName || !strings.HasPrefix(name, virtpool.DefaultName+"-") {
		t.Fatalf("pool name %q for %s", name, h.Dir)
	}
	r := (&Doctor{Run: fakeHost{pools: []string{"agent-vm"}}.runner(t)}).Check(context.Background(), h)
	if r.Pool == nil || r.Pool.Name != name || r.Pool.Dir != "/srv/agent-vm/pool" || r.Pool.Exists {
		t.Errorf("pool of a host with --dir %s: %+v, want %s in /srv/agent-vm/pool, not there yet", h.Dir, r.Pool, name)
	}
}

func TestDoctorNoKVM(t *testing.T) {
	r, checks := fakeHost{noKVM: true}.check(t)
	c := checks["KVM"]
	if r.OK || c.OK || r.Accel != "tcg" || !strings.HasPrefix(c.Detail, "TCG only") || !strings.Contains(c.Detail, "KVM is not supported") || !strings.Contains(c.Hint, "/dev/kvm") {
		t.Errorf("KVM line: %+v (accel %q)", c, r.Accel)
	}
	r, checks = fakeHost{noQEMU: true}.check(t)
	if c := checks["KVM"]; c.OK || r.Accel != "" || !strings.Contains(c.Detail, "no QEMU") || !strings.Contains(c.Hint, "qemu-system") {
		t.Errorf("without QEMU: %+v (accel %q)", c, r.Accel)
	}
}

// The hint without KVM names the module of the host's CPU, read there;
// both when the CPU names neither vendor or cannot be read.
func TestDoctorNoKVMNamesTheHostsModule(t *testing.T) {
	for _, c := range []struct {
		h    fakeHost
		want string
	}{
		{fakeHost{noKVM: true, vendor: "GenuineIntel"}, "and the kvm_intel module loaded"},
		{fakeHost{noKVM: true, vendor: "AuthenticAMD"}, "and the kvm_amd module loaded"},
		{fakeHost{noKVM: true}, "and the kvm_intel or kvm_amd module loaded"},
		{fakeHost{noKVM: true, vendor: "AuthenticAMD", virtiofsd: 255}, "and the kvm_intel or kvm_amd module loaded"}, // ssh fails
	} {
		if _, checks := c.h.check(t); !strings.Contains(checks["KVM"].Hint, c.want) {
			t.Errorf("vendor %q (ssh %d): %q, want %q", c.h.vendor, c.h.virtiofsd, checks["KVM"].Hint, c.want)
		}
	}
}

// The host's own networks are listed, not needed (each VM gets one of
// agent-vm's); what that network needs on the host is checked.
func TestDoctorNetworks(t *testing.T) {
	r, checks := fakeHost{nets: []string{"default", "lab"}, activeNets: []string{}}.check(t)
	if c := checks["network"]; !c.OK || !r.OK || len(r.Networks) != 2 || r.Networks[0].Active {
		t.Errorf("no active network of the host's: %+v, networks %+v", c, r.Networks)
	}
	r, checks = fakeHost{noNetProgs: "dnsmasq nft"}.check(t)
	if c := checks["network"]; c.OK || r.OK || c.Detail != "dnsmasq and nft not found on big.example.com (on PATH, in /usr/sbin, /sbin)" || !strings.Contains(c.Hint, "apt-get install dnsmasq-base nftables") {
		t.Errorf("without dnsmasq and nft: %+v", c)
	}
	_, checks = fakeHost{virtiofsd: 255}.check(t)
	if c := checks["network"]; c.OK || !strings.Contains(c.Detail, "not checked: ssh to ann@big.example.com failed") || !strings.Contains(c.Hint, "ssh -p 2222") {
		t.Errorf("ssh failed: %+v", c)
	}
}

func TestDoctorVirtiofsdOverSSH(t *testing.T) {
	_, checks := fakeHost{virtiofsd: 1}.check(t)
	if c := checks["virtiofsd"]; c.OK || !strings.Contains(c.Detail, "not found on big.example.com") || !strings.Contains(c.Hint, "9p") {
		t.Errorf("not found: %+v", c)
	}
	_, checks = fakeHost{virtiofsd: 255}.check(t)
	if c := checks["virtiofsd"]; c.OK || !strings.Contains(c.Detail, "ssh to ann@big.example.com failed: ann@big.example.com: Permission denied") || !strings.Contains(c.Hint, "ssh -p 2222") {
		t.Errorf("ssh failed: %+v", c)
	}
}

// Without virsh on this machine the doctor says which package has it and
// runs nothing.
func TestDoctorWithoutVirsh(t *testing.T) {
	f := execxtest.New(t).Installed("virsh", "")
	r := (&Doctor{Run: f}).Check(context.Background(), remote)
	if r.OK || len(r.Checks) != 2 || r.Checks[0].Name != "virsh" || !strings.Contains(r.Checks[0].Hint, "libvirt-clients") {
		t.Errorf("report: %+v", r)
	}
	if len(f.Calls()) != 0 {
		t.Errorf("ran %v", f.Calls())
	}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "host big") {
		t.Errorf("error: %v", err)
	}
}

func TestParseNodeInfoRefuses(t *testing.T) {
	for _, out := range []string{"", "CPU(s): 0\nMemory size: 10 KiB", "CPU(s): 4\nMemory size: 10 MiB", "error: x"} {
		if n, err := ParseNodeInfo(out); err == nil {
			t.Errorf("ParseNodeInfo(%q) = %+v", out, n)
		}
	}
	if _, _, ok := ParseMemStats("total: 5 KiB\n"); ok {
		t.Error("ParseMemStats without free accepted")
	}
	// free, buffers and cached can add up to more than the total when
	// they are counted at different moments: available stays within it.
	if total, avail, ok := ParseMemStats("total: 100 KiB\nfree: 90 KiB\nbuffers: 5 KiB\ncached: 20 KiB\n"); !ok || total != 100 || avail != 100 {
		t.Errorf("ParseMemStats: %d, %d, %v; want 100, 100", total, avail, ok)
	}
}
