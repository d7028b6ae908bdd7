package template

// A clone's own kernel boot id. Linux makes
// /proc/sys/kernel/random/boot_id once per boot, on its first read, and
// keeps it in kernel memory, read-only from inside the guest: every
// machine restored from one template would have the template's. The
// kernel keeps it as 16 bytes in a static array (sysctl_bootid, in its
// .bss); a template build asks the guest where that array is in physical
// memory (its address in /proc/kallsyms, less its section's start there,
// plus that section's physical start in /proc/iomem, all as root) and
// what it holds, and records both. Each clone's driver then writes a new
// random id there after the restore and before the guest runs
// (driver.MemoryEdit), having checked that the template's id is there.
// Processes that had read the id before the template was saved (systemd,
// journald) keep it cached; the kernel's, which /proc gives every reader
// from then on, is the clone's own.

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/state"
)

// BootIDSite is where a template's kernel keeps its boot id.
type BootIDSite struct {
	Addr uint64 `json:"phys_addr"` // guest physical address of the kernel's 16 bytes
	ID   string `json:"id"`        // the template's boot id, as /proc gives it
}

// BootIDProbe prints what ParseBootIDProbe reads, as root in the guest.
const BootIDProbe = `cat /proc/sys/kernel/random/boot_id; ` +
	`grep -w -e sysctl_bootid -e __bss_start -e _sdata /proc/kallsyms; ` +
	`grep -e ': Kernel data$' -e ': Kernel bss$' /proc/iomem`

// ParseBootIDProbe reads BootIDProbe's output: the boot id, the
// kernel's symbols (address, type, name) and its sections' physical
// ranges ("163110000-1641fffff : Kernel bss").
func ParseBootIDProbe(out string) (*BootIDSite, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 {
		return nil, fmt.Errorf("the guest printed nothing")
	}
	id := strings.TrimSpace(lines[0])
	if _, err := bootIDBytes(id); err != nil {
		return nil, err
	}
	syms := map[string]uint64{}
	var symType byte
	phys := map[string][2]uint64{}
	for _, line := range lines[1:] {
		if rng, name, ok := strings.Cut(line, " : "); ok {
			lo, hi, ok := strings.Cut(strings.TrimSpace(rng), "-")
			a, err1 := strconv.ParseUint(lo, 16, 64)
			b, err2 := strconv.ParseUint(hi, 16, 64)
			if ok && err1 == nil && err2 == nil {
				phys[strings.TrimSpace(name)] = [2]uint64{a, b}
			}
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 { // a module's symbol has a fourth field, [module]
			continue
		}
		a, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil || a == 0 { // zeros: addresses hidden (kptr_restrict)
			continue
		}
		syms[f[2]] = a
		if f[2] == "sysctl_bootid" {
			symType = f[1][0]
		}
	}
	at, ok := syms["sysctl_bootid"]
	if !ok {
		return nil, fmt.Errorf("the guest kernel's symbols do not name its boot id (sysctl_bootid: a kernel without CONFIG_KALLSYMS_ALL, or its addresses hidden)")
	}
	start, section := "__bss_start", "Kernel bss"
	if symType == 'd' || symType == 'D' {
		start, section = "_sdata", "Kernel data"
	}
	base, ok := syms[start]
	rng, ok2 := phys[section]
	if !ok || !ok2 || at < base {
		return nil, fmt.Errorf("the guest does not say where its kernel's %s is (%s in /proc/kallsyms, %q in /proc/iomem)", section, start, section)
	}
	addr := rng[0] + (at - base)
	if addr+16 > rng[1]+1 {
		return nil, fmt.Errorf("the boot id's address %#x falls outside the kernel's %s (%#x-%#x)", addr, section, rng[0], rng[1])
	}
	return &BootIDSite{Addr: addr, ID: id}, nil
}

// bootIDBytes is a boot id's 16 bytes as the kernel keeps them.
func bootIDBytes(id string) ([]byte, error) {
	b, err := hex.DecodeString(strings.ReplaceAll(id, "-", ""))
	if err != nil || len(b) != 16 || len(id) != 36 {
		return nil, fmt.Errorf("the guest's boot id %q is not a UUID", id)
	}
	return b, nil
}

// CloneEdits are the edits of a clone's memory for a template whose boot
// id is at site: the one that gives the clone its own boot id (a random
// version 4 UUID, as the kernel makes one), and that id. A template that
// does not say where its kernel keeps it (site nil) has none: its clones
// share its boot id until they reboot.
func CloneEdits(site *BootIDSite) ([]driver.MemoryEdit, string, error) {
	if site == nil {
		return nil, "", nil
	}
	old, err := bootIDBytes(site.ID)
	if err != nil {
		return nil, "", fmt.Errorf("the template's boot id: %w", err)
	}
	id := state.NewID()
	b, err := bootIDBytes(id)
	if err != nil {
		return nil, "", err
	}
	return []driver.MemoryEdit{{What: "the kernel's boot id", Addr: site.Addr, Old: old, New: b}}, id, nil
}
