# agent-vm: the per-branch data layer. Static: every per-branch value is read
# from vm.json as data, never spliced into Nix text. default.nix builds the VM
# from what this file returns; agent-vm's tests evaluate this file with the
# real nix to check that every value arrives unchanged.
let
  vm = builtins.fromJSON (builtins.readFile ./vm.json);
  gitHosts = builtins.attrNames vm.gitCredentials;
  byHost = f: builtins.listToAttrs (map f gitHosts);
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
    # git reaches each host whose token the egress proxy holds over https
    # (an ssh-form remote too), and answers the token's placeholder.
    programs.git = {
      enable = true;
      config = {
        url = byHost (host: {
          name = "https://${host}/";
          value.insteadOf = [ "git@${host}:" "ssh://git@${host}/" ];
        });
        credential = byHost (host: {
          name = "https://${host}";
          value.helper = [
            ""
            "!f() { test \"$1\" = get && printf 'username=agent-vm\\npassword=%s\\n' ${vm.gitCredentials.${host}}; }; f"
          ];
        });
      };
    };
  };
}
