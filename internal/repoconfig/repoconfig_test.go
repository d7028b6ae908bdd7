package repoconfig

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	src := "# settings\npackages = [\n  \"ripgrep\",\n  'jq',\n]\ncpus = 2\nmemory = \"3G\"\nagent = \"claude\"\nidle_suspend = \"30m\"\n"
	c, err := Parse("cfg.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Packages, []string{"ripgrep", "jq"}) || c.CPUs != 2 || c.MemoryMiB != 3072 || c.Agent != "claude" || c.IdleSuspend != "30m" {
		t.Errorf("got %+v", c)
	}
	if c, err = Parse("cfg.toml", []byte("memory = \"512M\"\n")); err != nil || c.MemoryMiB != 512 {
		t.Errorf("memory 512M: %v, %d MiB", err, c.MemoryMiB)
	}
	// The grammar of create --memory (internal/size), as the command line takes it.
	for in, want := range map[string]int{"1.5G": 1536, "4GiB": 4096, "2048": 2048} {
		if c, err = Parse("cfg.toml", []byte("memory = \""+in+"\"\n")); err != nil || c.MemoryMiB != want {
			t.Errorf("memory %s: %v, %d MiB, want %d", in, err, c.MemoryMiB, want)
		}
	}
}

// Bad input is refused with the file, the line and what is wrong.
func TestParseRefusesBadInput(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"syntax", "packages = [\"a\"\ncpus = 2\n", "cfg.toml:2: "},
		{"unknown key", "# c\n\npackges = [\"jq\"]\n", `cfg.toml:3: unknown key "packges"`},
		{"wrong type", "cpus = \"two\"\n", "cfg.toml:1: "},
		{"packages not a list", "\npackages = \"jq\"\n", "cfg.toml:2: "},
		{"bad package in a multi-line list", "packages = [\n  \"jq\",\n  \"rm -rf\",\n]\n", `cfg.toml:3: package name "rm -rf"`},
		{"option-like package", "packages = [\"--force\"]\n", `cfg.toml:1: package name "--force"`},
		{"cpus range", "\ncpus = 500\n", "cfg.toml:2: cpus = 500 is out of range"},
		{"memory", "memory = \"lots\"\n", `cfg.toml:1: memory = "lots" is not a size`},
		{"agent", "agent = \"clippy\"\n", `cfg.toml:1: --agent "clippy"`},
		{"table", "[qemu]\npackages = [\"jq\"]\n", `unknown key "qemu`},
		{"idle_suspend", "\nidle_suspend = \"1s\"\n", `cfg.toml:2: idle_suspend "1s" is not a duration of 10s or more`},
		{"idle_suspend's type", "idle_suspend = 30\n", "cfg.toml:1: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("cfg.toml", []byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	ws := t.TempDir()
	c, err := Load(ws, "")
	if err != nil || c.Path != "" || len(c.Packages) != 0 {
		t.Fatalf("a repository without the file: %+v, %v", c, err)
	}
	os.MkdirAll(filepath.Join(ws, ".agent-vm"), 0o755)
	path := filepath.Join(ws, ".agent-vm", "config.toml")
	os.WriteFile(path, []byte("packages = [\"hello\"]\n"), 0o644)
	if c, err = Load(ws, ""); err != nil || c.Path != path || !slices.Equal(c.Packages, []string{"hello"}) {
		t.Errorf("got %+v, %v", c, err)
	}
	os.WriteFile(path, []byte("packages = [\"hello\"\n"), 0o644)
	if _, err = Load(ws, ""); err == nil || !strings.HasPrefix(err.Error(), path+":") {
		t.Errorf("a broken file: %v, want an error starting with %s:", err, path)
	}
}

func TestLoadNamesTheFileAsTold(t *testing.T) {
	ws := t.TempDir()
	os.MkdirAll(filepath.Join(ws, ".agent-vm"), 0o755)
	os.WriteFile(filepath.Join(ws, ".agent-vm", "config.toml"), []byte("cpus = -1\n"), 0o644)
	if _, err := Load(ws, "feat:.agent-vm/config.toml"); err == nil || !strings.HasPrefix(err.Error(), "feat:.agent-vm/config.toml:1: cpus = -1") {
		t.Errorf("got %v", err)
	}
}

// The guest can write the workspace: a config.toml that is a symlink to a
// host file is refused without reading what it names.
func TestLoadRefusesSymlinks(t *testing.T) {
	ws := t.TempDir()
	secret := filepath.Join(t.TempDir(), "shadow")
	os.WriteFile(secret, []byte("root:$6$secret-hash:19000::::::\n"), 0o600)
	os.Mkdir(filepath.Join(ws, ".agent-vm"), 0o755)
	os.Symlink(secret, filepath.Join(ws, ".agent-vm", "config.toml"))
	_, err := Load(ws, "")
	if err == nil || !strings.Contains(err.Error(), "symlink") || strings.Contains(err.Error(), "secret-hash") {
		t.Errorf("got %v", err)
	}
}
