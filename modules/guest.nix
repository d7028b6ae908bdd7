# agent-vm.guest: the NixOS side of agent-vm's guest contract (docs/design.md).
#
# One module turns a NixOS configuration into an agent-vm branch VM: it
# imports nixpkgs' qemu-vm.nix (so `config.system.build.vm` is the
# `run-<name>-vm` script) and agent-mcp.nix, and sets
#   - user `dev` with the host's uid/gid, the VM's authorized key, wheel and
#     passwordless sudo;
#   - sshd: key-only, no root login, its only host key installed at boot from
#     the QEMU fw_cfg credential `agent-vm.ssh-host-key` (never in the store);
#   - the MCP token, from the credential `agent-vm.mcp-token`, at
#     /run/agent-vm/mcp-token (root, 0600) for services.agent-mcp;
#   - /workspace over virtiofs (tag `workspace`) or 9p (same tag), served by
#     the launcher;
#   - host port forwards bound to 127.0.0.1 only, firewall open for 22 and
#     the agent port; resources from the VM record.
#   - xdg-open, sensible-browser, x-www-browser, www-browser and BROWSER:
#     `agent-vm open-url`, which asks the host to open the URL.
#
# The per-branch default.nix sets `agent-vm.guest.*` from vm.json; see
# modules/README.md for the exact interface and the QEMU arguments the
# launcher must add.
#
# Option names of nixpkgs' virtualisation/qemu-vm.nix were checked against
# NixOS/nixpkgs rev 00008e8eb762c5def2670c20231de50db9bb75b3 (the revision
# readable from here; the flake pins release-26.05 at
# bf817068f9eb336bfd314cab423f826af5b56a6a): virtualisation.{memorySize,
# cores, diskSize, graphics, forwardPorts.*.{from,host.address,host.port,
# guest.port}, fileSystems, qemu.options, sharedDirectories}. Two facts from
# that file shape this module:
#   - qemu-vm sets `fileSystems = mkVMOverride virtualisation.fileSystems`, so
#     a plain `fileSystems."/workspace"` would be dropped in the VM: the mount
#     is declared through `virtualisation.fileSystems`.
#   - there `virtualisation.sharedDirectories` are 9p (`-virtfs`) and always
#     passed to QEMU, so they cannot serve as a run-time fallback; the 9p
#     workspace is declared here and its device comes from the launcher.
# virtualisation.qemu.enableSharedMemory is not in that revision; it was read
# in nixos/lib/testing/driver.nix at 01fbdeef22b76df85ea168fbfe1bfd9e63681b30
# (the test driver sets it) and is used only where nixpkgs declares it.
{
  config,
  options,
  lib,
  pkgs,
  modulesPath,
  ...
}:

let
  cfg = config.agent-vm.guest;
  mcp = config.services.agent-mcp;

  userName = "dev";
  runDir = "/run/agent-vm";
  hostKeyPath = "${runDir}/ssh_host_ed25519_key";
  tokenPath = "${runDir}/mcp-token";
  credentialPrefix = "opt/io.systemd.credentials";
  hostKeyCredential = "agent-vm.ssh-host-key";
  tokenCredential = "agent-vm.mcp-token";

  # virtiofs (vhost-user) needs guest RAM in shared memory. nixpkgs has an
  # option for it, virtualisation.qemu.enableSharedMemory (the NixOS test
  # driver sets it for its vhost-user SSH backdoor; nixpkgs PR 563324 makes
  # it the default once sharedDirectories are virtiofs); it is used when the
  # evaluated nixpkgs declares it. An older nixpkgs without it gets the same
  # memfd backend from this module, sized from virtualisation.memorySize.
  # Either way the run script brings the backend and the launcher adds none.
  needsSharedMemory = cfg.workspace.transport == "virtiofs";
  nixpkgsHasSharedMemory = options.virtualisation.qemu ? enableSharedMemory;
  # NixOS's static group with the host's gid, if any (ids.nix; a separate
  # option, so reading it cannot recurse into users.groups). `users` (100)
  # always exists and is reused; defining `dev` with its gid would be a
  # second group with the same gid.
  staticGroup = lib.findFirst (
    name: config.ids.gids.${name} == cfg.user.gid
  ) null (lib.attrNames config.ids.gids);
  groupName = if staticGroup == "users" then "users" else userName;
  # Package names nixpkgs lacks (agent-vm.guest.packages), for the assertion.
  missingPackages = lib.filter (name: !(pkgs ? ${name})) cfg.packages;

  workspaceFileSystem =
    if cfg.workspace.transport == "virtiofs" then
      {
        device = "workspace";
        fsType = "virtiofs";
        options = [ "nofail" ];
      }
    else
      {
        device = "workspace";
        fsType = "9p";
        options = [
          "trans=virtio"
          "version=9p2000.L"
          "msize=${toString cfg.workspace.msize}"
          "nofail"
          "x-systemd.requires=modprobe@9pnet_virtio.service"
        ];
      };

  # The host's own static agent-vm binary, copied into the store, when the
  # VM is built from a binary that Nix did not build.
  hostAgentVm = pkgs.runCommand "agent-vm-host-binary" { meta.mainProgram = "agent-vm"; } ''
    install -D -m 0555 ${
      builtins.path {
        path = /. + cfg.agentVmExecutable;
        name = "agent-vm";
      }
    } $out/bin/agent-vm
  '';

  # The browser a program in the guest starts asks the host to open the URL
  # (`agent-vm open-url`; the host's end is agent-vm's internal/bridge):
  # each name a program tries, and BROWSER, which xdg-open and
  # sensible-browser try first. hiPrio: they win over xdg-utils' own. Only
  # where the guest has agent-vm: services.agent-mcp's package.
  hasAgentVm = mcp.enable || cfg.agentVmExecutable != null;
  browserShim =
    name:
    lib.hiPrio (
      pkgs.writeShellScriptBin name ''
        exec ${lib.getExe' mcp.package "agent-vm"} open-url "$@"
      ''
    );
  browserShims = map browserShim [
    "xdg-open"
    "sensible-browser"
    "x-www-browser"
    "www-browser"
  ];

  installSecrets = ''
    set -euo pipefail
    umask 077
    install -d -m 0700 -o root -g root ${runDir}
    fwcfg=/sys/firmware/qemu_fw_cfg/by_name/${credentialPrefix}

    # install_secret NAME DEST: systemd's imported credential, else the raw
    # fw_cfg file (older systemd, or qemu_fw_cfg loaded after PID 1 looked).
    install_secret() {
      local name=$1 dest=$2 src=""
      if [ -n "''${CREDENTIALS_DIRECTORY:-}" ] && [ -r "$CREDENTIALS_DIRECTORY/$name" ]; then
        src=$CREDENTIALS_DIRECTORY/$name
      else
        [ -d "$fwcfg" ] || modprobe qemu_fw_cfg 2>/dev/null || true
        if [ -r "$fwcfg/$name/raw" ]; then
          src=$fwcfg/$name/raw
        fi
      fi
      if [ -z "$src" ]; then
        echo "agent-vm-secrets: credential $name is missing: start the VM with" \
          "-fw_cfg name=${credentialPrefix}/$name,file=<the VM's secrets dir>/..." >&2
        return 1
      fi
      install -m 0600 -o root -g root "$src" "$dest.tmp"
      if [ ! -s "$dest.tmp" ]; then
        rm -f "$dest.tmp"
        echo "agent-vm-secrets: credential $name is empty" >&2
        return 1
      fi
      mv -f "$dest.tmp" "$dest"
    }

    install_secret ${hostKeyCredential} ${hostKeyPath}
    # Fails on anything but a valid private key, before sshd sees it.
    if ! ssh-keygen -y -f ${hostKeyPath} >${hostKeyPath}.pub; then
      echo "agent-vm-secrets: ${hostKeyCredential} is not an OpenSSH private key" >&2
      exit 1
    fi
    chmod 0644 ${hostKeyPath}.pub
    ${lib.optionalString mcp.enable "install_secret ${tokenCredential} ${tokenPath}"}
    echo "agent-vm-secrets: installed the SSH host key${lib.optionalString mcp.enable " and the MCP token"}"
  '';
in
{
  imports = [
    (modulesPath + "/virtualisation/qemu-vm.nix")
    ./agent-mcp.nix
  ];

  options.agent-vm.guest = {
    enable = lib.mkEnableOption "the agent-vm guest contract (user, sshd, secrets, workspace, ports)";

    name = lib.mkOption {
      type = lib.types.strMatching "[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?";
      example = "feature-x";
      description = ''
        The VM's slug. It becomes the host name and `system.name`, so the
        run script is `bin/run-<name>-vm` and QEMU's `-name` is `<name>`.
      '';
    };

    user = {
      # Any host id but root's (0) and nobody's (65534, 65535): the ids must
      # match the host's for the shared workspace, whatever range its
      # distribution allocates from.
      uid = lib.mkOption {
        type = lib.types.ints.between 1 65533;
        example = 1000;
        description = ''
          uid of `dev`: the uid that owns the workspace on the host, so files
          shared over virtiofs/9p belong to the same user on both sides.
        '';
      };
      gid = lib.mkOption {
        type = lib.types.ints.between 1 65533;
        example = 100;
        description = ''
          gid of `dev`'s primary group (the workspace owner's gid on the host).
          NixOS's own `users` group (gid 100, the primary group of ordinary
          NixOS users) is reused; any other gid gets a group `dev`.
        '';
      };
      authorizedKeys = lib.mkOption {
        type = lib.types.listOf lib.types.str;
        default = [ ];
        example = [ "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA... agent-vm feature-x" ];
        description = "OpenSSH public keys that may log in as `dev` (the VM's client key).";
      };
    };

    ports = {
      ssh = lib.mkOption {
        type = lib.types.port;
        example = 2222;
        description = "Host port on 127.0.0.1 forwarded to the guest's sshd (22).";
      };
      mcp = lib.mkOption {
        type = lib.types.port;
        example = 8001;
        description = "Host port on 127.0.0.1 forwarded to services.agent-mcp.port.";
      };
    };

    resources = {
      memorySize = lib.mkOption {
        type = lib.types.ints.positive;
        default = 4096;
        description = "Guest memory in MiB (virtualisation.memorySize).";
      };
      cores = lib.mkOption {
        type = lib.types.ints.positive;
        default = 4;
        description = "Guest CPUs (virtualisation.cores).";
      };
      diskSize = lib.mkOption {
        type = lib.types.ints.positive;
        default = 20480;
        description = "Size in MiB of the root disk image created on first start (virtualisation.diskSize).";
      };
      graphics = lib.mkOption {
        type = lib.types.bool;
        default = false;
        description = "Whether QEMU opens a display (virtualisation.graphics); agent VMs are headless.";
      };
    };

    workspace = {
      transport = lib.mkOption {
        type = lib.types.enum [
          "virtiofs"
          "9p"
        ];
        default = "virtiofs";
        description = ''
          How the launcher shares the workspace, tag `workspace` either way:
          `virtiofs` (its virtiofsd, a vhost-user-fs-pci device and a shared
          memory backend) or `9p` (`-virtfs`), for hosts without virtiofsd.
          The launcher must pass the matching QEMU arguments.
        '';
      };
      mountPoint = lib.mkOption {
        type = lib.types.strMatching "/[A-Za-z0-9._/-]*";
        default = "/workspace";
        description = "Where the workspace is mounted in the guest.";
      };
      msize = lib.mkOption {
        type = lib.types.ints.positive;
        default = 524288;
        description = "9p maximum message size in bytes (9p transport only).";
      };
    };

    hardening.enable = lib.mkOption {
      type = lib.types.bool;
      default = true;
      description = ''
        Lock kernel module loading after boot and protect the kernel image
        (security.lockKernelModules, security.protectKernelImage). The modules
        the VM needs (qemu_fw_cfg, virtiofs or 9p/9pnet_virtio) are loaded at
        boot; add anything else the agent needs later (fuse, overlay, tun) to
        boot.kernelModules. User namespaces stay allowed: the guest's Nix
        sandbox needs them (nixpkgs asserts it) and services.agent-mcp already
        runs with RestrictNamespaces.
      '';
    };

    agentVmExecutable = lib.mkOption {
      type = lib.types.nullOr (lib.types.strMatching "/.+");
      default = null;
      example = "/home/me/go/bin/agent-vm";
      description = ''
        Absolute path of a statically linked agent-vm binary for the guest's
        architecture, copied into the store and used as
        services.agent-mcp.package. null keeps that option's default
        (`pkgs.agent-vm` from agent-vm's overlay).
      '';
    };

    guidance = lib.mkOption {
      type = lib.types.str;
      default = "";
      description = ''
        A note that tells coding agents where they are (agent-vm writes it:
        the branch, /workspace, sudo, the forwarded ports, not to push),
        linked into the user's home as ~/.claude/CLAUDE.md,
        ~/.codex/AGENTS.md, ~/.gemini/GEMINI.md and ~/AGENTS.md. Empty
        writes none.
      '';
    };

    packages = lib.mkOption {
      type = lib.types.listOf (lib.types.strMatching "[A-Za-z_][A-Za-z0-9_'-]*");
      default = [ ];
      example = [
        "ripgrep"
        "jq"
      ];
      description = ''
        Names of nixpkgs packages (attributes of `pkgs`) installed system-wide
        (environment.systemPackages): the repository's
        .agent-vm/config.toml `packages` and `agent-vm create --packages`.
        A name nixpkgs lacks is refused by an assertion naming it.
      '';
    };

    provision.enable = lib.mkOption {
      type = lib.types.bool;
      default = true;
      description = ''
        Run the repository's .agent-vm/provision.sh (in the workspace, as it is
        then) once, as root, at the first boot of the VM's root disk:
        agent-vm-provision.service, guarded by the stamp
        /var/lib/agent-vm/provision.status, which records how it ended; its
        output is in /var/log/agent-vm-provision.log (`agent-vm logs`).
      '';
    };

    launcher = lib.mkOption {
      type = lib.types.attrs;
      readOnly = true;
      description = ''
        What the launcher must do for this VM, for `nix eval --json` (also
        built as `system.build.agentVmLauncher`, a JSON file): run script,
        memory, workspace transport, who provides the shared memory backend,
        fw_cfg credential names, forwarded ports.
      '';
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion =
          config.users.users.${userName}.openssh.authorizedKeys.keys != [ ]
          || config.users.users.${userName}.openssh.authorizedKeys.keyFiles != [ ];
        message = ''
          agent-vm.guest.user.authorizedKeys is empty, so nobody could log in to the VM.
          Set it to the VM's client public key (agent-vm create writes it to <vm>/ssh/id_ed25519.pub).
        '';
      }
      {
        assertion = staticGroup == null || staticGroup == "users";
        message = ''
          agent-vm.guest.user.gid is ${toString cfg.user.gid}, the gid NixOS gives its own group "${toString staticGroup}".
          The workspace owner's primary group cannot share it; run agent-vm as a user whose primary group is
          users (100) or an ordinary group of its own.
        '';
      }
      {
        assertion = missingPackages == [ ];
        message = ''
          agent-vm.guest.packages names ${lib.concatMapStringsSep ", " (n: "\"${n}\"") missingPackages}, which this nixpkgs does not have (pkgs.<name>).
          Fix the name in the repository's .agent-vm/config.toml or in create --packages (nixpkgs attribute names, e.g. "ripgrep").
        '';
      }
      {
        assertion = cfg.ports.ssh != cfg.ports.mcp;
        message = ''
          agent-vm.guest.ports.ssh and agent-vm.guest.ports.mcp are both ${toString cfg.ports.ssh}.
          Give the VM two different host ports (agent-vm create allocates them).
        '';
      }
      {
        assertion = config.services.openssh.settings.PasswordAuthentication == false;
        message = ''
          services.openssh.settings.PasswordAuthentication is enabled in an agent-vm guest, which is key-only.
          Remove that setting from your module; log in with `agent-vm shell` or `ssh agent-vm-<branch>`.
        '';
      }
      {
        assertion = config.services.openssh.settings.PermitRootLogin == "no";
        message = ''
          services.openssh.settings.PermitRootLogin is "${toString config.services.openssh.settings.PermitRootLogin}" in an agent-vm guest, which allows no root login.
          Remove that setting from your module; `dev` has passwordless sudo.
        '';
      }
    ]
    ++ lib.imap1 (i: rule: {
      assertion = rule.from != "host" || rule.host.address == "127.0.0.1";
      message = ''
        virtualisation.forwardPorts entry ${toString i} forwards host port ${toString rule.host.port} on address "${rule.host.address}", reachable from other machines.
        Set host.address = "127.0.0.1" in that entry.
      '';
    }) config.virtualisation.forwardPorts;

    agent-vm.guest.launcher = {
      inherit (config.system) name;
      runScript = "bin/run-${config.system.name}-vm";
      inherit (config.virtualisation) memorySize cores;
      workspace = {
        inherit (cfg.workspace) transport mountPoint;
        tag = "workspace";
      };
      # Who backs guest RAM with shared memory, for information: the run
      # script does either way ("qemu-vm": enableSharedMemory; "module":
      # this module's memfd backend), "none" for 9p. The launcher adds none.
      sharedMemory =
        if !needsSharedMemory then
          "none"
        else if nixpkgsHasSharedMemory then
          "qemu-vm"
        else
          "module";
      fwCfg = {
        sshHostKey = "${credentialPrefix}/${hostKeyCredential}";
        mcpToken = "${credentialPrefix}/${tokenCredential}";
      };
      ports = {
        ssh = {
          host = cfg.ports.ssh;
          guest = 22;
        };
        mcp = {
          host = cfg.ports.mcp;
          guest = mcp.port;
        };
      };
    };
    system.build.agentVmLauncher = pkgs.writeText "agent-vm-launcher.json" (
      builtins.toJSON cfg.launcher
    );

    # The run script is bin/run-<name>-vm whatever the user's module does to
    # the host name.
    system.name = cfg.name;
    networking.hostName = lib.mkDefault cfg.name;
    system.stateVersion = lib.mkDefault "26.05";
    # The NixOS manual is the slowest part of a fresh VM build and unused here.
    documentation.nixos.enable = lib.mkDefault false;

    virtualisation = {
      memorySize = lib.mkDefault cfg.resources.memorySize;
      qemu =
        if nixpkgsHasSharedMemory then
          { enableSharedMemory = lib.mkIf needsSharedMemory true; }
        else
          {
            options = lib.mkIf needsSharedMemory [
              "-object memory-backend-memfd,id=agentvm-mem,size=${toString config.virtualisation.memorySize}M,share=on"
              "-numa node,memdev=agentvm-mem"
            ];
          };
      cores = lib.mkDefault cfg.resources.cores;
      diskSize = lib.mkDefault cfg.resources.diskSize;
      graphics = lib.mkDefault cfg.resources.graphics;

      forwardPorts = [
        {
          from = "host";
          host.address = "127.0.0.1";
          host.port = cfg.ports.ssh;
          guest.port = 22;
        }
        {
          from = "host";
          host.address = "127.0.0.1";
          host.port = cfg.ports.mcp;
          guest.port = mcp.port;
        }
      ];

      # Not `fileSystems`: qemu-vm.nix overrides that with this (mkVMOverride).
      # nofail: a VM started without the share still boots and can be
      # inspected; agent-mcp (RequiresMountsFor) stays down instead.
      fileSystems.${cfg.workspace.mountPoint} = workspaceFileSystem;
    };

    # Loaded at boot, before hardening locks module loading.
    boot.kernelModules = [
      "qemu_fw_cfg"
    ]
    ++ (
      if cfg.workspace.transport == "virtiofs" then
        [ "virtiofs" ]
      else
        [
          "9p"
          "9pnet_virtio"
        ]
    );

    security.lockKernelModules = lib.mkIf cfg.hardening.enable (lib.mkDefault true);
    security.protectKernelImage = lib.mkIf cfg.hardening.enable (lib.mkDefault true);

    users.mutableUsers = lib.mkDefault false;
    users.groups = lib.mkIf (groupName == userName) { ${userName}.gid = cfg.user.gid; };
    users.users.${userName} = {
      isNormalUser = true;
      inherit (cfg.user) uid;
      group = groupName;
      extraGroups = [ "wheel" ];
      openssh.authorizedKeys.keys = cfg.user.authorizedKeys;
      # The agent's login shell sees the same tools as its MCP servers.
      packages = lib.optionals mcp.enable mcp.runtimePackages;
    };
    security.sudo.wheelNeedsPassword = false;
    # What the agent works with, as in the Debian image (internal/image):
    # agent sessions run in tmux (internal/session), the agent CLIs come
    # from npm, and the tools agents reach for first; then the packages
    # the repository and create --packages ask for.
    environment.systemPackages = with pkgs; [
      git curl tmux nodejs python3 gcc gnumake ripgrep jq fd gh less unzip
    ]
    ++ map (name: pkgs.${name}) (lib.filter (name: pkgs ? ${name}) cfg.packages)
    ++ lib.optionals hasAgentVm browserShims;
    # sessionVariables: SSH sessions get it through pam_env, not only
    # login shells.
    environment.sessionVariables = lib.mkIf hasAgentVm {
      BROWSER = lib.mkDefault (lib.getExe' (builtins.head browserShims) "xdg-open");
    };

    # The repository's provisioning, once per root disk (the stamp is the
    # status file on that disk); the script is read from the workspace when
    # it runs, never copied into the store.
    systemd.services.agent-vm-provision = lib.mkIf cfg.provision.enable {
      description = "agent-vm: run the repository's .agent-vm/provision.sh once (first boot)";
      wantedBy = [ "multi-user.target" ];
      wants = [ "network-online.target" ];
      after = [
        "network-online.target"
        "agent-vm-secrets.service"
      ];
      unitConfig = {
        RequiresMountsFor = cfg.workspace.mountPoint;
        ConditionPathExists = "!/var/lib/agent-vm/provision.status";
      };
      # The user's script sees the system's programs, its packages included.
      path = [
        "/run/wrappers"
        "/run/current-system/sw"
      ];
      serviceConfig = {
        Type = "oneshot";
        RemainAfterExit = true;
        ExecStart = "${pkgs.runtimeShell} ${./provision.sh}";
        StandardOutput = "journal+console";
        StandardError = "journal+console";
        TimeoutStartSec = "infinity";
      };
    };

    # The guidance note: the directories are the user's (agents keep their
    # own files there), the notes are links into the store.
    systemd.tmpfiles.rules = lib.mkIf (cfg.guidance != "") (
      let
        home = config.users.users.${userName}.home;
        note = pkgs.writeText "agent-vm-guidance.md" cfg.guidance;
        files = [ ".claude/CLAUDE.md" ".codex/AGENTS.md" ".gemini/GEMINI.md" "AGENTS.md" ];
        dirs = lib.unique (lib.filter (d: d != ".") (map builtins.dirOf files));
      in
      map (d: "d ${home}/${d} 0755 ${userName} ${groupName} -") dirs
      ++ map (f: "L+ ${home}/${f} - - - - ${note}") files
    );

    services.openssh = {
      enable = true;
      startWhenNeeded = false;
      settings = {
        PasswordAuthentication = false;
        KbdInteractiveAuthentication = false;
        PermitRootLogin = "no";
        PubkeyAuthentication = true;
        AuthenticationMethods = "publickey";
        AllowUsers = [ userName ];
        # A connection whose client is gone (one from before a suspend)
        # ends within two minutes, not at TCP keepalive's two hours.
        ClientAliveInterval = 30;
        ClientAliveCountMax = 4;
      };
      # The only host key is the one agent-vm pinned at create time.
      hostKeys = lib.mkForce [
        {
          path = hostKeyPath;
          type = "ed25519";
        }
      ];
    };
    # Never generate a host key: a missing credential must keep sshd down,
    # not give it a key nobody pinned.
    systemd.services.sshd-keygen.enable = false;
    systemd.services.sshd = {
      requires = [ "agent-vm-secrets.service" ];
      after = [ "agent-vm-secrets.service" ];
    };

    # The guest reaches the network only through agent-vm's egress proxy
    # (the host starts QEMU with restrict=on and the proxy at 10.0.2.100):
    # sessions and nix-daemon get it from networking.proxy, curl, git, npm
    # and pip read the same variables, and agent-mcp's servers get it too
    # (below).
    networking.proxy = {
      default = lib.mkDefault "http://10.0.2.100:3128";
      noProxy = lib.mkDefault "localhost,127.0.0.1,::1,10.0.2.100";
    };

    networking.firewall = {
      enable = true;
      allowedTCPPorts = [
        22
        mcp.port
      ];
    };

    systemd.services.agent-vm-secrets = {
      description = "Install agent-vm's SSH host key and MCP token from QEMU fw_cfg";
      wantedBy = [ "multi-user.target" ];
      before = [
        "sshd.service"
        "sshd-keygen.service"
        "agent-mcp.service"
      ];
      after = [ "systemd-modules-load.service" ];
      path = [
        pkgs.coreutils
        pkgs.kmod
        config.programs.ssh.package
      ];
      serviceConfig = {
        Type = "oneshot";
        RemainAfterExit = true;
        ImportCredential = [
          hostKeyCredential
          tokenCredential
        ];
        PrivateNetwork = true;
        NoNewPrivileges = true;
      };
      script = installSecrets;
    };

    services.agent-mcp = {
      enable = lib.mkDefault true;
      package = lib.mkIf (cfg.agentVmExecutable != null) hostAgentVm;
      user = userName;
      group = groupName;
      workspaceDir = cfg.workspace.mountPoint;
      configFile = lib.mkDefault "${cfg.workspace.mountPoint}/.mcp.json";
      tokenFile = tokenPath;
      listenAddress = lib.mkDefault "0.0.0.0";
      port = lib.mkDefault 8000;
    };
    systemd.services.agent-mcp = lib.mkIf mcp.enable {
      requires = [ "agent-vm-secrets.service" ];
      after = [ "agent-vm-secrets.service" ];
      environment = config.networking.proxy.envVars;
    };
  };
}
