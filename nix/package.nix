# agent-vm and its end-to-end driver, integration-test, built with
# buildGoModule from this repository.
#
# The binary gets the store path of the nixpkgs it was built with
# (internal/nixos.defaultNixpkgs), so `agent-vm start` of a nixos-backend VM
# builds against the same, pinned nixpkgs by default.
{
  lib,
  buildGoModule,
  makeBinaryWrapper,
  path,
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

  agent-vm = buildGoModule (
    common
    // {
      pname = "agent-vm";
      subPackages = [ "cmd/agent-vm" ];
      passthru = { inherit integration-test; };
      meta = {
        description = "One isolated VM per git branch for coding agents";
        mainProgram = "agent-vm";
        platforms = lib.platforms.linux;
      };
    }
  );

  # integration-test drives the agent-vm CLI; the wrapper puts the matching
  # agent-vm first on its PATH.
  integration-test = buildGoModule (
    common
    // {
      pname = "agent-vm-integration-test";
      subPackages = [ "cmd/integration-test" ];
      nativeBuildInputs = [ makeBinaryWrapper ];
      postInstall = ''
        wrapProgram $out/bin/integration-test --prefix PATH : ${lib.makeBinPath [ agent-vm ]}
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
