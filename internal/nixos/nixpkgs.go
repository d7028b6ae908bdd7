package nixos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// defaultNixpkgs is the nixpkgs agent-vm was built with: the flake build sets
// it to the pinned nixpkgs' store path with
// -ldflags "-X github.com/agent-vm/agent-vm/internal/nixos.defaultNixpkgs=...".
var defaultNixpkgs string

// nixpkgsSource says where a nixpkgs choice came from, for messages.
type nixpkgsSource struct {
	value string // a path or flake reference
	from  string // where the choice came from, for messages
}

// pickNixpkgs chooses, in order: start's --nixpkgs, create's --nixpkgs (kept
// in the VM record), the pinned nixpkgs agent-vm was built with, and only
// when there is none NIX_PATH's nixpkgs entry. The pin comes before NIX_PATH
// so a channel the host happens to have does not silently replace the
// nixpkgs the modules were checked against; --nixpkgs still overrides it.
func pickNixpkgs(flag, recorded, pinned, nixPath string) (nixpkgsSource, error) {
	if flag != "" {
		return nixpkgsSource{flag, "--nixpkgs"}, nil
	}
	if recorded != "" {
		return nixpkgsSource{recorded, "create --nixpkgs"}, nil
	}
	if pinned != "" {
		return nixpkgsSource{pinned, "built-in"}, nil
	}
	if v := nixpkgsFromNixPath(nixPath); v != "" {
		return nixpkgsSource{v, "NIX_PATH"}, nil
	}
	return nixpkgsSource{}, fmt.Errorf("no nixpkgs to build the VM from (hint: pass --nixpkgs PATH|FLAKEREF, e.g. --nixpkgs github:NixOS/nixpkgs/nixos-26.05, set NIX_PATH=nixpkgs=..., or use the Nix-built agent-vm (`nix run github:...#agent-vm`), which carries its pinned nixpkgs)")
}

// nixpkgsFromNixPath returns the value of a `nixpkgs=...` entry, with
// "flake:" references reduced to their flake reference.
func nixpkgsFromNixPath(nixPath string) string {
	for _, e := range strings.Split(nixPath, ":") {
		if v, ok := strings.CutPrefix(e, "nixpkgs="); ok && v != "" {
			if v == "flake" {
				// "nixpkgs=flake:nixpkgs" was split at its colon.
				return "nixpkgs"
			}
			return v
		}
	}
	return ""
}

// resolveNixpkgs turns a path or flake reference into a nixpkgs source tree
// on disk.
func resolveNixpkgs(ctx context.Context, run execx.Runner, nix string, src nixpkgsSource) (string, error) {
	v := src.value
	if isPath(v) {
		abs, err := filepath.Abs(v)
		if err != nil {
			return "", err
		}
		if _, err := os.Stat(filepath.Join(abs, "nixos", "lib", "eval-config.nix")); err != nil {
			return "", fmt.Errorf("nixpkgs %s (from %s) is not a nixpkgs source tree: it has no nixos/lib/eval-config.nix (hint: point --nixpkgs at a nixpkgs checkout, or pass a flake reference such as github:NixOS/nixpkgs/nixos-26.05)", abs, src.from)
		}
		return abs, nil
	}
	// A flake reference: let nix fetch it (or find it in the store).
	res, err := run.Run(ctx, execx.Cmd{Path: nix, Args: []string{"--extra-experimental-features", "nix-command flakes",
		"flake", "prefetch", "--json", v}})
	if err != nil {
		return "", fmt.Errorf("fetching nixpkgs %q (from %s): %w (hint: check the reference, or pass a local checkout with --nixpkgs PATH)", v, src.from, err)
	}
	p := gjson.GetBytes(res.Stdout, "storePath").String()
	if p == "" {
		return "", fmt.Errorf("fetching nixpkgs %q: nix did not say where it put it: %s", v, execx.Tail(res.Stdout, 300))
	}
	return p, nil
}

// isPath tells a nixpkgs path from a flake reference.
func isPath(v string) bool { return strings.HasPrefix(v, "/") || strings.HasPrefix(v, ".") }
