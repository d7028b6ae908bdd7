package vagrant

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/qemuuser"
	"github.com/agent-vm/agent-vm/internal/vagrantbox"
)

// DomState is libvirt's own word on a domain, from `virsh domstate
// --reason`: vagrant says "shutoff" alike for a halted, a killed and a
// managed-saved machine, libvirt tells them apart (see internal/vagrantbox's
// findings).
type DomState struct {
	State  string // "running", "paused", "shut off", ...
	Reason string // "crashed", "saved", "shutdown", "destroyed", ...
}

// ParseDomState reads `virsh domstate --reason` output: "shut off (crashed)".
func ParseDomState(out string) DomState {
	s := strings.TrimSpace(out)
	state, reason, ok := strings.Cut(s, " (")
	if !ok {
		return DomState{State: s}
	}
	return DomState{State: state, Reason: strings.TrimSuffix(reason, ")")}
}

// domState asks libvirt for m's domain state with its reason.
func (d *Driver) domState(ctx context.Context, m driver.Machine) (DomState, error) {
	res, err := d.Run.Run(ctx, execx.Cmd{Path: "virsh", Args: []string{"-c", d.uri(), "domstate", "--reason", domain(m)}})
	if err != nil {
		return DomState{}, fmt.Errorf("asking libvirt for the state of domain %s: %w", domain(m), err)
	}
	return ParseDomState(string(res.Stdout)), nil
}

// PidDir is where libvirt's system daemon keeps a running domain's QEMU
// pid, in <domain>.pid (readable by root only).
const PidDir = "/run/libvirt/qemu"

// qemuPid is the machine's QEMU process, from libvirt's pid file; 0 when
// it cannot be read (not root, another URI, no domain running). A pid is
// taken only while the process runs QEMU (not one reused since).
func (d *Driver) qemuPid(m driver.Machine) int {
	if d.uri() != DefaultURI {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(d.pidDir(), MachineName(m)+".pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmd), "qemu") {
		return 0
	}
	return pid
}

func (d *Driver) pidDir() string {
	if d.PidDir == "" {
		return PidDir
	}
	return d.PidDir
}

func (d *Driver) qemuUser() string {
	if d.QEMUUser == "" {
		return qemuuser.DefaultUser
	}
	return d.QEMUUser
}

// FwCfgDir is the directory, in the run directory (or the machine's
// handoff directory), of the copies of the credential files QEMU reads
// through fw_cfg.
const FwCfgDir = "fw_cfg"

// SeedFile is the copy of the seed ISO in the machine's handoff directory.
const SeedFile = "seed.iso"

// prepareAccess makes what QEMU opens reachable by the user libvirt runs it
// as (see internal/vagrantbox's findings): libvirt hands the files its
// domain XML names (disks, the seed) to that user, never their
// directories, and nothing passed through qemuargs. Each credential is
// copied into FwCfgDir readable by QEMU's user alone (0600 and owned by it
// when agent-vm runs as root, else a POSIX ACL entry for it; package
// qemuuser).
//
// With a handoff directory (Driver.Handoff) the copies, and a copy of the
// seed, go to the machine's directory there (0711, made here), and the
// VM's own directories stay as they are. Without one, the VM's directory
// and those below it that QEMU passes through, and the state directory
// above it, become searchable by others (not readable: nobody lists them).
// Either way every path is checked, so that a directory above, which
// agent-vm does not own (a 0700 home), fails here with a hint rather than
// as libvirt's "Permission denied". It returns m with its credentials
// replaced by the copies, and b with the seed QEMU opens. Without that
// user (another distribution, a session libvirt) it changes nothing.
func (d *Driver) prepareAccess(m driver.Machine, b Boot) (driver.Machine, Boot, error) {
	uid, ok := qemuuser.Lookup(d.qemuUser())
	if !ok {
		d.Log.Debug("no user for libvirt's QEMU: leaving file access as it is", "user", d.qemuUser())
		return m, b, nil
	}
	dir := d.qemuFile(m, m.RunDir, FwCfgDir)
	hint := fmt.Sprintf("the VM's directory is %s: set AGENT_VM_STATE_DIR to a directory outside home directories, e.g. /var/lib/agent-vms, for vagrant VMs", filepath.Dir(m.RunDir))
	if d.Handoff != nil {
		hint = fmt.Sprintf("the files libvirt's QEMU opens are put in %s: set AGENT_VM_LIBVIRT_DIR to a directory outside home directories", d.Handoff.Path)
		// Each level searchable by others, not readable, whatever it was.
		if err := d.handoffDir(m).Sub(FwCfgDir, handoffMode).Make(); err != nil {
			return m, b, fmt.Errorf("making the directories libvirt's QEMU opens files in: %w (%s)", err, hint)
		}
		seed := d.qemuFile(m, "", SeedFile)
		if err := qemuuser.CopyFor(b.Seed, seed, uid); err != nil {
			return m, b, fmt.Errorf("handing the seed to libvirt's QEMU (user %s): %w", d.qemuUser(), err)
		}
		b.Seed = seed
	} else {
		vmDir := filepath.Dir(m.RunDir)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return m, b, err
		}
		// The state directory (agent-vm's, 0700) holds every VM's directory.
		for _, p := range []string{filepath.Dir(vmDir), vmDir, m.RunDir, dir, filepath.Dir(b.Seed)} {
			if err := qemuuser.Searchable(p); err != nil {
				return m, b, err
			}
		}
	}
	creds := make([]driver.Credential, 0, len(m.Credentials))
	for _, c := range m.Credentials {
		cp := filepath.Join(dir, c.Name)
		if err := qemuuser.CopyFor(c.File, cp, uid); err != nil {
			return m, b, fmt.Errorf("handing credential %s to libvirt's QEMU (user %s): %w", c.Name, d.qemuUser(), err)
		}
		creds = append(creds, driver.Credential{Name: c.Name, File: cp})
	}
	m.Credentials = creds
	for _, p := range append([]string{b.Seed}, credentialFiles(creds)...) {
		if err := vagrantbox.CheckQEMUCanRead(p); err != nil {
			return m, b, fmt.Errorf("%w (%s)", err, hint)
		}
	}
	return m, b, nil
}

func credentialFiles(cs []driver.Credential) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.File)
	}
	return out
}
