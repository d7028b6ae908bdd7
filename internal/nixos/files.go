// Package nixos is the NixOS backend: at create it writes the VM's vm.json
// (all per-branch data) beside a static default.nix and data.nix and the
// embedded NixOS modules; at start it runs `nix build` and hands the
// resulting run-<name>-vm script to the shared QEMU launcher.
//
// No user string is ever spliced into Nix text: the .nix files are the same
// bytes for every VM and read vm.json with builtins.fromJSON.
package nixos

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/modules"
)

//go:embed nix/default.nix nix/data.nix
var expressions embed.FS

// Files of the NixOS backend in a VM directory.
const (
	VMJSONFile  = "vm.json"
	DefaultNix  = "default.nix"
	DataNix     = "data.nix"
	ModulesDir  = "modules"
	DiskImage   = "disk.qcow2"
	BuildRecord = "nix-build.json"
	// GCRoot is nix build's --out-link: GCRoot -> the VM, GCRoot+"-1" ->
	// the launcher description. They keep the build from nix-collect-garbage
	// while the VM exists (GCRoots lists both).
	GCRoot = "nix-gcroot"
)

// GCRoots are the out-links one build leaves in a VM directory.
func GCRoots(dir string) []string {
	return []string{filepath.Join(dir, GCRoot), filepath.Join(dir, GCRoot+"-1")}
}

// RemoveGCRoots removes a VM's out-links, so nix may collect its build.
func RemoveGCRoots(dir string) error {
	var errs []error
	for _, p := range GCRoots(dir) {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// VMJSON is vm.json: every per-branch value the Nix side needs. data.nix
// maps it onto the modules' options (modules/README.md).
type VMJSON struct {
	Version           int       `json:"version"`
	System            string    `json:"system"`  // x86_64-linux, aarch64-linux
	Nixpkgs           string    `json:"nixpkgs"` // a nixpkgs source tree (store path)
	Slug              string    `json:"slug"`
	Branch            string    `json:"branch"` // informational
	Guest             GuestJSON `json:"guest"`
	SSH               SSHJSON   `json:"ssh"`
	Ports             PortsJSON `json:"ports"`
	Resources         ResJSON   `json:"resources"`
	Workspace         WSJSON    `json:"workspace"`
	AgentVMExecutable *string   `json:"agentVmExecutable"` // a static agent-vm for the guest
	UserModule        *string   `json:"userModule"`        // --config, absolute
	MCP               MCPJSON   `json:"mcp"`
	// CACertificates are PEM CA certificates the guest trusts besides
	// nixpkgs' bundle (security.pki.certificates).
	CACertificates []string `json:"caCertificates"`
	// Environment are variables every login, command and session in the
	// guest gets (environment.sessionVariables, through pam_env): the
	// placeholders of the VM's secrets, and where Node finds the CAs.
	Environment map[string]string `json:"environment"`
	// GitCredentials are the git hosts whose token the VM's proxy holds,
	// with that token's placeholder: the guest's git reaches them over
	// https and answers the placeholder (programs.git.config).
	GitCredentials map[string]string `json:"gitCredentials"`
	// Guidance is the note telling agents where they are (guest.Guidance).
	Guidance string `json:"guidance"`
	// Packages are nixpkgs attribute names installed system-wide (create
	// --packages and the repository's .agent-vm/config.toml).
	Packages []string `json:"packages"`
}

// GuestJSON is the guest user's ids.
type GuestJSON struct {
	UID int `json:"uid"`
	GID int `json:"gid"`
}

// SSHJSON carries the VM's client public key.
type SSHJSON struct {
	AuthorizedKey string `json:"authorizedKey"`
}

// PortsJSON are the host ports.
type PortsJSON struct {
	SSH int `json:"ssh"`
	MCP int `json:"mcp"`
}

// ResJSON is the VM's size in the modules' units (MiB).
type ResJSON struct {
	MemorySize int `json:"memorySize"`
	Cores      int `json:"cores"`
	DiskSize   int `json:"diskSize"`
}

// WSJSON says how the workspace is shared.
type WSJSON struct {
	Transport string `json:"transport"` // virtiofs or 9p
}

// MCPJSON holds agent-mcp settings.
type MCPJSON struct {
	AllowOrigin []string `json:"allowOrigin"`
}

// NixSystem is the Nix system string for the host's architecture.
func NixSystem() (string, error) {
	switch runtime.GOARCH {
	case "amd64":
		return "x86_64-linux", nil
	case "arm64":
		return "aarch64-linux", nil
	}
	return "", fmt.Errorf("the nixos backend supports x86_64 and aarch64 hosts, not %s", runtime.GOARCH)
}

// newVMJSON fills vm.json from the record and the VM's files.
func newVMJSON(l state.Layout, r *state.Record, nixpkgs, transport, agentVM string) (*VMJSON, error) {
	sys, err := NixSystem()
	if err != nil {
		return nil, err
	}
	pub, err := os.ReadFile(l.ClientPubKey())
	if err != nil {
		return nil, fmt.Errorf("reading the VM's public key: %w", err)
	}
	v := &VMJSON{
		Version: 1, System: sys, Nixpkgs: nixpkgs, Slug: r.Slug, Branch: r.Branch,
		Guest:          GuestJSON{UID: r.Guest.UID, GID: r.Guest.GID},
		SSH:            SSHJSON{AuthorizedKey: strings.TrimSpace(string(pub))},
		Ports:          PortsJSON{SSH: r.Ports.SSH, MCP: r.Ports.MCP},
		Resources:      ResJSON{MemorySize: r.Resources.MemoryMiB, Cores: r.Resources.CPUs, DiskSize: r.Resources.DiskGiB * 1024},
		Workspace:      WSJSON{Transport: transport},
		MCP:            MCPJSON{AllowOrigin: append([]string{}, r.AllowOrigins...)},
		CACertificates: []string{},
		// Node reads its own bundle, not the system's, unless told.
		Environment:    map[string]string{"NODE_EXTRA_CA_CERTS": "/etc/ssl/certs/ca-certificates.crt"},
		GitCredentials: map[string]string{},
		Guidance: guest.Guidance(guest.GuidanceInfo{Branch: r.Branch, Repo: r.Git.Source,
			Install: "For a shell with a program, `nix-shell -p PACKAGE`; what should last belongs in the VM's NixOS configuration (`agent-vm create --config`): ask the user."}),
	}
	if agentVM != "" {
		v.AgentVMExecutable = &agentVM
	}
	v.Packages = append([]string{}, r.AllPackages()...)
	if err := CheckPackages(v.Packages); err != nil {
		return nil, err
	}
	s, err := state.SectionOf[Settings](r)
	if err != nil {
		return nil, err
	}
	if s.Config != "" {
		v.UserModule = &s.Config
	}
	return v, nil
}

// writeFiles writes vm.json, the static expressions and the modules into
// dir, replacing what an older agent-vm wrote.
func writeFiles(dir string, v *VMJSON) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(filepath.Join(dir, VMJSONFile), append(b, '\n'), 0o600); err != nil {
		return err
	}
	for _, name := range []string{DefaultNix, DataNix} {
		src, err := expressions.ReadFile("nix/" + name)
		if err != nil {
			return err
		}
		if err := atomicfile.Write(filepath.Join(dir, name), src, 0o644); err != nil {
			return err
		}
	}
	mdir := filepath.Join(dir, ModulesDir)
	if err := os.MkdirAll(mdir, 0o755); err != nil {
		return err
	}
	for _, name := range append(modules.Names(), modules.ProvisionFile) {
		src, err := fs.ReadFile(modules.FS(), name)
		if err != nil {
			return err
		}
		if err := atomicfile.Write(filepath.Join(mdir, name), src, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// attrNameRE is a plain Nix attribute name (no quoting): how the guest
// module names a package, pkgs.<name>.
var attrNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_'-]*$`)

// CheckPackages refuses names that are not plain nixpkgs attribute names,
// naming the first bad one. Whether nixpkgs has them, the build says.
func CheckPackages(names []string) error {
	for _, n := range names {
		if len(n) > 128 || !attrNameRE.MatchString(n) {
			return fmt.Errorf("package %q is not a nixpkgs attribute name, which the nixos backend installs as pkgs.<name> (hint: letters, digits, '_', '-' and an apostrophe, not starting with a digit or '-', e.g. \"ripgrep\" or \"python3\")", n)
		}
	}
	return nil
}
