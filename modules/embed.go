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

//go:embed *.nix provision.sh
var files embed.FS

// ProvisionFile is the script both guests run at the first boot of a root
// disk to provision what the repository asks for (guest.ProvisionScript):
// guest.nix makes it agent-vm-provision.service, and the cloud-init seed
// installs it for runcmd. Write it beside the modules.
const ProvisionFile = "provision.sh"

// FS returns the embedded modules, one file per module at the root
// ("agent-mcp.nix", "guest.nix"). guest.nix imports ./agent-mcp.nix, so write
// them side by side when writing them out.
func FS() fs.FS { return files }

// Provision returns the provisioning script (ProvisionFile).
func Provision() []byte {
	b, _ := files.ReadFile(ProvisionFile) // embedded above: cannot fail
	return b
}

// Names returns the embedded module file names in lexical order (the .nix
// files; ProvisionFile is not a module).
func Names() []string {
	// "*.nix" is a valid pattern, so Glob cannot fail.
	names, _ := fs.Glob(files, "*.nix")
	return names
}
