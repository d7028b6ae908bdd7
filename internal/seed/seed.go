// Package seed makes a VM's cloud-init NoCloud seed from what agent-vm
// keeps of the VM (its record, its keys, its optional mcp.json) and writes
// it into the VM's directory; internal/cloudinit renders it. It is the
// Debian guest both cloud-init backends boot: the qemu backend
// (internal/debian, a Debian image on an overlay run by QEMU) and the
// vagrant backend (internal/vagrantbackend, the same guest from a Vagrant
// box run by vagrant). Each keeps its own record section and files; what
// they share is here, so neither backend imports the other.
package seed

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/agent-vm/agent-vm/internal/cloudinit"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/state"
)

// Files of the seed in a VM directory.
const (
	File      = "seed.iso" // the NoCloud seed, rewritten at every start
	MCPConfig = "mcp.json" // the VM's own MCP servers (optional)
)

// Config is what a VM's cloud-init seed says at its provision'th
// provisioning (the instance-id is the VM's id and that count).
func Config(l state.Layout, r *state.Record, provision int, caCerts []string) (cloudinit.Config, error) {
	pub, err := os.ReadFile(l.ClientPubKey())
	if err != nil {
		return cloudinit.Config{}, fmt.Errorf("reading the VM's client key: %w", err)
	}
	hostPriv, err := os.ReadFile(l.HostKey())
	if err != nil {
		return cloudinit.Config{}, fmt.Errorf("reading the VM's host key: %w", err)
	}
	hostPub, err := os.ReadFile(l.HostPubKey())
	if err != nil {
		return cloudinit.Config{}, fmt.Errorf("reading the VM's host key: %w", err)
	}
	var mcpConfig []byte
	if b, err := os.ReadFile(filepath.Join(l.Dir, MCPConfig)); err == nil {
		mcpConfig = b
	}
	npm, npmPrograms := AgentPackages(r, nil)
	return cloudinit.Config{
		InstanceID:     InstanceID(r, provision),
		Hostname:       r.Slug,
		UID:            r.Guest.UID,
		GID:            r.Guest.GID,
		AuthorizedKeys: []string{strings.TrimSpace(string(pub))},
		HostKey:        cloudinit.HostKey{Private: string(hostPriv), Public: strings.TrimSpace(string(hostPub))},
		MCP:            cloudinit.MCP{Port: guest.MCPPort, AllowOrigins: r.AllowOrigins, Config: mcpConfig},
		CACerts:        caCerts,
		NPMPackages:    npm,
		NPMPrograms:    npmPrograms,
		ExtraPackages:  r.AllPackages(),
		Guidance: guest.Guidance(guest.GuidanceInfo{Branch: r.Branch, Repo: r.Git.Source,
			Install: "Install software with `sudo apt-get install PACKAGE` (Debian), `npm install -g` or `pip install --user`."}),
	}, nil
}

// InstanceID is the cloud-init instance-id of r's guest at its
// provision'th provisioning.
func InstanceID(r *state.Record, provision int) string {
	return fmt.Sprintf("%s-%d", r.ID, provision)
}

// Write writes the VM's cloud-init seed with the agent-vm binary the
// guest installs.
func Write(ctx context.Context, l state.Layout, r *state.Record, c cloudinit.Config, executable func() (string, error)) error {
	exe, err := executable()
	if err != nil {
		return fmt.Errorf("finding the agent-vm binary for the guest: %w", err)
	}
	if p, err := filepath.EvalSymlinks(exe); err == nil {
		exe = p
	}
	return cloudinit.WriteSeed(ctx, filepath.Join(l.Dir, File), c, cloudinit.SeedOptions{AgentBinary: exe, ModTime: r.CreatedAt})
}

// ForStart reads the backend's section S of r and, on start
// --reprovision, counts one more provisioning in it (provision points at
// the count): a new instance-id makes the guest's first-boot setup run
// again.
func ForStart[S any](r *state.Record, reprovision bool, provision func(*S) *int) (S, error) {
	s, err := state.SectionOf[S](r)
	if err != nil || !reprovision {
		return s, err
	}
	*provision(&s)++
	return s, r.SetSection(s)
}

// AgentPackages are the npm package specs of the agent CLIs r's guest
// installs at its first boot: its agent's at the pinned version unless
// its template's guest has that agent already (have: the template's
// agents' names), and a template's agents at theirs. Those whose program
// comes in a package of its own for the guest are in programs, that
// package alone (guest.Agent.Specs, installed by
// guest.NPMInstallPrograms); the others in specs.
func AgentPackages(r *state.Record, have []string) (specs, programs []string) {
	add := func(a guest.Agent, version string) {
		s, program := a.Specs(version, runtime.GOARCH) // the guest's CPU is this machine's
		if program {
			programs = append(programs, s...)
		} else {
			specs = append(specs, s...)
		}
	}
	if a, err := guest.LookupAgent(r.Agent); err == nil && !slices.Contains(have, a.Name) {
		add(a, "")
	} // create refused unknown names
	for _, pin := range r.Agents {
		name, version, _ := strings.Cut(pin, "@")
		if a, err := guest.LookupAgent(name); err == nil {
			add(a, version)
		}
	}
	return specs, programs
}

// MACOf is the VM's own MAC (52:54:00 is QEMU's prefix), from its id, for
// a guest on a libvirt network (the vagrant and libvirt backends): the
// seed's network config matches the NIC by it, and two VMs on one host
// must not share one.
func MACOf(id string) string {
	h := sha256.Sum256([]byte(id))
	return fmt.Sprintf("52:54:00:%02x:%02x:%02x", h[0], h[1], h[2])
}
