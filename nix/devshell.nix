# `nix develop`: the tools the build, the tests and the VMs use.
{
  mkShell,
  go,
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
    go
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

  # Build with the Go in this shell, as `nix build` does; go.mod's `go` line
  # must not need a newer one.
  env.GOTOOLCHAIN = "local";
}
