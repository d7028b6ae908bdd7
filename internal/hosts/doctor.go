package hosts

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostlink"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
	"github.com/agent-vm/agent-vm/internal/virtpool"
)

// Check is one line of a host's doctor: ok or not, what was found, and
// what to do when it is not ok.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
	Hint   string `json:"hint,omitempty"`
}

// Report is what the doctor found on a host. The facts are there when
// their check could be made.
type Report struct {
	Host string `json:"host"`
	URI  string `json:"uri"`
	// OK: every check is ok.
	OK bool `json:"ok"`
	// Reachable: libvirt answered over the URI.
	Reachable bool    `json:"reachable"`
	Checks    []Check `json:"checks"`
	// Accel is "kvm", "tcg" (QEMU without KVM: slow) or "" (not known).
	Accel string `json:"accel,omitempty"`
	Node  *Node  `json:"node,omitempty"`
	Pool  *Pool  `json:"pool,omitempty"`
	// Networks are libvirt's networks there, by name.
	Networks []Network `json:"networks,omitempty"`
	// Virtiofsd is where virtiofsd is on the host ("": not found or not
	// checked).
	Virtiofsd string `json:"virtiofsd,omitempty"`

	hint string // unreachable: how to make it reachable
}

// Node is the host's size, from `virsh nodeinfo` and `virsh nodememstats`.
type Node struct {
	CPUs      int    `json:"cpus"`
	MemoryKiB uint64 `json:"memory_kib"`
	// AvailableKiB is free memory and what the kernel would give back
	// (buffers and page cache); 0 when nodememstats did not answer.
	AvailableKiB uint64 `json:"available_kib,omitempty"`
}

// Pool is agent-vm's storage pool on the host, where VMs placed there get
// their disks (virtpool.NameFor the host's agent-vm directory).
type Pool struct {
	Name   string `json:"name"`
	Dir    string `json:"dir"` // where agent-vm keeps it
	Exists bool   `json:"exists"`
	Active bool   `json:"active"`
	// Available is what `virsh pool-info` says is free ("": not known).
	Available string `json:"available,omitempty"`
	// Others are the host's other pools.
	Others []string `json:"others,omitempty"`
}

// Network is one of libvirt's networks on the host.
type Network struct {
	Name   string `json:"name"`
	Active bool   `json:"active"`
}

// DefaultTimeout bounds each program the doctor runs.
const DefaultTimeout = 30 * time.Second

// Doctor checks hosts with virsh (and, for qemu+ssh, ssh) through Run.
type Doctor struct {
	Run execx.Runner
	// OnHost: Run runs programs on the host itself (hostlink.Runner over
	// agent-vm's link), so virsh there reaches its system daemon
	// (qemu:///system) and virtiofsd is looked for there directly; the
	// user's ssh is not used.
	OnHost bool
	// Timeout bounds each call (0: DefaultTimeout): an ssh that cannot
	// connect, or a daemon that does not answer, ends the call there.
	Timeout time.Duration
}

// Check runs the checks on h: virsh here, libvirt reachable, KVM, the
// host's CPUs and memory, agent-vm's storage pool, what its networks need
// (dnsmasq, nft) and virtiofsd. When libvirt cannot be reached the checks
// that need it are not made. A qemu+ssh host's last line is agent-vm's
// own link (linkCheck), made whatever virsh found.
func (d *Doctor) Check(ctx context.Context, h Host) Report {
	r := d.check(ctx, h)
	if u, err := ParseURI(h.URI); err == nil && u.Remote() {
		r.add(linkCheck(ctx, h))
		r = r.done()
	}
	return r
}

// check is Check's virsh checks.
func (d *Doctor) check(ctx context.Context, h Host) Report {
	r := Report{Host: h.Name, URI: h.URI}
	u, err := ParseURI(h.URI)
	if err != nil {
		r.add(Check{Name: "URI", Detail: err.Error()})
		return r.done()
	}
	where := "this machine"
	if d.OnHost {
		// virsh runs on the host, against its own system daemon.
		where, u = "the host", URI{Raw: "qemu:///system", Daemon: "system", Host: u.Host}
	}
	if _, err := d.Run.LookPath("virsh"); err != nil {
		p, _ := hostpkgs.Lookup("virsh")
		r.add(Check{Name: "virsh", Detail: "virsh is not installed on " + where + "; the checks run it",
			Hint: "install it on " + where + ": " + p.PackageHint() + " (Fedora: libvirt-client)"})
		return r.done()
	}
	if !d.reach(ctx, u, &r) {
		return r.done()
	}
	d.accel(ctx, u, &r)
	d.node(ctx, u, &r)
	d.pool(ctx, u, h, &r)
	d.networks(ctx, u, &r)
	d.virtiofsd(ctx, u, &r)
	return r.done()
}

func (r *Report) add(c Check) { r.Checks = append(r.Checks, c) }

func (r Report) done() Report {
	r.OK = len(r.Checks) > 0
	for _, c := range r.Checks {
		r.OK = r.OK && c.OK
	}
	return r
}

// Err is nil when every check is ok; else it names the host and what to
// do: how to reach it, or how many checks failed.
func (r Report) Err() error {
	if r.OK {
		return nil
	}
	if !r.Reachable {
		hint := r.hint
		if hint == "" {
			hint = "see the hints above"
		}
		return fmt.Errorf("host %s (%s): libvirt is not reachable (hint: %s)", r.Host, r.URI, hint)
	}
	n := 0
	for _, c := range r.Checks {
		if !c.OK {
			n++
		}
	}
	return fmt.Errorf("host %s (%s): %d of %d checks failed (hint: see the hints above, then `agent-vm host doctor %s` again)", r.Host, r.URI, n, len(r.Checks), r.Host)
}

// virsh runs `virsh -c URI args...` with the call's timeout.
func (d *Doctor) virsh(ctx context.Context, u URI, args ...string) (string, error) {
	return d.run(ctx, "virsh", append([]string{"-c", u.ForChecks()}, args...)...)
}

func (d *Doctor) run(ctx context.Context, prog string, args ...string) (string, error) {
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// virsh's tables are read by their English keys.
	res, err := d.Run.Run(cctx, execx.Cmd{Path: prog, Args: args, Env: []string{"LC_ALL=C"}})
	if err != nil && cctx.Err() != nil && ctx.Err() == nil {
		return "", fmt.Errorf("%s %s: no answer in %s", prog, args[len(args)-1], timeout)
	}
	return string(res.Stdout), err
}

// virshCmd is a virsh command line with the host's URI for a hint.
func virshCmd(u URI, args ...string) string {
	return "`" + execx.Cmd{Path: "virsh", Args: append([]string{"-c", u.Raw}, args...)}.String() + "`"
}

// reach asks libvirt for its version: the one check the others need.
func (d *Doctor) reach(ctx context.Context, u URI, r *Report) bool {
	c := Check{Name: "libvirt"}
	out, err := d.virsh(ctx, u, "version")
	if err != nil {
		c.Detail = "not reachable: " + oneLine(err)
		c.Hint = reachHint(u)
		r.hint = c.Hint
		r.add(c)
		return false
	}
	r.Reachable = true
	c.OK, c.Detail = true, libvirtVersion(out)
	r.add(c)
	return true
}

// reachHint says what makes libvirt reachable over u.
func reachHint(u URI) string {
	switch {
	case u.Remote():
		login := "ssh"
		if u.Port != 0 {
			login += " -p " + strconv.Itoa(u.Port)
		}
		if u.Keyfile != "" {
			login += " -i " + execx.ShellQuote(u.Keyfile)
		}
		login += " " + execx.ShellQuote(u.SSHTarget()) + " true"
		return fmt.Sprintf("`%s` must log in without a prompt (a key in ssh-agent or keyfile=, the host's key already in ~/.ssh/known_hosts: agent-vm never answers a prompt); there, libvirtd must run (`sudo systemctl start libvirtd`) and %s must be in the libvirt group", login, userOrYou(u))
	case u.Daemon == "session":
		return "virsh starts the session daemon itself: install libvirt's daemon here (Debian package libvirt-daemon)"
	}
	return "start libvirtd here: `sudo systemctl start libvirtd` (without systemd: `sudo libvirtd -d` and `sudo virtlogd -d`); as a user, join the libvirt group"
}

func userOrYou(u URI) string {
	if u.User != "" {
		return u.User
	}
	return "your user"
}

// accel asks whether libvirt can run KVM guests there, else whether it
// can run QEMU at all (TCG).
func (d *Doctor) accel(ctx context.Context, u URI, r *Report) {
	c := Check{Name: "KVM"}
	_, kvmErr := d.virsh(ctx, u, "domcapabilities", "--virttype", "kvm")
	if kvmErr == nil {
		// What libvirt offers, from /dev/kvm and QEMU's answers: a KVM
		// that is there but does not run a guest (broken nested
		// virtualization) is offered too, and only a boot tells.
		r.Accel, c.OK, c.Detail = "kvm", true, "libvirt offers KVM (its domain capabilities; no guest was booted to prove it)"
		if !u.Remote() && !d.OnHost {
			c.Hint = "`agent-vm doctor` probes KVM on this machine with a real boot"
		}
		r.add(c)
		return
	}
	if _, err := d.virsh(ctx, u, "domcapabilities", "--virttype", "qemu"); err != nil {
		c.Detail = "libvirt has no QEMU to run: " + oneLine(err)
		c.Hint = "install QEMU on the host (Debian package qemu-system-x86 or qemu-system-arm, with libvirt-daemon-system)"
		r.add(c)
		return
	}
	r.Accel = "tcg"
	c.Detail = "TCG only (software emulation, several times slower): " + oneLine(kvmErr)
	// The module of the host's CPU, read where libvirt runs; both when
	// it cannot be read there.
	cpuinfo, _, err := d.onHost(ctx, u, readCPUVendor)
	if err != nil {
		cpuinfo = ""
	}
	c.Hint = "the host needs /dev/kvm: virtualization enabled in its firmware and the " + accel.KVMModuleName(cpuinfo) + " module loaded (a cloud VM needs nested virtualization)"
	r.add(c)
}

// readCPUVendor is the host's script that prints its CPU's vendor line
// from /proc/cpuinfo (none on a CPU without one).
const readCPUVendor = `grep -m1 '^vendor_id' /proc/cpuinfo || true`

// node reads the host's CPUs and memory.
func (d *Doctor) node(ctx context.Context, u URI, r *Report) {
	c := Check{Name: "CPUs and memory"}
	out, err := d.virsh(ctx, u, "nodeinfo")
	if err != nil {
		c.Detail = oneLine(err)
		r.add(c)
		return
	}
	n, err := ParseNodeInfo(out)
	if err != nil {
		c.Detail = err.Error()
		r.add(c)
		return
	}
	c.OK = true
	// Memory and what is available come from one source, nodememstats,
	// when it answers: nodeinfo's memory size need not be its total (on
	// agent-vm's CI machine it said 20 GiB where /proc/meminfo and
	// nodememstats said 23.5).
	if out, err := d.virsh(ctx, u, "nodememstats"); err == nil {
		if total, avail, ok := ParseMemStats(out); ok {
			n.MemoryKiB, n.AvailableKiB = total, avail
		}
	}
	c.Detail = fmt.Sprintf("%d CPUs, %s memory", n.CPUs, kib(n.MemoryKiB))
	if n.AvailableKiB > 0 {
		c.Detail += fmt.Sprintf(", %s available", kib(n.AvailableKiB))
	}
	r.Node = &n
	r.add(c)
}

// pool checks agent-vm's storage pool on the host (virtpool: named for
// the host's agent-vm directory, in DIR/pool). None yet is well: the
// first VM placed there makes it, and starts it when it is not running.
// A pool of that name elsewhere would fail that VM's start, so it fails
// here, with the way out.
func (d *Doctor) pool(ctx context.Context, u URI, h Host, r *Report) {
	dir := h.AgentDir()
	p := Pool{Name: virtpool.NameFor(dir, hostlink.DefaultDir), Dir: path.Join(dir, "pool")}
	c := Check{Name: "storage pool"}
	out, err := d.virsh(ctx, u, "pool-list", "--all", "--name")
	if err != nil {
		c.Detail = oneLine(err)
		r.add(c)
		return
	}
	for _, name := range names(out) {
		if name == p.Name {
			p.Exists = true
		} else {
			p.Others = append(p.Others, name)
		}
	}
	r.Pool = &p
	if !p.Exists {
		c.OK, c.Detail = true, "none yet: the first VM placed here makes agent-vm's pool "+p.Name+" in "+p.Dir
		r.add(c)
		return
	}
	out, err = d.virsh(ctx, u, "pool-dumpxml", p.Name)
	if err != nil {
		c.Detail = oneLine(err)
		r.add(c)
		return
	}
	typ, target, foreign, err := virtpool.Foreign(out, p.Dir)
	if err != nil {
		c.Detail = "pool " + p.Name + ": its XML does not read: " + oneLine(err)
		r.add(c)
		return
	}
	if foreign {
		c.Detail = "pool " + p.Name + " is of type " + typ + " at " + target + ", not agent-vm's at " + p.Dir
		c.Hint = "if it is an older one of agent-vm's: " + virshCmd(u, "pool-destroy", p.Name) + " and " + virshCmd(u, "pool-undefine", p.Name) +
			" (its volumes stay in " + target + "); else give agent-vm another directory: `agent-vm host rm " + h.Name + "`, then `agent-vm host add " + h.Name + " URI --dir DIR`"
		r.add(c)
		return
	}
	out, err = d.virsh(ctx, u, "pool-info", p.Name)
	if err != nil {
		c.Detail = oneLine(err)
		r.add(c)
		return
	}
	info := fields(out)
	p.Active = info["state"] == "running"
	p.Available = info["available"]
	c.OK, c.Detail = true, "agent-vm's pool "+p.Name+" in "+p.Dir+": "
	switch {
	case !p.Active:
		c.Detail += cmp.Or(info["state"], "not running") + " (a VM's start starts it)"
	case p.Available != "":
		c.Detail += "active, " + p.Available + " available"
	default:
		c.Detail += "active"
	}
	r.add(c)
}

// networks checks what agent-vm's network for a VM needs where libvirt
// runs: dnsmasq (libvirt's DHCP on the network) and nft (the fence, see
// internal/libvirtnet). Each VM gets an isolated network of agent-vm's, so
// the host's own networks (Report.Networks) are listed, not needed.
func (d *Doctor) networks(ctx context.Context, u URI, r *Report) {
	c := Check{Name: "network"}
	nets, err := d.hostNetworks(ctx, u)
	if err != nil {
		c.Detail = oneLine(err)
		r.add(c)
		return
	}
	r.Networks = nets
	out, where, err := d.onHost(ctx, u, findNetPrograms)
	switch code := execx.ExitCode(err); {
	case err == nil:
		c.OK, c.Detail = true, "dnsmasq and nft on "+where+" (each VM gets an isolated network of agent-vm's)"
	case code == 1:
		missing := strings.Fields(out)
		c.Detail = strings.Join(missing, " and ") + " not found on " + where + " (on PATH, in /usr/sbin, /sbin)"
		c.Hint = "install them on " + where + ": Debian: `apt-get install dnsmasq-base nftables`, Fedora: `dnf install dnsmasq nftables` (`agent-vm setup --backend libvirt` does it on a Debian host of its own)"
	default:
		c.Detail, c.Hint = "not checked: "+oneLine(err), reachHint(u)
	}
	r.add(c)
}

// hostNetworks are libvirt's networks on the host and which are active.
func (d *Doctor) hostNetworks(ctx context.Context, u URI) ([]Network, error) {
	all, err := d.virsh(ctx, u, "net-list", "--all", "--name")
	if err != nil {
		return nil, err
	}
	active, err := d.virsh(ctx, u, "net-list", "--name")
	if err != nil {
		return nil, err
	}
	on := map[string]bool{}
	for _, n := range names(active) {
		on[n] = true
	}
	var nets []Network
	for _, n := range names(all) {
		nets = append(nets, Network{Name: n, Active: on[n]})
	}
	return nets, nil
}

// findNetPrograms is the host's script: it prints the programs of
// networks' that are missing and exits 1, or exits 0 when both are there
// (/usr/sbin is not on every login's PATH).
const findNetPrograms = `m=; for p in dnsmasq nft; do [ -x /usr/sbin/$p ] || [ -x /sbin/$p ] || command -v $p >/dev/null || m="$m $p"; done; [ -z "$m" ] || { echo $m; exit 1; }`

// onHost runs script where libvirt runs: on the host over agent-vm's
// link (OnHost), here for a local URI, or over the user's ssh on a
// qemu+ssh host; where names the place for a line. The script's own exit
// status 1 means "not there"; any other failure is the way there failing.
func (d *Doctor) onHost(ctx context.Context, u URI, script string) (out, where string, err error) {
	switch {
	case d.OnHost:
		out, err = d.run(ctx, "sh", "-c", script)
		return out, "the host", err
	case !u.Remote():
		out, err = d.run(ctx, "sh", "-c", script)
		return out, "this machine", err
	}
	if _, err := d.Run.LookPath("ssh"); err != nil {
		return "", u.Host, errors.New("ssh is not installed on this machine")
	}
	out, err = d.run(ctx, "ssh", sshArgs(u, script)...)
	if execx.ExitCode(err) == 255 {
		err = fmt.Errorf("ssh to %s failed: %s", u.SSHTarget(), oneLine(err))
	}
	return out, u.Host, err
}

// virtiofsd looks for virtiofsd where libvirt runs: on this machine as
// internal/virtiofsd finds it, on a qemu+ssh host over ssh, in the
// same places. libvirt starts it for a VM's virtiofs share; without it a
// VM's workspace would be shared over 9p.
func (d *Doctor) virtiofsd(ctx context.Context, u URI, r *Report) {
	c := Check{Name: "virtiofsd"}
	hint := "install virtiofsd on the host (Debian 12: package qemu-system-common; newer Debian, Ubuntu and Fedora: package virtiofsd); without it a VM's workspace is shared over 9p, slower for many small files"
	if !u.Remote() && !d.OnHost {
		b, err := virtiofsd.Find(ctx, d.Run)
		if err != nil {
			c.Detail = err.Error()
			r.add(c)
			return
		}
		r.Virtiofsd, c.OK, c.Detail = b.Path, true, b.Path
		r.add(c)
		return
	}
	out, where, err := d.onHost(ctx, u, findVirtiofsd)
	switch code := execx.ExitCode(err); {
	case err == nil:
		path := strings.TrimSpace(out)
		r.Virtiofsd, c.OK, c.Detail = path, true, path+" on "+where
	case code == 1:
		c.Detail, c.Hint = "not found on "+where+" (on PATH, in "+strings.Join(virtiofsdPlaces, ", ")+")", hint
	default:
		c.Detail, c.Hint = "not checked: "+oneLine(err), reachHint(u)
	}
	r.add(c)
}

// virtiofsdPlaces are where distributions put virtiofsd outside PATH
// (as internal/virtiofsd looks on this machine).
var virtiofsdPlaces = []string{"/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd", "/usr/lib/virtiofsd"}

// findVirtiofsd is the remote shell's script: it prints virtiofsd's path
// and exits 0, or exits 1 when there is none (ssh itself fails with 255).
var findVirtiofsd = "for p in " + strings.Join(virtiofsdPlaces, " ") + `; do if [ -x "$p" ]; then echo "$p"; exit 0; fi; done; command -v virtiofsd || exit 1`

// sshArgs log in as a qemu+ssh URI does, never stopping at a prompt, and
// run script there.
func sshArgs(u URI, script string) []string {
	args := []string{"-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10"}
	if u.Port != 0 {
		args = append(args, "-p", strconv.Itoa(u.Port))
	}
	if u.Keyfile != "" {
		args = append(args, "-i", u.Keyfile)
	}
	if u.User != "" {
		args = append(args, "-l", u.User)
	}
	return append(args, "--", u.Host, script)
}

// oneLine is a failed program's own words (its stderr) on one line, else
// the error.
func oneLine(err error) string {
	var e *execx.Error
	if errors.As(err, &e) && e.Stderr != "" {
		return strings.Join(strings.Fields(e.Stderr), " ")
	}
	return err.Error()
}

// kib is a size in KiB for people: GiB with one decimal.
func kib(n uint64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<20)) }
