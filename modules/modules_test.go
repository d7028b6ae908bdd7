package modules_test

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/modules"
)

func TestEmbedHoldsEveryModule(t *testing.T) {
	onDisk, err := filepath.Glob("*.nix")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(onDisk)
	got := modules.Names()
	if !slices.Equal(got, onDisk) {
		t.Fatalf("embedded modules %q, want the .nix files of modules/ %q", got, onDisk)
	}
	for _, want := range []string{"agent-mcp.nix", "guest.nix"} {
		if !slices.Contains(got, want) {
			t.Errorf("module %q is not embedded", want)
		}
	}
	for _, name := range got {
		embedded, err := fs.ReadFile(modules.FS(), name)
		if err != nil {
			t.Fatal(err)
		}
		disk, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(embedded, disk) {
			t.Errorf("embedded %s differs from modules/%s", name, name)
		}
	}
}

// The embedded bytes, written out as agent-vm writes them, are valid Nix.
func TestEmbeddedModulesParse(t *testing.T) {
	nixInstantiate := tu.Program(t, "nix-instantiate")
	dir := t.TempDir()
	for _, name := range modules.Names() {
		data, err := fs.ReadFile(modules.FS(), name)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, nixInstantiate, "--parse", path).CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("nix-instantiate --parse %s: %v\n%s", name, err, out)
		}
	}
}

// Every ./x.nix a module imports is embedded too, so writing FS() out into
// one directory gives a self-contained set.
func TestRelativeImportsAreEmbedded(t *testing.T) {
	relative := regexp.MustCompile(`\./([A-Za-z0-9._-]+\.nix)\b`)
	for _, name := range modules.Names() {
		data, err := fs.ReadFile(modules.FS(), name)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "#") {
				continue
			}
			for _, m := range relative.FindAllStringSubmatch(line, -1) {
				if !slices.Contains(modules.Names(), m[1]) {
					t.Errorf("%s imports ./%s, which is not embedded", name, m[1])
				}
			}
		}
	}
	guest, err := fs.ReadFile(modules.FS(), "guest.nix")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(guest, []byte("./agent-mcp.nix")) {
		t.Error("guest.nix does not import ./agent-mcp.nix")
	}
}
