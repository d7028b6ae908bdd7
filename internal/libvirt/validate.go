package libvirt

import (
	"fmt"
	"path"
	"regexp"
	"strings"
	"unicode/utf8"
)

var (
	// nameRE is a libvirt domain's or network's name as agent-vm makes
	// them. libvirt puts a domain's name into file names
	// (/etc/libvirt/qemu/NAME.xml) and virsh reads a leading "-" as an
	// option, hence the first character.
	nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$`)
	uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)
	// macRE is a MAC in QEMU's locally administered range, written as
	// libvirt writes it back (lowercase), so that the seed's network-config
	// and the domain name the same NIC in the same spelling.
	macRE     = regexp.MustCompile(`^52:54:00(:[0-9a-f]{2}){3}$`)
	machineRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)
)

const (
	minMemoryMiB = 128
	// maxDisks is vda to vdz.
	maxDisks = 26
	// maxTagLen is virtio-fs's limit on a tag (its config space has 36
	// bytes for it; QEMU refuses a longer one).
	maxTagLen = 36
	// maxFwCfgNameLen is QEMU's limit on an fw_cfg file's name (56 bytes
	// with the terminating NUL).
	maxFwCfgNameLen = 55
)

// validate refuses a Domain libvirt would refuse or misread, naming the
// field and its value.
func (d Domain) validate() error {
	for _, check := range []func() error{d.validateIdentity, d.validateMachine, d.validateBoot, d.validateDevices} {
		if err := check(); err != nil {
			return fmt.Errorf("libvirt domain %q: %w", d.Name, err)
		}
	}
	return nil
}

func (d Domain) validateIdentity() error {
	switch {
	case !nameRE.MatchString(d.Name):
		return fmt.Errorf("Name %q is not a domain name agent-vm makes (hint: 1 to 200 of A-Z a-z 0-9 _ . -, starting with a letter or digit)", d.Name)
	case d.UUID == "":
		return fmt.Errorf("UUID is empty (hint: give the VM's id, state.NewID's uuid)")
	case !uuidRE.MatchString(d.UUID):
		return fmt.Errorf("UUID %q is not a uuid (hint: 8-4-4-4-12 hex digits, as state.NewID makes)", d.UUID)
	}
	return nil
}

func (d Domain) validateMachine() error {
	switch {
	case d.Type != "kvm" && d.Type != "qemu":
		return fmt.Errorf(`Type %q is neither "kvm" nor "qemu" (hint: "kvm" where KVM is usable, else "qemu" for TCG)`, d.Type)
	case d.CPUs < 1:
		return fmt.Errorf("CPUs %d is less than 1 (hint: give the VM's CPU count)", d.CPUs)
	case d.MemoryMiB < minMemoryMiB:
		return fmt.Errorf("MemoryMiB %d is less than %d (hint: the Debian guest needs at least %d MiB)", d.MemoryMiB, minMemoryMiB, minMemoryMiB)
	case !machineRE.MatchString(d.Machine):
		return fmt.Errorf(`Machine %q is not a machine type (hint: "q35" on x86_64)`, d.Machine)
	}
	return nil
}

func (d Domain) validateBoot() error {
	if d.Kernel == "" {
		return fmt.Errorf("Kernel is empty (hint: the guest has no bootloader: give the image's kernel)")
	}
	if err := checkPath("Kernel", d.Kernel); err != nil {
		return err
	}
	if d.Initrd != "" {
		if err := checkPath("Initrd", d.Initrd); err != nil {
			return err
		}
	}
	return checkText("Cmdline", d.Cmdline)
}

func (d Domain) validateDevices() error {
	if len(d.Disks) == 0 {
		return fmt.Errorf("Disks is empty (hint: give the root overlay, then the seed)")
	}
	if len(d.Disks) > maxDisks {
		return fmt.Errorf("Disks has %d disks, more than vda to vdz (hint: at most %d)", len(d.Disks), maxDisks)
	}
	for i, disk := range d.Disks {
		field := fmt.Sprintf("Disks[%d]", i)
		if err := checkPath(field+".Path", disk.Path); err != nil {
			return err
		}
		if disk.Format != "qcow2" && disk.Format != "raw" {
			return fmt.Errorf(`%s.Format %q is neither "qcow2" nor "raw" (hint: an overlay is qcow2, the seed raw)`, field, disk.Format)
		}
	}
	switch {
	case d.Network == "":
		return fmt.Errorf("Network is empty (hint: name the VM's libvirt network, libvirtnet's)")
	case !nameRE.MatchString(d.Network):
		return fmt.Errorf("Network %q is not a network name agent-vm makes (hint: 1 to 200 of A-Z a-z 0-9 _ . -, starting with a letter or digit)", d.Network)
	case d.MAC == "":
		return fmt.Errorf("MAC is empty (hint: give the MAC the seed's network-config matches)")
	case !macRE.MatchString(d.MAC):
		return fmt.Errorf("MAC %q is not like 52:54:00:xx:xx:xx (hint: QEMU's range, lowercase hex, as the seed's network-config has it)", d.MAC)
	}
	if err := d.validateShare(); err != nil {
		return err
	}
	if err := d.validateFwCfg(); err != nil {
		return err
	}
	if d.Console == "" {
		return fmt.Errorf("Console is empty (hint: give the console log's path: the guest's only serial port writes there)")
	}
	return checkPath("Console", d.Console)
}

func (d Domain) validateShare() error {
	if d.Share == nil {
		return nil
	}
	if d.Share.Socket == "" {
		return fmt.Errorf("Share.Socket is empty (hint: give the socket of the workspace's virtiofsd, or no Share)")
	}
	if err := checkPath("Share.Socket", d.Share.Socket); err != nil {
		return err
	}
	switch {
	case d.Share.Tag == "":
		return fmt.Errorf("Share.Tag is empty (hint: give the tag the guest mounts the workspace by)")
	case len(d.Share.Tag) > maxTagLen:
		return fmt.Errorf("Share.Tag %q is longer than virtio-fs's %d bytes (hint: a shorter tag)", d.Share.Tag, maxTagLen)
	}
	return checkText("Share.Tag", d.Share.Tag)
}

// validateFwCfg checks the fw_cfg entries. QEMU warns about a name outside
// opt/ (the firmware's own names live there) and libvirt refuses it.
func (d Domain) validateFwCfg() error {
	seen := map[string]bool{}
	for i, f := range d.FwCfg {
		field := fmt.Sprintf("FwCfg[%d]", i)
		switch {
		case !strings.HasPrefix(f.Name, "opt/") || len(f.Name) == len("opt/"):
			return fmt.Errorf("%s.Name %q is not under opt/ (hint: e.g. opt/io.systemd.credentials/NAME for a systemd credential)", field, f.Name)
		case len(f.Name) > maxFwCfgNameLen:
			return fmt.Errorf("%s.Name %q is longer than QEMU's %d bytes (hint: a shorter name)", field, f.Name, maxFwCfgNameLen)
		case seen[f.Name]:
			return fmt.Errorf("%s.Name %q is given twice (hint: one entry per name)", field, f.Name)
		}
		seen[f.Name] = true
		if err := checkText(field+".Name", f.Name); err != nil {
			return err
		}
		if err := checkPath(field+".File", f.File); err != nil {
			return err
		}
	}
	return nil
}

// checkPath refuses a path libvirt would resolve against its own working
// directory (on its host, not ours) or that the XML cannot carry as is.
// Paths are the libvirt host's, which is Linux: package path, not
// path/filepath.
func checkPath(field, p string) error {
	if err := checkText(field, p); err != nil {
		return err
	}
	if !path.IsAbs(p) {
		return fmt.Errorf("%s %q is not an absolute path (hint: libvirtd resolves paths on its own host: give the whole path)", field, p)
	}
	return nil
}

// checkText refuses what encoding/xml would not carry unchanged (invalid
// UTF-8 and the control characters XML 1.0 cannot hold, which it replaces
// with U+FFFD) and the three it can (tab, newline, carriage return): no
// path or command line of agent-vm's has one, and a newline in a path is a
// mistake, or an attack on whatever reads it line by line.
func checkText(field, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%s %q is not valid UTF-8 (hint: rename it)", field, s)
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }); i >= 0 {
		return fmt.Errorf("%s %q contains a control character at byte %d (hint: no newline, NUL or other control character)", field, s, i)
	}
	return nil
}
