# The vendorHash for buildGoModule, read from a file written by
# nix/update-vendor-hash: an SRI sha256 hash, or the word `null` when the
# module has nothing to vendor (buildGoModule then wants vendorHash = null).
# Builtins only, so the test suite can evaluate it with a bare nix.
file:
let
  text = builtins.readFile file;
  trimmed = builtins.match "[[:space:]]*([^[:space:]]*)[[:space:]]*" text;
  value = if trimmed == null then text else builtins.head trimmed;
in
if value == "null" then
  null
else if builtins.match "sha256-[A-Za-z0-9+/]{43}=" value != null then
  value
else
  throw "vendorHash file ${toString file} holds \"${value}\", not an SRI sha256 hash or null; run nix/update-vendor-hash to rewrite it"
