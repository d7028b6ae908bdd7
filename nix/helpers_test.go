// Package nix_test checks the repository's Nix side with the real tools that
// exist without nixpkgs: nix-instantiate parses every .nix file, nix
// evaluates what needs no nixpkgs (flake inputs, module exports, the
// vendorHash file), nix's flake code reads flake.lock, and
// nix/update-vendor-hash is run against real Go modules.
package nix_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// repoRoot is the repository root: this package lives in nix/.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "flake.nix")); err != nil {
		t.Fatalf("repository root %s has no flake.nix: %v", root, err)
	}
	return root
}

type result struct {
	stdout, stderr []byte
	err            error
}

// run runs a program with a deadline, in dir, with extra environment.
func run(t *testing.T, timeout time.Duration, dir string, env []string, name string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return result{stdout.Bytes(), stderr.Bytes(), err}
}
