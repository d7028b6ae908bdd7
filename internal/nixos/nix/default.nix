# agent-vm: one branch's NixOS VM. Static: it reads data.nix (vm.json) and
# the modules beside it. Build with
#   nix build -f default.nix vm launcher
# vm is the run-<name>-vm script, launcher a JSON file telling agent-vm's
# launcher what to add to QEMU (modules/guest.nix, agent-vm.guest.launcher).
let
  data = import ./data.nix;
  nixos = import (data.nixpkgs + "/nixos/lib/eval-config.nix") {
    inherit (data) system;
    modules = [
      ./modules/guest.nix
      data.guest
    ]
    ++ (if data.userModule == null then [ ] else [ (/. + data.userModule) ]);
  };
in
{
  vm = nixos.config.system.build.vm;
  launcher = nixos.config.system.build.agentVmLauncher;
}
