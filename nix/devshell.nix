# `nix develop`: the tools the build, the tests and the VMs use.
{
  mkShell,
  go_1_26,
  gopls,
  gotools,
  qemu,
  virtiofsd,
  openssh,
  git,
  nix,
  nixfmt,
  shellcheck,
  e2fsprogs,
}:

mkShell {
  packages = [
    go_1_26
    gopls
    gotools
    qemu
    virtiofsd
    openssh
    git
    nix
    nixfmt
    shellcheck
    e2fsprogs
  ];

  # Build with the Go in this shell, the one package.nix builds with
  # (buildGo126Module); go.mod's `go` line must not need a newer one.
  env.GOTOOLCHAIN = "local";
}
