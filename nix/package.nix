# agent-vm and its end-to-end driver, integration-test, built with
# buildGo126Module from this repository: go.mod says `go 1.26.0`, so the
# builder is named rather than left to nixpkgs' default Go.
#
# The binary gets the store path of the nixpkgs it was built with
# (internal/nixos.defaultNixpkgs), so `agent-vm start` of a nixos-backend VM
# builds against the same, pinned nixpkgs by default.
{
  lib,
  buildGo126Module,
  makeBinaryWrapper,
  path,
  runCommand,
  git,
  openssh,
  qemu,
  virtiofsd,
}:

let
  version = "0.1.0";

  common = {
    inherit version;

    # Only what `go build` reads: the module files and the Go packages,
    # including modules/ (embedded with go:embed). maybeMissing keeps the
    # expression valid while a directory does not exist yet.
    src = lib.fileset.toSource {
      root = ../.;
      fileset = lib.fileset.unions (
        [
          ../go.mod
          ../go.sum
        ]
        ++ map lib.fileset.maybeMissing [
          ../blackbox
          ../cmd
          ../internal
          ../integration
          ../modules
        ]
      );
    };

    vendorHash = import ./vendor-hash.nix ../vendorHash;

    env.CGO_ENABLED = 0;

    ldflags = [
      "-s"
      "-w"
      "-X github.com/agent-vm/agent-vm/internal/nixos.defaultNixpkgs=${path}"
      "-X github.com/agent-vm/agent-vm/internal/cli.Version=${version}"
    ];

    # The test suite drives git, QEMU, sshd and nix, none of which the build
    # sandbox has; CI runs it (README's test command).
    doCheck = false;
  };

  # What agent-vm runs. Appended to PATH, not prepended: a user's own git,
  # ssh or QEMU (newer, or with site configuration) still wins, and these
  # only fill in what the host lacks. `nix` is not among them: it must be
  # the host's, talking to the host's store and daemon.
  runtimePath = lib.makeBinPath [
    git
    openssh
    qemu
    virtiofsd
  ];

  meta = {
    description = "One isolated VM per git branch for coding agents";
    mainProgram = "agent-vm";
    platforms = lib.platforms.linux;
  };

  # The static binary alone. The guest runs this one as its MCP proxy
  # (services.agent-mcp.package defaults to it), so QEMU and virtiofsd
  # never end up in a VM's closure.
  unwrapped = buildGo126Module (
    common
    // {
      pname = "agent-vm-unwrapped";
      subPackages = [ "cmd/agent-vm" ];
      inherit meta;
    }
  );

  agent-vm =
    runCommand "agent-vm-${version}"
      {
        nativeBuildInputs = [ makeBinaryWrapper ];
        passthru = { inherit unwrapped unwrappedTestHooks integration-test; };
        inherit meta;
      }
      ''
        makeBinaryWrapper ${unwrapped}/bin/agent-vm $out/bin/agent-vm --suffix PATH : ${runtimePath}
      '';

  # The agent-vm integration-test drives: the same, built with the egress
  # proxy's test hooks (the agentvm_testhooks tag: environment variables by
  # which a test leads a name to a server of its own and has the proxy
  # trust its CA), which the shipped agent-vm does not read.
  unwrappedTestHooks = buildGo126Module (
    common
    // {
      pname = "agent-vm-testhooks-unwrapped";
      subPackages = [ "cmd/agent-vm" ];
      tags = [ "agentvm_testhooks" ];
      inherit meta;
    }
  );

  agent-vm-testhooks =
    runCommand "agent-vm-testhooks-${version}"
      {
        nativeBuildInputs = [ makeBinaryWrapper ];
        inherit meta;
      }
      ''
        makeBinaryWrapper ${unwrappedTestHooks}/bin/agent-vm $out/bin/agent-vm --suffix PATH : ${runtimePath}
      '';

  # integration-test drives the agent-vm CLI; the wrapper puts the matching
  # agent-vm, with the test hooks, first on its PATH.
  integration-test = buildGo126Module (
    common
    // {
      pname = "agent-vm-integration-test";
      subPackages = [ "cmd/integration-test" ];
      nativeBuildInputs = [ makeBinaryWrapper ];
      postInstall = ''
        wrapProgram $out/bin/integration-test --prefix PATH : ${lib.makeBinPath [ agent-vm-testhooks ]}
      '';
      meta = {
        description = "End-to-end tests of the agent-vm CLI";
        mainProgram = "integration-test";
        platforms = lib.platforms.linux;
      };
    }
  );
in
agent-vm
