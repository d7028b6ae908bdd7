// Package repoconfig reads a repository's own agent-vm settings,
// .agent-vm/config.toml in the workspace: the packages its VMs need and
// defaults for create's flags. It is the repository's file, so it may come
// from anyone who can push to the branch: it is parsed strictly (unknown
// keys, wrong types and bad values are errors naming the file and line) and
// only ever read, never run.
//
// The format is TOML, read with github.com/BurntSushi/toml: users write
// real TOML (comments, multi-line arrays, either quote style), which a
// hand-made subset would refuse in surprising ways.
//
//	# .agent-vm/config.toml
//	packages = ["ripgrep", "jq"]  # installed at the first boot, both backends
//	cpus = 2                      # defaults for create's flags of the same name
//	memory = "2G"                 # a size as create --memory takes it (internal/size)
//	agent = "claude"
package repoconfig

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/size"
	"github.com/agent-vm/agent-vm/internal/tomlfile"
	"github.com/agent-vm/agent-vm/internal/userconfig"
	"github.com/agent-vm/agent-vm/internal/wsfile"
)

// MaxPackages bounds the packages one file may list.
const MaxPackages = 100

// Config is what a repository's config.toml says. Zero values mean "not
// set": create's own defaults apply.
type Config struct {
	// Path is the file it was read from ("" when the repository has none).
	Path string `toml:"-"`
	// Packages are installed in the guest on its first boot: Debian package
	// names for the qemu backend, nixpkgs attribute names for nixos (the
	// backend checks each against its grammar).
	Packages []string `toml:"packages"`
	// CPUs, Memory and Agent are defaults for create --cpus, --memory and
	// --agent.
	CPUs   int    `toml:"cpus"`
	Memory string `toml:"memory"`
	Agent  string `toml:"agent"`
	// IdleSuspend hibernates the repository's VMs idle this long (as the
	// user's idle_suspend, which it wins over: internal/idle); kept in the
	// record at create.
	IdleSuspend string `toml:"idle_suspend"`

	// MemoryMiB is Memory in MiB.
	MemoryMiB int `toml:"-"`
	src       string
}

// Load reads workspace's .agent-vm/config.toml; a repository without one
// gives an empty Config. Messages name the file as name ("" for its path):
// a workspace still being created is in a directory the user never sees.
// The guest can write the workspace: a config.toml (or .agent-vm) that is
// a symlink or not a regular file is refused, never followed.
func Load(workspace, name string) (*Config, error) {
	if name == "" {
		name = filepath.Join(workspace, guest.ConfigFile)
	}
	raw, found, err := Raw(workspace, name)
	switch {
	case err != nil:
		return nil, err
	case !found:
		return &Config{}, nil
	}
	return Parse(name, raw)
}

// Raw reads workspace's config file as Load does, without parsing it;
// found is false when the repository has none. (A VM's host reads it
// there, and the machine that asked parses it.)
func Raw(workspace, name string) (raw []byte, found bool, err error) {
	if name == "" {
		name = filepath.Join(workspace, guest.ConfigFile)
	}
	raw, err = wsfile.Read(workspace, guest.ConfigFile, maxConfigSize)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if errors.Is(err, wsfile.ErrNotRegular) {
		return nil, false, fmt.Errorf("the repository's agent-vm settings %s are a symlink or not a regular file; agent-vm does not follow links in the workspace (hint: make it a plain file)", name)
	}
	if err != nil {
		return nil, false, fmt.Errorf("reading the repository's agent-vm settings %s: %w", name, err)
	}
	return raw, true, nil
}

// maxConfigSize bounds what Load reads.
const maxConfigSize = 1 << 20

// Parse decodes a config.toml; path is only used in messages.
func Parse(path string, raw []byte) (*Config, error) {
	c := &Config{Path: path, src: string(raw)}
	if err := c.doc().Decode(c, "see `agent-vm create --help` for the keys agent-vm reads",
		"packages is a list of strings, cpus a number, memory, agent and idle_suspend strings", "packages, cpus, memory, agent and idle_suspend"); err != nil {
		return nil, err
	}
	return c, c.check()
}

// doc is c's source for tomlfile's strict decoding and its messages.
func (c *Config) doc() tomlfile.Doc { return tomlfile.Doc{Path: c.Path, Src: c.src} }

// Line finds where key is set in c's file (tomlfile.Doc.Line).
func (c *Config) Line(key, value string) int { return c.doc().Line(key, value) }

// nameRE admits the names of both backends' grammars (Debian's
// lowercase, '+' and '.'; nixpkgs' capitals, '_' and '\”); each
// backend then checks its own.
var nameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_+.'-]*$`)

func (c *Config) check() error {
	if len(c.Packages) > MaxPackages {
		return c.doc().Errorf("packages", "", "%d packages are more than %d", len(c.Packages), MaxPackages)
	}
	for _, p := range c.Packages {
		if len(p) > 128 || !nameRE.MatchString(p) {
			return c.doc().Errorf("packages", p, "package name %q is not a package name (hint: e.g. \"ripgrep\": letters, digits, '+', '-', '.', '_')", p)
		}
	}
	if c.CPUs < 0 || c.CPUs > 64 {
		return c.doc().Errorf("cpus", "", "cpus = %d is out of range (hint: use 1 to 64)", c.CPUs)
	}
	if c.Memory != "" {
		mib, err := size.ParseMiB(c.Memory, "M")
		if err != nil {
			return c.doc().Errorf("memory", "", "memory = %q is %v (hint: e.g. \"4G\", \"1.5G\" or \"2048M\", as create --memory takes)", c.Memory, err)
		}
		c.MemoryMiB = mib
	}
	if c.Agent != "" {
		if _, err := guest.LookupAgent(c.Agent); err != nil {
			return c.doc().Errorf("agent", "", "%v", err)
		}
	}
	if _, err := userconfig.ParseIdle(c.IdleSuspend); err != nil {
		return c.doc().Errorf("idle_suspend", "", "%v", err)
	}
	return nil
}
