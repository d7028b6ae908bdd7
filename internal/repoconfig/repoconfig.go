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
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/size"
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
	if err := c.decode(c, "see `agent-vm create --help` for the keys agent-vm reads",
		"packages is a list of strings, cpus a number, memory and agent strings", "packages, cpus, memory and agent"); err != nil {
		return nil, err
	}
	return c, c.check()
}

// decode decodes c's source into v strictly: a syntax error, a wrong type
// and an unknown key are errors naming c's file and line, with the hints
// for each (what the file's keys are, what their types are, which keys
// agent-vm reads).
func (c *Config) decode(v any, syntaxHint, typeHint, keys string) error {
	md, err := toml.Decode(c.src, v)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			return fmt.Errorf("%s:%d: %s (hint: %s)", c.Path, pe.Position.Line, pe.Message, syntaxHint)
		}
		// A type mismatch is not a ParseError; its text has the line.
		if m := typeErrRE.FindStringSubmatch(err.Error()); m != nil {
			return fmt.Errorf("%s:%s: %s: %s (hint: %s)", c.Path, m[1], m[2], m[3], typeHint)
		}
		return fmt.Errorf("%s: %w", c.Path, err)
	}
	if un := md.Undecoded(); len(un) > 0 {
		key := un[0].String()
		return c.errorf(key, "", "unknown key %q (hint: agent-vm reads %s)", key, keys)
	}
	return nil
}

var (
	// nameRE admits the names of both backends' grammars (Debian's
	// lowercase, '+' and '.'; nixpkgs' capitals, '_' and '\''); each
	// backend then checks its own.
	nameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_+.'-]*$`)
	// typeErrRE reads BurntSushi/toml's "incompatible types" error.
	typeErrRE = regexp.MustCompile(`^toml: line (\d+) \(last key "([^"]*)"\): (.*)$`)
)

func (c *Config) check() error {
	if len(c.Packages) > MaxPackages {
		return c.errorf("packages", "", "%d packages are more than %d", len(c.Packages), MaxPackages)
	}
	for _, p := range c.Packages {
		if len(p) > 128 || !nameRE.MatchString(p) {
			return c.errorf("packages", p, "package name %q is not a package name (hint: e.g. \"ripgrep\": letters, digits, '+', '-', '.', '_')", p)
		}
	}
	if c.CPUs < 0 || c.CPUs > 64 {
		return c.errorf("cpus", "", "cpus = %d is out of range (hint: use 1 to 64)", c.CPUs)
	}
	if c.Memory != "" {
		mib, err := size.ParseMiB(c.Memory, "M")
		if err != nil {
			return c.errorf("memory", "", "memory = %q is %v (hint: e.g. \"4G\", \"1.5G\" or \"2048M\", as create --memory takes)", c.Memory, err)
		}
		c.MemoryMiB = mib
	}
	if c.Agent != "" {
		if _, err := guest.LookupAgent(c.Agent); err != nil {
			return c.errorf("agent", "", "%v", err)
		}
	}
	return nil
}

// errorf is an error about key (and, when given, the quoted value inside
// it) at the line where it stands.
func (c *Config) errorf(key, value, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", c.Path, c.Line(key, value), fmt.Sprintf(format, args...))
}

// Line finds where key is set: the line of value within it when given
// (a multi-line array), else the key's own line; 1 when neither is found.
func (c *Config) Line(key, value string) int {
	keyRE := regexp.MustCompile(`^\s*"?` + regexp.QuoteMeta(key) + `"?\s*=`)
	lines := strings.Split(c.src, "\n")
	for i, l := range lines {
		if !keyRE.MatchString(l) {
			continue
		}
		if value == "" {
			return i + 1
		}
		for j := i; j < len(lines); j++ {
			if strings.Contains(lines[j], `"`+value+`"`) || strings.Contains(lines[j], `'`+value+`'`) {
				return j + 1
			}
		}
		return i + 1
	}
	return 1
}
