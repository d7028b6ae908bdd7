// Package modules holds agent-vm's NixOS modules: services.agent-mcp
// (agent-mcp.nix) and the agent-vm.guest contract (guest.nix, which imports
// agent-mcp.nix). The same files are the flake's nixosModules, so the modules
// the binary renders per-branch VMs from and the ones users import cannot
// drift. modules/README.md documents the option interface.
package modules

import (
	"embed"
	"io/fs"
)

//go:embed *.nix
var files embed.FS

// FS returns the embedded modules, one file per module at the root
// ("agent-mcp.nix", "guest.nix"). guest.nix imports ./agent-mcp.nix, so write
// them side by side when writing them out.
func FS() fs.FS { return files }

// Names returns the embedded module file names in lexical order.
func Names() []string {
	// "*.nix" is a valid pattern, so Glob cannot fail.
	names, _ := fs.Glob(files, "*.nix")
	return names
}
