# agent-vm: the per-branch data layer. Static: every per-branch value is read
# from vm.json as data, never spliced into Nix text. default.nix builds the VM
# from what this file returns; agent-vm's tests evaluate this file with the
# real nix to check that every value arrives unchanged.
let
  vm = builtins.fromJSON (builtins.readFile ./vm.json);
in
{
  inherit (vm) nixpkgs system userModule;

  # The module default.nix adds to the guest: agent-vm.guest and the MCP
  # proxy's settings, exactly as vm.json holds them.
  guest = {
    agent-vm.guest = {
      enable = true;
      name = vm.slug;
      user = {
        inherit (vm.guest) uid gid;
        authorizedKeys = [ vm.ssh.authorizedKey ];
      };
      ports = {
        inherit (vm.ports) ssh mcp;
      };
      resources = {
        inherit (vm.resources) memorySize cores diskSize;
      };
      workspace.transport = vm.workspace.transport;
      inherit (vm) agentVmExecutable guidance packages;
    };
    services.agent-mcp.allowOrigin = vm.mcp.allowOrigin;
    security.pki.certificates = vm.caCertificates;
    environment.sessionVariables = vm.environment;
  };
}
