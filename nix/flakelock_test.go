package nix_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// The nixpkgs node the flake pins: release-26.05, committed 2026-08-13.
const (
	wantLocked   = `{"lastModified":1786659501,"narHash":"sha256-oN+HZDL3oxWU7IOBcPnN+HLlzR2XBbcX/hTUcMtLfEw=","owner":"NixOS","repo":"nixpkgs","rev":"bf817068f9eb336bfd314cab423f826af5b56a6a","type":"github"}`
	wantOriginal = `{"owner":"NixOS","ref":"nixos-26.05","repo":"nixpkgs","type":"github"}`
)

func TestFlakeLockPinsNixpkgs(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), "flake.lock"))
	if err != nil {
		t.Fatal(err)
	}
	var lock struct {
		Version int                        `json:"version"`
		Root    string                     `json:"root"`
		Nodes   map[string]json.RawMessage `json:"nodes"`
	}
	if err := json.Unmarshal(data, &lock); err != nil {
		t.Fatalf("flake.lock is not JSON: %v", err)
	}
	if lock.Version != 7 || lock.Root != "root" {
		t.Errorf("version %d root %q, want 7 and \"root\"", lock.Version, lock.Root)
	}
	if len(lock.Nodes) != 2 {
		t.Errorf("%d nodes, want root and nixpkgs only", len(lock.Nodes))
	}
	var root struct {
		Inputs map[string]string `json:"inputs"`
	}
	if err := json.Unmarshal(lock.Nodes["root"], &root); err != nil {
		t.Fatal(err)
	}
	if len(root.Inputs) != 1 || root.Inputs["nixpkgs"] != "nixpkgs" {
		t.Errorf("root inputs %v, want nixpkgs only", root.Inputs)
	}
	var node struct {
		Locked   map[string]any `json:"locked"`
		Original map[string]any `json:"original"`
	}
	if err := json.Unmarshal(lock.Nodes["nixpkgs"], &node); err != nil {
		t.Fatal(err)
	}
	// Marshal sorts keys, so this compares field by field, exactly.
	if got, _ := json.Marshal(node.Locked); string(got) != wantLocked {
		t.Errorf("nixpkgs locked\n got %s\nwant %s", got, wantLocked)
	}
	if got, _ := json.Marshal(node.Original); string(got) != wantOriginal {
		t.Errorf("nixpkgs original\n got %s\nwant %s", got, wantOriginal)
	}
}

// nix's own flake code reads flake.lock and finds it current for flake.nix's
// inputs: with --offline and --no-write-lock-file, any mismatch would make it
// try to re-lock from GitHub and fail. The second half shows that it does.
func TestFlakeLockMatchesInputs(t *testing.T) {
	nix := tu.Program(t, "nix")
	root := repoRoot(t)
	metadata := func(dir string) result {
		return run(t, 2*time.Minute, dir, nil, nix,
			"--extra-experimental-features", "nix-command flakes",
			"flake", "metadata", "--offline", "--no-write-lock-file", "--json", "path:"+dir)
	}
	copyFlake := func(edit func(string) string) string {
		dir := t.TempDir()
		for _, name := range []string{"flake.nix", "flake.lock"} {
			data, err := os.ReadFile(filepath.Join(root, name))
			if err != nil {
				t.Fatal(err)
			}
			text := string(data)
			if name == "flake.nix" {
				text = edit(text)
			}
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}

	r := metadata(copyFlake(func(s string) string { return s }))
	if r.err != nil && storeUnusable(r.stderr) {
		tu.SkipOrFail(t, "nix cannot use its store here: %s", r.stderr)
	}
	if r.err != nil {
		t.Fatalf("nix flake metadata: %v\n%s", r.err, r.stderr)
	}
	var meta struct {
		Locks struct {
			Nodes map[string]struct {
				Locked map[string]any `json:"locked"`
			} `json:"nodes"`
		} `json:"locks"`
	}
	if err := json.Unmarshal(r.stdout, &meta); err != nil {
		t.Fatalf("decoding nix flake metadata: %v\n%s", err, r.stdout)
	}
	if got, _ := json.Marshal(meta.Locks.Nodes["nixpkgs"].Locked); string(got) != wantLocked {
		t.Errorf("nix reads the nixpkgs lock as %s, want %s", got, wantLocked)
	}

	moved := copyFlake(func(s string) string { return strings.Replace(s, "nixos-26.05", "nixos-25.11", 1) })
	if r := metadata(moved); r.err == nil {
		t.Errorf("nix accepted flake.lock for a flake.nix that asks for nixos-25.11:\n%s", r.stdout)
	}
}

// storeUnusable tells a nix that cannot reach its store (no daemon, no write
// access for this user) from a nix that rejected the input.
func storeUnusable(stderr []byte) bool {
	s := string(stderr)
	return strings.Contains(s, "cannot connect to socket") ||
		strings.Contains(s, "Permission denied") ||
		strings.Contains(s, "cannot open connection to remote store")
}
