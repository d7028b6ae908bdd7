# services.agent-mcp: stdio MCP servers behind `agent-vm mcp-proxy`, as a
# hardened systemd service.
#
# Works on any NixOS system; modules/guest.nix enables it inside agent-vm's
# per-branch VMs. The unit runs
#
#   agent-vm mcp-proxy --config /run/agent-mcp/mcp.json
#     --listen <listenAddress>:<port> --token-file <credentials dir>/mcp-token
#     --health-path <healthPath> [--allow-origin <origin>]...
#
# /run/agent-mcp/mcp.json is a symlink made before every start: to
# `configFile` when that file exists and is readable (e.g. the workspace's
# .mcp.json), else to the JSON rendered from `servers`. Both use Claude's
# `{"mcpServers": {NAME: {"command", "args", "env", "cwd"}}}` shape.
#
# The bearer token never enters the Nix store: `tokenFile` names a file on the
# running system, handed to the unit with systemd's LoadCredential= (so the
# service user can read its private copy while the original stays root-only).
# Secrets for the servers themselves go in `environmentFile`, not in `servers`
# (everything in `servers` lands in the world-readable store).
{
  config,
  lib,
  pkgs,
  ...
}:

let
  cfg = config.services.agent-mcp;

  defaultName = "agent-mcp";

  serverModule =
    { name, ... }:
    {
      options = {
        command = lib.mkOption {
          type = lib.types.str;
          example = "npx";
          description = ''
            Program that starts the stdio MCP server `${name}`: a name looked
            up in the service's PATH (see `path` and `shell`) or an absolute
            path.
          '';
        };
        args = lib.mkOption {
          type = lib.types.listOf lib.types.str;
          default = [ ];
          example = [
            "-y"
            "@modelcontextprotocol/server-filesystem"
            "/workspace"
          ];
          description = "Arguments passed to `command`.";
        };
        env = lib.mkOption {
          type = lib.types.attrsOf lib.types.str;
          default = { };
          example = {
            LOG_LEVEL = "info";
          };
          description = ''
            Extra environment for this server only. The values are stored in
            the world-readable Nix store: put secrets in
            {option}`services.agent-mcp.environmentFile` instead.
          '';
        };
        cwd = lib.mkOption {
          type = lib.types.nullOr lib.types.str;
          default = null;
          example = "/workspace";
          description = "Working directory of this server; null means the service's (`workspaceDir`).";
        };
      };
    };

  # Claude's mcpServers shape; cwd only where set, so the file stays valid for
  # clients that do not know the key.
  renderedConfig = pkgs.writeText "agent-mcp-servers.json" (
    builtins.toJSON {
      mcpServers = lib.mapAttrs (
        _: s:
        {
          inherit (s) command args env;
        }
        // lib.optionalAttrs (s.cwd != null) { inherit (s) cwd; }
      ) cfg.servers;
    }
  );

  isIPv6 = lib.hasInfix ":" cfg.listenAddress;
  listen =
    if isIPv6 then "[${cfg.listenAddress}]:${toString cfg.port}" else "${cfg.listenAddress}:${toString cfg.port}";
  # Where the health check knocks: loopback when listening on a wildcard.
  healthHost =
    if cfg.listenAddress == "0.0.0.0" then
      "127.0.0.1"
    else if cfg.listenAddress == "::" then
      "[::1]"
    else if isIPv6 then
      "[${cfg.listenAddress}]"
    else
      cfg.listenAddress;
  healthURL = "http://${healthHost}:${toString cfg.port}${cfg.healthPath}";

  runtimeConfig = "/run/agent-mcp/mcp.json";

  # %d is systemd's specifier for $CREDENTIALS_DIRECTORY.
  proxyArgs = [
    "mcp-proxy"
    "--config"
    runtimeConfig
    "--listen"
    listen
  ]
  ++ lib.optionals (cfg.tokenFile != null) [
    "--token-file"
    "%d/mcp-token"
  ]
  ++ [
    "--health-path"
    cfg.healthPath
  ]
  ++ lib.concatMap (o: [
    "--allow-origin"
    o
  ]) cfg.allowOrigin;

  selectConfig = pkgs.writeShellScript "agent-mcp-select-config" ''
    set -eu
    if [ ! -d ${lib.escapeShellArg cfg.workspaceDir} ]; then
      echo "agent-mcp: workspace ${cfg.workspaceDir} is missing (services.agent-mcp.workspaceDir)" >&2
      exit 1
    fi
    config=${renderedConfig}
    ${lib.optionalString (cfg.configFile != null) ''
      if [ -r ${lib.escapeShellArg cfg.configFile} ]; then
        config=${lib.escapeShellArg cfg.configFile}
      fi
    ''}
    echo "agent-mcp: using MCP server config $config"
    ln -sfn "$config" ${runtimeConfig}
  '';

  healthCheck = pkgs.writeShellScript "agent-mcp-health" ''
    # Bounded: gives up after ${toString cfg.healthTimeout}s, which fails the start.
    deadline=$((SECONDS + ${toString cfg.healthTimeout}))
    until ${lib.getExe pkgs.curl} --silent --fail --max-time 2 --output /dev/null ${lib.escapeShellArg healthURL}; do
      if [ "$SECONDS" -ge "$deadline" ]; then
        echo "agent-mcp: ${healthURL} did not answer within ${toString cfg.healthTimeout}s" >&2
        exit 1
      fi
      sleep 1
    done
    echo "agent-mcp: ready (${healthURL} answered)"
  '';

  shellInputs =
    if cfg.shell == null then
      [ ]
    else
      (cfg.shell.nativeBuildInputs or [ ])
      ++ (cfg.shell.buildInputs or [ ])
      ++ (cfg.shell.propagatedBuildInputs or [ ])
      ++ (cfg.shell.propagatedNativeBuildInputs or [ ]);
in
{
  options.services.agent-mcp = {
    enable = lib.mkEnableOption "stdio MCP servers served over HTTP by `agent-vm mcp-proxy`";

    package = lib.mkOption {
      type = lib.types.package;
      default =
        let
          agent-vm =
            pkgs.agent-vm or (throw ''
              services.agent-mcp.package: pkgs.agent-vm does not exist.
              Add agent-vm's overlay (its flake's overlays.default) to nixpkgs.overlays,
              or set services.agent-mcp.package to an agent-vm package.'');
        in
        agent-vm.unwrapped or agent-vm;
      defaultText = lib.literalExpression "pkgs.agent-vm.unwrapped";
      description = ''
        The agent-vm package whose `agent-vm mcp-proxy` serves the MCP servers.
        The default comes from agent-vm's overlay (`overlays.default` of its
        flake), which adds `pkgs.agent-vm`; its `unwrapped` binary, without the
        host tools (QEMU, virtiofsd) the wrapper puts on PATH.
      '';
    };

    servers = lib.mkOption {
      type = lib.types.attrsOf (lib.types.submodule serverModule);
      default = { };
      example = lib.literalExpression ''
        {
          filesystem = {
            command = "npx";
            args = [ "-y" "@modelcontextprotocol/server-filesystem" "/workspace" ];
          };
        }
      '';
      description = ''
        Named stdio MCP servers, rendered into a JSON file in Claude's
        `mcpServers` shape and served by the proxy. Used unless `configFile`
        exists when the service starts.
      '';
    };

    configFile = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = null;
      example = "/workspace/.mcp.json";
      description = ''
        A file on the running system in Claude's `mcpServers` shape. When it
        exists and is readable as the service starts, the proxy uses it
        instead of `servers`; it is looked up again at every (re)start.
      '';
    };

    shell = lib.mkOption {
      type = lib.types.nullOr lib.types.package;
      default = null;
      example = lib.literalExpression "self.devShells.\${pkgs.stdenv.hostPlatform.system}.default";
      description = ''
        A development shell (e.g. made with `mkShell`) whose inputs
        (`nativeBuildInputs`, `buildInputs` and their propagated variants) go on
        the service's PATH, so the servers find the project's tools. Its
        shellHook is not run.
      '';
    };

    path = lib.mkOption {
      type = lib.types.listOf lib.types.package;
      default = [ ];
      example = lib.literalExpression "[ pkgs.nodejs pkgs.uv ]";
      description = "More packages whose bin/ directories go on the service's PATH.";
    };

    user = lib.mkOption {
      type = lib.types.str;
      default = defaultName;
      example = "dev";
      description = ''
        User the proxy and its servers run as. The default user is created as
        a system user; any other must exist already.
      '';
    };

    group = lib.mkOption {
      type = lib.types.str;
      default = defaultName;
      example = "dev";
      description = "Group the service runs as; the default group is created.";
    };

    workspaceDir = lib.mkOption {
      type = lib.types.str;
      default = "/workspace";
      description = ''
        The project directory: the service's working directory and the only
        path outside its state and cache directories it may write to.
      '';
    };

    listenAddress = lib.mkOption {
      # An IP literal: it is spliced into the unit's command line.
      type = lib.types.strMatching "[0-9A-Fa-f.:]+";
      default = "0.0.0.0";
      example = "127.0.0.1";
      description = ''
        IPv4 or IPv6 address the proxy listens on. Inside an agent-vm guest this is the
        wildcard, and the host forwards only 127.0.0.1:<MCP port> to it.
      '';
    };

    port = lib.mkOption {
      type = lib.types.port;
      default = 8000;
      description = "TCP port the proxy listens on.";
    };

    openFirewall = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = "Whether to open `port` in the firewall.";
    };

    allowOrigin = lib.mkOption {
      # http(s)://host[:port], nothing systemd or a shell would interpret.
      # The same text as modules.OriginPattern in origin.go (tests compare).
      type = lib.types.listOf (lib.types.strMatching "https?://([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|[[][0-9A-Fa-f:.]+[]])(:[0-9]{1,5})?");
      default = [ ];
      example = [ "https://claude.ai" ];
      description = ''
        Browser origins allowed to call the proxy (one `--allow-origin` flag
        each). Empty means no cross-origin browser access.
      '';
    };

    tokenFile = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = "/run/agent-vm/mcp-token";
      description = ''
        File on the running system holding the bearer token clients must
        send. It is passed to the unit with `LoadCredential=mcp-token:<file>`
        and to the proxy as `--token-file %d/mcp-token` (`%d` is
        `$CREDENTIALS_DIRECTORY`), so it may stay readable by root only. It
        must not be in the Nix store. null runs the proxy without a token:
        anyone who reaches the port can use the servers.
      '';
    };

    healthPath = lib.mkOption {
      type = lib.types.strMatching "/[A-Za-z0-9._~/-]*";
      default = "/health";
      description = "Path of the proxy's unauthenticated health endpoint.";
    };

    healthTimeout = lib.mkOption {
      type = lib.types.ints.positive;
      default = 120;
      description = ''
        Seconds the start waits for the health endpoint to answer before it
        counts as failed.
      '';
    };

    extraEnvironment = lib.mkOption {
      type = lib.types.attrsOf lib.types.str;
      default = { };
      example = {
        NODE_OPTIONS = "--max-old-space-size=2048";
      };
      description = ''
        Extra environment for the proxy and its servers. Stored in the Nix
        store: no secrets here, use `environmentFile`.
      '';
    };

    runtimePackages = lib.mkOption {
      type = lib.types.listOf lib.types.package;
      readOnly = true;
      default = [ ];
      description = ''
        What goes on the service's PATH: `package`, `path` and the inputs of
        `shell`. Read-only; the agent-vm guest also gives these to its login
        user.
      '';
    };

    environmentFile = lib.mkOption {
      type = lib.types.nullOr lib.types.str;
      default = null;
      example = "/run/secrets/agent-mcp.env";
      description = ''
        A file on the running system with KEY=value lines (systemd's
        `EnvironmentFile=`), for API keys and other secrets the servers need.
        Never a store path.
      '';
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = cfg.user != "root";
        message = ''
          services.agent-mcp.user is "root": MCP servers run agent-driven code and must not run as root.
          Set services.agent-mcp.user to an unprivileged user (e.g. "dev").
        '';
      }
      {
        assertion = cfg.tokenFile == null || !lib.hasPrefix builtins.storeDir cfg.tokenFile;
        message = ''
          services.agent-mcp.tokenFile (${toString cfg.tokenFile}) is in the Nix store, which every local user can read.
          Point it at a root-only file on the running system, e.g. /run/agent-vm/mcp-token.
        '';
      }
      {
        assertion = cfg.environmentFile == null || !lib.hasPrefix builtins.storeDir cfg.environmentFile;
        message = ''
          services.agent-mcp.environmentFile (${toString cfg.environmentFile}) is in the Nix store, which every local user can read.
          Point it at a file on the running system (e.g. under /run/secrets).
        '';
      }
      {
        assertion = lib.hasPrefix "/" cfg.workspaceDir;
        message = ''
          services.agent-mcp.workspaceDir ("${cfg.workspaceDir}") is not an absolute path.
          Set it to the project directory, e.g. "/workspace".
        '';
      }
    ];

    warnings = lib.optional (cfg.tokenFile == null) ''
      services.agent-mcp.tokenFile is null: the MCP proxy on port ${toString cfg.port} accepts requests without a token.
      Set services.agent-mcp.tokenFile unless only trusted local users can reach that port.
    '';

    services.agent-mcp.runtimePackages = [ cfg.package ] ++ cfg.path ++ shellInputs;

    networking.firewall.allowedTCPPorts = lib.mkIf cfg.openFirewall [ cfg.port ];

    users.users = lib.mkIf (cfg.user == defaultName) {
      ${defaultName} = {
        isSystemUser = true;
        inherit (cfg) group;
        description = "agent-vm MCP proxy";
      };
    };
    users.groups = lib.mkIf (cfg.group == defaultName) { ${defaultName} = { }; };

    systemd.services.agent-mcp = {
      description = "MCP servers over HTTP (agent-vm mcp-proxy)";
      wantedBy = [ "multi-user.target" ];
      wants = [ "network-online.target" ];
      after = [ "network-online.target" ];

      path = cfg.runtimePackages;

      environment = {
        # ProtectHome hides the user's home; npx, uv and friends need a
        # writable HOME and cache.
        HOME = "/var/lib/agent-mcp";
        XDG_CACHE_HOME = "/var/cache/agent-mcp";
        XDG_CONFIG_HOME = "/var/lib/agent-mcp/config";
        XDG_DATA_HOME = "/var/lib/agent-mcp/data";
        npm_config_cache = "/var/cache/agent-mcp/npm";
      }
      // cfg.extraEnvironment;

      unitConfig = {
        RequiresMountsFor = [ cfg.workspaceDir ];
        # Restart=always gives up after 5 failed starts in 5 minutes.
        StartLimitIntervalSec = 300;
        StartLimitBurst = 5;
      };

      serviceConfig = {
        Type = "exec";
        User = cfg.user;
        Group = cfg.group;
        WorkingDirectory = cfg.workspaceDir;

        ExecStartPre = [ selectConfig ];
        ExecStart = lib.escapeShellArgs ([ (lib.getExe' cfg.package "agent-vm") ] ++ proxyArgs);
        ExecStartPost = [ healthCheck ];

        LoadCredential = lib.optional (cfg.tokenFile != null) "mcp-token:${cfg.tokenFile}";
        EnvironmentFile = lib.optional (cfg.environmentFile != null) cfg.environmentFile;

        RuntimeDirectory = "agent-mcp";
        RuntimeDirectoryMode = "0700";
        StateDirectory = "agent-mcp";
        StateDirectoryMode = "0700";
        CacheDirectory = "agent-mcp";
        CacheDirectoryMode = "0700";

        Restart = "always";
        RestartSec = "5s";
        TimeoutStartSec = cfg.healthTimeout + 30;
        KillMode = "mixed";
        KillSignal = "SIGTERM";
        TimeoutStopSec = "30s";

        # Hardening: the servers run agent-driven code; they get the
        # workspace, their own state/cache dirs and the network, nothing else.
        NoNewPrivileges = true;
        ProtectSystem = "strict";
        ProtectHome = true;
        ReadWritePaths = [ cfg.workspaceDir ];
        PrivateTmp = true;
        PrivateDevices = true;
        ProtectKernelTunables = true;
        ProtectKernelModules = true;
        ProtectKernelLogs = true;
        ProtectControlGroups = true;
        ProtectClock = true;
        ProtectHostname = true;
        RestrictNamespaces = true;
        RestrictSUIDSGID = true;
        RestrictRealtime = true;
        RestrictAddressFamilies = [
          "AF_UNIX"
          "AF_INET"
          "AF_INET6"
          "AF_NETLINK"
        ];
        LockPersonality = true;
        RemoveIPC = true;
        CapabilityBoundingSet = "";
        SystemCallArchitectures = "native";
        # Node's and Python's JITs need writable+executable memory.
        MemoryDenyWriteExecute = false;
        UMask = "0022";
      };
    };
  };
}
