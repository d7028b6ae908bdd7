package vagrant

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
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

// DefaultQEMUUser is the user libvirt runs QEMU as under qemu:///system on
// Debian (libvirt's qemu.conf "user").
const DefaultQEMUUser = "libvirt-qemu"

func (d *Driver) qemuUser() string {
	if d.QEMUUser == "" {
		return DefaultQEMUUser
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
// when agent-vm runs as root, else a POSIX ACL entry for it).
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
	u, err := user.Lookup(d.qemuUser())
	if err != nil {
		d.Log.Debug("no user for libvirt's QEMU: leaving file access as it is", "user", d.qemuUser(), "error", err)
		return m, b, nil
	}
	uid, _ := strconv.Atoi(u.Uid)
	dir := d.qemuFile(m, m.RunDir, FwCfgDir)
	hint := fmt.Sprintf("the VM's directory is %s: set AGENT_VM_STATE_DIR to a directory outside home directories, e.g. /var/lib/agent-vms, for vagrant VMs", filepath.Dir(m.RunDir))
	if d.Handoff != nil {
		hint = fmt.Sprintf("the files libvirt's QEMU opens are put in %s: set AGENT_VM_LIBVIRT_DIR to a directory outside home directories", d.Handoff.Path)
		// Each level searchable by others, not readable, whatever it was.
		if err := d.handoffDir(m).Sub(FwCfgDir, handoffMode).Make(); err != nil {
			return m, b, fmt.Errorf("making the directories libvirt's QEMU opens files in: %w (%s)", err, hint)
		}
		seed := d.qemuFile(m, "", SeedFile)
		if err := copyFor(b.Seed, seed, uid); err != nil {
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
			if err := searchable(p); err != nil {
				return m, b, err
			}
		}
	}
	creds := make([]driver.Credential, 0, len(m.Credentials))
	for _, c := range m.Credentials {
		cp := filepath.Join(dir, c.Name)
		if err := copyFor(c.File, cp, uid); err != nil {
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

// searchable adds search permission for others to dir (and nothing else).
func searchable(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o001 != 0 {
		return nil
	}
	if err := os.Chmod(dir, fi.Mode().Perm()|0o001); err != nil {
		return fmt.Errorf("letting libvirt's QEMU through %s: %w", dir, err)
	}
	return nil
}

// copyFor copies the secret src to dst (0600), readable by uid alone
// besides dst's owner: owned by uid when we are root, else through an ACL.
func copyFor(src, dst string, uid int) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	_ = os.Remove(dst)
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(b)
	if err := errors.Join(werr, f.Close()); err != nil {
		return err
	}
	return grant(dst, uid, 4)
}

// grant gives uid perm (4 read, 6 read and write) on path, a 0600 file,
// and no one else besides its owner: path becomes uid's when we are root
// (Lchown), else uid gets an ACL entry.
func grant(path string, uid int, perm uint16) error {
	if os.Geteuid() == 0 {
		return os.Lchown(path, uid, -1)
	}
	if err := unix.Setxattr(path, "system.posix_acl_access", accessACL(uid, perm), 0); err != nil {
		return fmt.Errorf("granting uid %d access to %s with an ACL: %w (hint: the state directory's filesystem must support POSIX ACLs, or run agent-vm as root)", uid, path, err)
	}
	return nil
}

// accessACL is a POSIX access ACL (the kernel's xattr form, version 2):
// owner rw, user uid perm (4 read, 6 read and write), group and others
// nothing, mask perm.
func accessACL(uid int, perm uint16) []byte {
	const undefined = 0xffffffff
	entries := []struct {
		tag, perm uint16
		id        uint32
	}{{0x01, 6, undefined}, {0x02, perm, uint32(uid)}, {0x04, 0, undefined}, {0x10, perm, undefined}, {0x20, 0, undefined}}
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}
