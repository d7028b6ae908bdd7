# The flake's checks: the packages build, the modules evaluate to what the
# guest contract (docs/design.md) says, and a NixOS VM test boots a guest
# with them. None of this runs without nixpkgs; `nix flake check` runs it on
# a Linux host with Nix.
{
  self,
  nixpkgs,
  pkgs,
}:

let
  inherit (nixpkgs) lib;
  system = pkgs.stdenv.hostPlatform.system;
  agent-vm = self.packages.${system}.agent-vm;
  # What the guest runs: the binary without the host tools' wrapper.
  guest-agent-vm = agent-vm.unwrapped;

  testData = {
    enable = true;
    name = "feature-x";
    user = {
      uid = 1000;
      gid = 1000;
      authorizedKeys = [ "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMWSYBq/6LfKB3tJfpKtcruPcRm7ZADqcMcUr4gI7mSR test" ];
    };
    ports = {
      ssh = 2222;
      mcp = 8001;
    };
  };

  evalGuest =
    extra:
    nixpkgs.lib.nixosSystem {
      modules = [
        self.nixosModules.guest
        {
          nixpkgs.hostPlatform = system;
          agent-vm.guest = testData;
          services.agent-mcp.package = guest-agent-vm;
          services.agent-mcp.allowOrigin = [ "https://claude.ai" ];
        }
        extra
      ];
    };

  # Forces the whole system, assertions included, without building it.
  evaluates = sys: (builtins.tryEval sys.config.system.build.vm.drvPath).success;

  expect =
    what: got: want:
    {
      inherit what got want;
      ok = got == want;
    };

  virtiofs = (evalGuest { }).config;
  # An ordinary NixOS user's primary group: `users`, gid 100.
  usersGid = (evalGuest { agent-vm.guest.user.gid = lib.mkForce 100; }).config;
  ninep = (evalGuest { agent-vm.guest.workspace.transport = "9p"; }).config;
  svc = virtiofs.systemd.services.agent-mcp;
  sc = svc.serviceConfig;

  expectations = [
    (expect "agent-mcp ExecStart" sc.ExecStart (
      lib.escapeShellArgs [
        (lib.getExe' guest-agent-vm "agent-vm")
        "mcp-proxy"
        "--config"
        "/run/agent-mcp/mcp.json"
        "--listen"
        "0.0.0.0:8000"
        "--token-file"
        "%d/mcp-token"
        "--health-path"
        "/health"
        "--allow-origin"
        "https://claude.ai"
      ]
    ))
    (expect "agent-mcp runs as dev" [ sc.User sc.Group ] [ "dev" "dev" ])
    (expect "agent-mcp hardening"
      {
        inherit (sc)
          NoNewPrivileges
          ProtectSystem
          ProtectHome
          ProtectKernelTunables
          ProtectKernelModules
          ProtectKernelLogs
          ProtectControlGroups
          RestrictNamespaces
          RestrictSUIDSGID
          LockPersonality
          PrivateTmp
          PrivateDevices
          ReadWritePaths
          Restart
          KillMode
          TimeoutStopSec
          ;
      }
      {
        NoNewPrivileges = true;
        ProtectSystem = "strict";
        ProtectHome = true;
        ProtectKernelTunables = true;
        ProtectKernelModules = true;
        ProtectKernelLogs = true;
        ProtectControlGroups = true;
        RestrictNamespaces = true;
        RestrictSUIDSGID = true;
        LockPersonality = true;
        PrivateTmp = true;
        PrivateDevices = true;
        ReadWritePaths = [ "/workspace" ];
        Restart = "always";
        KillMode = "mixed";
        TimeoutStopSec = "30s";
      }
    )
    (expect "start limit in [Unit]" {
      inherit (svc.unitConfig) StartLimitIntervalSec StartLimitBurst;
      inService = sc ? StartLimitIntervalSec || sc ? StartLimitBurst || sc ? StartLimitInterval;
    } {
      StartLimitIntervalSec = 300;
      StartLimitBurst = 5;
      inService = false;
    })
    (expect "token by credential" sc.LoadCredential [ "mcp-token:/run/agent-vm/mcp-token" ])
    (expect "health check after start" (builtins.length sc.ExecStartPost) 1)
    (expect "agent-mcp waits for the secrets" (builtins.elem "agent-vm-secrets.service" svc.requires) true)
    (expect "sshd waits for the secrets" (builtins.elem "agent-vm-secrets.service"
      virtiofs.systemd.services.sshd.requires
    ) true)
    (expect "sshd key-only, no root"
      {
        inherit (virtiofs.services.openssh.settings) PasswordAuthentication PermitRootLogin;
        hostKeys = map (k: k.path) virtiofs.services.openssh.hostKeys;
        keygen = virtiofs.systemd.services.sshd-keygen.enable;
      }
      {
        PasswordAuthentication = false;
        PermitRootLogin = "no";
        hostKeys = [ "/run/agent-vm/ssh_host_ed25519_key" ];
        keygen = false;
      }
    )
    (expect "secrets from fw_cfg credentials"
      virtiofs.systemd.services.agent-vm-secrets.serviceConfig.ImportCredential
      [
        "agent-vm.ssh-host-key"
        "agent-vm.mcp-token"
      ]
    )
    (expect "forwards on 127.0.0.1 only"
      (map (r: "${r.host.address}:${toString r.host.port}->${toString r.guest.port}") virtiofs.virtualisation.forwardPorts)
      [
        "127.0.0.1:2222->22"
        "127.0.0.1:8001->8000"
      ]
    )
    (expect "firewall" (lib.sort lib.lessThan (lib.unique virtiofs.networking.firewall.allowedTCPPorts)) [
      22
      8000
    ])
    (expect "virtiofs workspace survives qemu-vm's mkVMOverride"
      {
        inherit (virtiofs.fileSystems."/workspace") device fsType;
        nofail = builtins.elem "nofail" virtiofs.fileSystems."/workspace".options;
      }
      {
        device = "workspace";
        fsType = "virtiofs";
        nofail = true;
      }
    )
    (expect "9p workspace" {
      inherit (ninep.fileSystems."/workspace") device fsType;
      modules = builtins.all (m: builtins.elem m ninep.boot.kernelModules) [
        "9p"
        "9pnet_virtio"
        "qemu_fw_cfg"
      ];
      memory = ninep.agent-vm.guest.launcher.sharedMemory;
    } {
      device = "workspace";
      fsType = "9p";
      modules = true;
      memory = "none";
    })
    (expect "modules loaded before the lock"
      {
        lock = virtiofs.security.lockKernelModules;
        modules = builtins.all (m: builtins.elem m virtiofs.boot.kernelModules) [
          "virtiofs"
          "qemu_fw_cfg"
        ];
      }
      {
        lock = true;
        modules = true;
      }
    )
    (expect "user dev"
      {
        inherit (virtiofs.users.users.dev) uid group;
        gid = virtiofs.users.groups.dev.gid;
        wheel = builtins.elem "wheel" virtiofs.users.users.dev.extraGroups;
        sudo = virtiofs.security.sudo.wheelNeedsPassword;
      }
      {
        uid = 1000;
        group = "dev";
        gid = 1000;
        wheel = true;
        sudo = false;
      }
    )
    (expect "gid 100 reuses NixOS's users group"
      {
        group = usersGid.users.users.dev.group;
        mcpGroup = usersGid.systemd.services.agent-mcp.serviceConfig.Group;
        devGroup = usersGid.users.groups ? dev;
        evaluates = evaluates (evalGuest { agent-vm.guest.user.gid = lib.mkForce 100; });
      }
      {
        group = "users";
        mcpGroup = "users";
        devGroup = false;
        evaluates = true;
      }
    )
    (expect "resources" {
      inherit (virtiofs.virtualisation)
        memorySize
        cores
        diskSize
        graphics
        ;
    } {
      memorySize = 4096;
      cores = 4;
      diskSize = 20480;
      graphics = false;
    })
    (expect "launcher contract" {
      inherit (virtiofs.agent-vm.guest.launcher) runScript sharedMemory;
      # nixpkgs' own option backs RAM with shared memory for virtiofs.
      enableSharedMemory = virtiofs.virtualisation.qemu.enableSharedMemory or null;
    } {
      runScript = "bin/run-feature-x-vm";
      sharedMemory = "qemu-vm";
      enableSharedMemory = true;
    })
    (expect "guest evaluates" (evaluates (evalGuest { })) true)
    (expect "password login is refused at evaluation" (evaluates (evalGuest {
      services.openssh.settings.PasswordAuthentication = lib.mkForce true;
    })) false)
    (expect "a forward on all addresses is refused" (evaluates (evalGuest {
      virtualisation.forwardPorts = [
        {
          from = "host";
          host.port = 9999;
          guest.port = 9999;
        }
      ];
    })) false)
    (expect "agent-mcp as root is refused" (evaluates (evalGuest {
      services.agent-mcp.user = lib.mkForce "root";
    })) false)
  ];

  failures = builtins.filter (e: !e.ok) expectations;

  moduleEval =
    if failures == [ ] then
      pkgs.runCommand "agent-vm-module-eval" { } ''
        echo "${toString (builtins.length expectations)} module expectations hold" > $out
      ''
    else
      throw (
        "agent-vm module evaluation:\n"
        + lib.concatMapStrings (
          e: "  ${e.what}: got ${builtins.toJSON e.got}, want ${builtins.toJSON e.want}\n"
        ) failures
      );

  # Throwaway keys for the VM test only; real VMs never put keys in the store.
  testKeys = pkgs.runCommand "agent-vm-test-keys" { nativeBuildInputs = [ pkgs.openssh ]; } ''
    mkdir $out
    ssh-keygen -q -t ed25519 -N "" -C host -f $out/host
    ssh-keygen -q -t ed25519 -N "" -C client -f $out/client
    ssh-keygen -l -f $out/host.pub | cut -d' ' -f2 > $out/host.fp
    echo "127.0.0.1 $(cut -d' ' -f1,2 $out/host.pub)" > $out/known_hosts
    printf 'test-token-not-secret' > $out/token
  '';

  vmTest = pkgs.testers.runNixOSTest {
    name = "agent-vm-guest";
    nodes.machine = {
      imports = [ self.nixosModules.guest ];
      agent-vm.guest = {
        enable = true;
        name = "machine";
        user = {
          uid = 1000;
          gid = 1000;
        };
        ports = {
          ssh = 2222;
          mcp = 8001;
        };
        resources = {
          memorySize = 1536;
          cores = 2;
        };
        workspace.transport = "9p";
      };
      # A file, because reading the generated key into a string would need
      # import-from-derivation.
      users.users.dev.openssh.authorizedKeys.keyFiles = [ "${testKeys}/client.pub" ];
      services.agent-mcp.package = guest-agent-vm;
      virtualisation.qemu.options = [
        # The launcher's job in real VMs: credentials and the workspace share.
        "-fw_cfg name=opt/io.systemd.credentials/agent-vm.ssh-host-key,file=${testKeys}/host"
        "-fw_cfg name=opt/io.systemd.credentials/agent-vm.mcp-token,file=${testKeys}/token"
        "-virtfs local,path=\"$TMPDIR\"/xchg,security_model=none,mount_tag=workspace"
      ];
      environment.systemPackages = [ pkgs.curl ];
    };

    testScript = ''
      machine.wait_for_unit("agent-vm-secrets.service")
      machine.wait_for_unit("sshd.service")
      machine.wait_for_unit("agent-mcp.service")

      with subtest("the host key is the one passed through fw_cfg, root-only"):
          want = open("${testKeys}/host.fp").read().strip()
          got = machine.succeed("ssh-keygen -l -f /run/agent-vm/ssh_host_ed25519_key.pub").split()[1]
          assert got == want, f"host key {got}, want {want}"
          machine.succeed("test \"$(stat -c %a:%U /run/agent-vm/ssh_host_ed25519_key)\" = 600:root")
          machine.succeed("test \"$(stat -c %a:%U /run/agent-vm/mcp-token)\" = 600:root")

      with subtest("health answers without a token, MCP wants one"):
          machine.succeed("curl -fsS http://127.0.0.1:8000/health")
          code = machine.succeed(
              "curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' "
              "-d '{}' http://127.0.0.1:8000/mcp"
          ).strip()
          assert code == "401", f"unauthenticated /mcp answered {code}, want 401"

      with subtest("sshd refuses passwords and root"):
          machine.succeed("sshd -T | grep -qx 'passwordauthentication no'")
          machine.succeed("sshd -T | grep -qx 'permitrootlogin no'")
          out = machine.fail(
              "ssh -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
              "-o PubkeyAuthentication=no -o PreferredAuthentications=password,keyboard-interactive "
              "dev@127.0.0.1 true 2>&1"
          )
          assert "Permission denied (publickey)" in out, out

      with subtest("dev logs in with its key against the pinned host key"):
          machine.succeed("install -m 0600 ${testKeys}/client /root/client")
          uid = machine.succeed(
              "ssh -i /root/client -o StrictHostKeyChecking=yes "
              "-o UserKnownHostsFile=${testKeys}/known_hosts dev@127.0.0.1 id -u"
          ).strip()
          assert uid == "1000", f"dev has uid {uid}"
          machine.succeed("su - dev -c 'sudo -n true'")

      with subtest("workspace over 9p"):
          fstype = machine.succeed("findmnt -n -o FSTYPE /workspace").strip()
          assert fstype == "9p", f"/workspace is {fstype}"
          machine.succeed("echo probe > /workspace/probe && grep -qx probe /workspace/probe")

      with subtest("module loading is locked after boot"):
          machine.wait_for_unit("disable-kernel-module-loading.service")
          machine.succeed("test \"$(cat /proc/sys/kernel/modules_disabled)\" = 1")
    '';
  };
in
{
  inherit agent-vm;
  integration-test = self.packages.${system}.integration-test;
  module-eval = moduleEval;
  vm-test = vmTest;
}
