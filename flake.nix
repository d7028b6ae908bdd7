{
  description = "agent-vm: one isolated VM per git branch for coding agents";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-26.05";

  outputs =
    { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems = f: lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      packages = forAllSystems (
        pkgs:
        let
          agent-vm = pkgs.callPackage ./nix/package.nix { };
        in
        {
          inherit agent-vm;
          inherit (agent-vm) integration-test;
          default = agent-vm;
        }
      );

      apps = forAllSystems (
        pkgs:
        let
          packages = self.packages.${pkgs.stdenv.hostPlatform.system};
          app = pkg: description: {
            type = "app";
            program = lib.getExe pkg;
            meta = { inherit description; };
          };
        in
        {
          agent-vm = app packages.agent-vm "Create, run and manage per-branch agent VMs";
          # Its wrapper puts the matching agent-vm on PATH.
          integration-test = app packages.integration-test "Run agent-vm's end-to-end tests";
          default = self.apps.${pkgs.stdenv.hostPlatform.system}.agent-vm;
        }
      );

      devShells = forAllSystems (pkgs: {
        default = pkgs.callPackage ./nix/devshell.nix { };
      });

      # The same files agent-vm embeds (modules/embed.go). The default is
      # agent-mcp, safe on any NixOS host; guest imports qemu-vm.nix and
      # turns the importing system into a VM, so it is only ever named.
      nixosModules = {
        agent-mcp = ./modules/agent-mcp.nix;
        guest = ./modules/guest.nix;
        default = self.nixosModules.agent-mcp;
      };

      overlays.default = final: _prev: {
        agent-vm = final.callPackage ./nix/package.nix { };
      };

      checks = forAllSystems (pkgs: import ./nix/checks.nix { inherit self nixpkgs pkgs; });

      # nixfmt (RFC 166 style) over the whole tree for `nix fmt`.
      formatter = forAllSystems (pkgs: pkgs.nixfmt-tree);
    };
}
