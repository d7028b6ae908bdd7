// Package template is agent-vm's templates: a new branch's VM starts from
// a saved machine in seconds instead of booting and provisioning for a
// minute or more.
//
// A template is a VM of its own, kept in a state directory of its own
// (vm.Manager.TemplateDir, under the cache directory: 0700 directories, 0600
// files, as every VM's): a record, its own throwaway client key, host key
// and MCP token, an empty workspace, a disk (an overlay on the base image)
// and the saved state of its machine. `agent-vm template build BRANCH`
// makes the one BRANCH's VM fits (without BRANCH, the default machine's:
// what `create` makes with no flags): it creates that VM, boots it cold
// with a template seed (the guest contract: user dev, sshd, the agent-vm
// units, the proxy settings, the host's CA certificates; the agent CLIs
// asked for, at the versions agent-vm pins, agents.go; the VM's packages;
// no workspace content, no provisioning script, no identity of any real
// VM),
// waits for cloud-init to finish, checks that each agent CLI runs,
// suspends it (internal/qemu's
// suspend path: the share unplugged, the state saved, the identity of
// QEMU, machine and disk recorded) and freezes its disk read-only.
//
// Which template a VM may start from is its Key: the
// backend, accelerator, size (CPUs, memory, disk), the workspace owner's
// uid/gid (dev's ids are baked in), the host CA certificates the guest
// trusts, the agent-vm binary the guest runs and the guest contract
// version; the directory is named after the key's hash. The rest is
// checked where it is known: the base image by the backend (the template's
// disk must be an overlay on the base this VM would boot), the QEMU
// version and the machine's command line by the driver (driver.Cloner).
//
// A VM's first start (its backend has no disk for it yet) uses the
// template when there is one that fits, unless StartOptions.NoTemplate:
// the backend makes the VM's disk on the template's (base <- template <-
// VM), the driver starts QEMU from the template's state with the VM's own
// ports, forwards, fw_cfg token and virtiofsd and writes the clone's own
// kernel boot id into its memory (bootid.go), then vm's start logs in with the
// template's key (boot.Wait.As) and runs the backend's Personalize script, which hands
// the guest's agent-vm a plan (internal/personalize): the VM's host key
// and client key, the template's removed; a new machine-id; hostname;
// the instance-id, so that the VM's later cold boots with its own seed do
// not provision it again; the kernel RNG reseeded from the host on top of
// vmgenid; agent-mcp's settings and the VM's MCP token. It reconnects with
// the VM's pinned keys, mounts the workspace (resume's attach), and runs
// FirstRun (its agent CLI unless the template has it, repository
// provisioning). From then on the VM is
// an ordinary one: later starts boot its own disk.
//
// Only a backend that says what of its record section a template takes
// and shares (a backend.Templater: the qemu backend), run by a driver that
// suspends and clones (driver.Suspender, driver.Cloner: QEMU's), has
// templates. Anything that does not fit falls back to the cold first
// boot, logged as one line with the reason: no template, another key, a
// NixOS guest, a different base or QEMU or machine, 9p instead of
// virtiofs.
//
// Why an explicit build rather than one made behind the user's back after
// the first cold boot: a template build is a whole extra boot (a minute
// alone under TCG, several on a busy 2-core host) competing with the VM
// the user is waiting for, and it keeps a disk and a RAM image (about the
// guest's memory) on disk; the user decides when that is worth it.
//
// A clone's kernel boot id (/proc/sys/kernel/random/boot_id), which the
// guest cannot change, is written into its memory by the driver before it
// runs (bootid.go): the build records where the template's kernel keeps
// it.
//
// A template is current when a build now would make the same: `template
// list` and doctor say what is older (Current.Stale: what keeps new VMs
// from it, such as a newer base image, or agent CLIs older than agent-vm
// pins), and building again replaces it (Build retires the older one).
//
// A template's disk backs its clones' disks: `template rm` keeps it (alone
// in the template's directory, which is no template any more) while a
// VM's disk is made on it, and removes the rest; a later `template rm`
// removes it once no VM uses it. Each build has a directory of its own
// (the key's hash and the build time), so a rebuilt template never
// replaces a disk in use.
//
// This package is the templates' vocabulary: keys and names, template.json,
// listing, retiring and freezing, and the boot id's place and edit; vm
// calls it to start clones. It holds the templates' commands too
// (Templates: `template build|list|rm`, `setup --template`, doctor's
// line), which act on VMs as the command rooms do: through the few
// methods of vm's Manager they need (VMs), cli passing the Manager in. A
// build drives a VM of the templates' state directory, booted and
// suspended as any VM, through the Manager over that directory (Builder).
// It imports no vm.
package template

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Contract is the version of what a template's guest holds;
// change it whenever the template seed or Personalize changes what a
// clone's guest is, so that older templates are refused.
const Contract = 2 // 2: template.json says where the kernel keeps its boot id; the guest's agent-vm personalizes

// Files of a template's directory besides a VM's.
const (
	File = "template.json" // its key and when it was built
)

// Key is what a VM must share with a template to start from it.
type Key struct {
	Backend   string `json:"backend"`
	Accel     string `json:"accel"`
	CPUs      int    `json:"cpus"`
	MemoryMiB int    `json:"memory_mib"`
	DiskGiB   int    `json:"disk_gib"`
	UID       int    `json:"uid"`
	GID       int    `json:"gid"`
	NoHostCA  bool   `json:"no_host_ca"`
	CAs       string `json:"host_cas"`    // sha256 of the CA certificates the guest trusts
	AgentVM   string `json:"agent_vm"`    // sha256 of the agent-vm binary the guest runs
	Contract  int    `json:"contract"`    // Contract
	Base      string `json:"base_config"` // the backend's section, less its per-VM counters
}

// Prefix begins the names of the key's templates' directories
// ("t-<hash>-<build time>").
func (k Key) Prefix() string {
	b, _ := json.Marshal(k)
	h := sha256.Sum256(b)
	return "t-" + hex.EncodeToString(h[:8]) + "-"
}

// Record is template.json.
type Record struct {
	Key   Key       `json:"key"`
	Built time.Time `json:"built"`
	// For is the branch whose VM the build was asked for.
	For string `json:"for"`
	// BootID is where the template's kernel keeps its boot id; nil when
	// the guest did not say (its clones then share the template's).
	BootID *BootIDSite `json:"boot_id,omitempty"`
	// Agents are the agent CLIs its guest has, each at the version npm
	// installed, by name (guest.Agent's): its clones do not install them.
	Agents map[string]string `json:"agents,omitempty"`
	// Packages are the Debian packages its guest has besides the base
	// image's: those of the VM it was built for.
	Packages []string `json:"packages,omitempty"`
}

// Info describes one template (template list, doctor).
type Info struct {
	Slug  string    `json:"slug"`
	Dir   string    `json:"dir"`
	For   string    `json:"for"`
	Built time.Time `json:"built"`
	Ready bool      `json:"ready"` // a template (else the disk of a removed one)
	Key   *Key      `json:"key,omitempty"`
	// Agents are its agent CLIs' versions, by name; Packages its
	// packages besides the base image's.
	Agents   map[string]string `json:"agents,omitempty"`
	Packages []string          `json:"packages,omitempty"`
	// UsedBy counts the VMs whose disks are made on its disk.
	UsedBy int `json:"used_by"`
	// Stale says why new VMs would not start from it, or what is older in
	// it than a new build would be (the caller's Staleness), one phrase
	// each; empty when it is current.
	Stale []string `json:"stale,omitempty"`
}

// Hash is the hex SHA-256 of b, as keys hold the CA certificates and the
// agent-vm binary.
func Hash(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// CAsHash is what a key holds of the CA certificates a guest trusts.
func CAsHash(cas []string) string { return Hash([]byte(strings.Join(cas, "\x00"))) }

// Current is what a template built now would be made with, for Stale.
type Current struct {
	Contract int
	AgentVM  string // Hash of the agent-vm binary ("" when unknown)
	CAs      string // CAsHash of the host's CA certificates ("" when unknown)
}

// Stale says what makes the template t older than one built now, one
// phrase each: what keeps new VMs from starting from it (another guest
// contract, agent-vm binary or set of host CA certificates; the
// backend's say, backendSays, about its base image), then agent CLIs
// older than agent-vm pins (which its clones still run).
func (c Current) Stale(t Info, backendSays string) []string {
	var out []string
	if t.Key != nil {
		switch k := t.Key; {
		case k.Contract != c.Contract:
			out = append(out, fmt.Sprintf("made for the guest contract %d, and this agent-vm's is %d, so no VM starts from it", k.Contract, c.Contract))
		case c.AgentVM != "" && k.AgentVM != c.AgentVM:
			out = append(out, "made with another agent-vm binary than this one, so no VM starts from it")
		case c.CAs != "" && !k.NoHostCA && k.CAs != c.CAs:
			out = append(out, "the host's CA certificates changed since it was made, so no VM that trusts them starts from it")
		}
	}
	if backendSays != "" {
		out = append(out, backendSays)
	}
	return append(out, StaleAgents(t.Agents)...)
}

// Read reads the template.json of the template in dir.
func Read(dir string) (Record, error) {
	var rec Record
	b, err := os.ReadFile(filepath.Join(dir, File))
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	return rec, err
}

// Write writes rec as the template.json of the template in dir.
func Write(dir string, rec Record) error {
	b, _ := json.MarshalIndent(rec, "", "  ")
	return atomicfile.Write(filepath.Join(dir, File), append(b, '\n'), 0o600)
}

// Newest is the newest complete template (one with its
// template.json) whose directory name begins with prefix.
func Newest(dir, prefix string) (state.Layout, bool) {
	found, _ := filepath.Glob(filepath.Join(dir, prefix+"*", File))
	if len(found) == 0 {
		return state.Layout{}, false
	}
	slices.Sort(found) // the build time sorts as text
	return state.Layout{Dir: filepath.Dir(found[len(found)-1])}, true
}

// Freeze makes the template's disks (its backend's qcow2 files)
// read-only: its clones' disks are made on them.
func Freeze(dir string) error {
	disks, err := filepath.Glob(filepath.Join(dir, "*.qcow2"))
	if err != nil {
		return err
	}
	for _, d := range disks {
		if err := os.Chmod(d, 0o400); err != nil {
			return err
		}
	}
	return nil
}

// list lists the templates in dir, with how many of the disks in used
// (the disks VMs' disks are made on) each one's disks back.
func list(dir string, used map[string]int) ([]Info, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Info
	for _, d := range entries {
		if !d.IsDir() || !strings.HasPrefix(d.Name(), "t-") {
			continue
		}
		tdir := filepath.Join(dir, d.Name())
		info := Info{Slug: d.Name(), Dir: tdir}
		if rec, err := Read(tdir); err == nil {
			info.For, info.Built, info.Ready, info.Key, info.Agents, info.Packages = rec.For, rec.Built, true, &rec.Key, rec.Agents, rec.Packages
		}
		for d, n := range used {
			if filepath.Dir(d) == tdir {
				info.UsedBy += n
			}
		}
		out = append(out, info)
	}
	return out, nil
}

// Retire removes a template but for its disks that VMs' disks are made
// on (they name their backing file by its path): those stay in the
// template's directory, which is then no template any more (no
// template.json, no saved state, no keys), until no VM uses them. The
// records of those VMs' disks (image.UsersDir) stay with them, so that
// the other state directories' VMs keep them too.
func Retire(root *state.Root, t Info, used map[string]int) error {
	var keep []string
	for d := range used {
		if filepath.Dir(d) == t.Dir {
			keep = append(keep, filepath.Base(d))
		}
	}
	if len(keep) == 0 {
		return root.Remove(t.Slug)
	}
	keep = append(keep, image.UsersDir)
	entries, err := os.ReadDir(t.Dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if slices.Contains(keep, e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(t.Dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// check is doctor's line about the templates in dir (ts, or err when
// they could not be listed): informational, new VMs boot without one.
func check(dir string, ts []Info, err error) backend.Check {
	c := backend.Check{Name: "templates", OK: true}
	ready := 0
	for _, t := range ts {
		if t.Ready {
			ready++
		}
	}
	var stale []string
	for _, t := range ts {
		if t.Ready && len(t.Stale) > 0 {
			stale = append(stale, t.Slug+": "+strings.Join(t.Stale, "; "))
		}
	}
	switch {
	case err != nil:
		c.Detail = "unreadable: " + err.Error()
	case ready == 0:
		c.Detail = "none: new VMs boot cold, and install their agent CLI from npm"
		c.Hint = "`agent-vm template build` saves the default machine with the agent CLIs, which new VMs start from in seconds"
	case len(stale) > 0:
		c.Detail = fmt.Sprintf("%d in %s, %d of them older than a build now would be: %s", ready, dir, len(stale), strings.Join(stale, " | "))
		c.Hint = "`agent-vm template build [BRANCH]` again replaces a template; VMs started from the old one keep working"
	default:
		c.Detail = fmt.Sprintf("%d in %s, current (`agent-vm template list`)", ready, dir)
	}
	return c
}
