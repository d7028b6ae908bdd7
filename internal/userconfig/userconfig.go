// Package userconfig reads the user's own agent-vm settings,
// $XDG_CONFIG_HOME/agent-vm/config.toml (~/.config/agent-vm/config.toml):
// what agent-vm does on this host for every VM. A repository's
// .agent-vm/config.toml (internal/repoconfig) comes from whoever can push
// to the repository, so a setting that makes the host run something, such
// as on_wait, is read from here only.
//
//	# ~/.config/agent-vm/config.toml
//	on_wait = 'notify-phone "$AGENT_VM_BRANCH: $AGENT_VM_MESSAGE"'
package userconfig

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/tomlfile"
)

// File is the settings file's name in agent-vm's configuration directory.
const File = "config.toml"

// maxSize bounds what Load reads.
const maxSize = 1 << 20

// Config is what the user's config.toml says; zero values are "not set".
type Config struct {
	Path string `toml:"-"` // the file it was read from
	// OnWait is a shell command (sh -c) run on this host when an agent
	// starts waiting for the user (internal/notify), with the VM, the
	// session, the state and what the agent said in its environment.
	OnWait string `toml:"on_wait"`
}

// Path is the user's config.toml, under $XDG_CONFIG_HOME (else ~/.config).
func Path(getenv func(string) string) string {
	return filepath.Join(hostdir.XDG(getenv, "XDG_CONFIG_HOME", ".config", "agent-vm"), File)
}

// Load reads the file at path: none there is an empty Config.
func Load(path string) (*Config, error) {
	c := &Config{Path: path}
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return c, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSize {
		return nil, fmt.Errorf("%s is over %d bytes (hint: it holds a few settings)", path, maxSize)
	}
	return Parse(path, b)
}

// Parse decodes a config.toml; path is only used in messages.
func Parse(path string, raw []byte) (*Config, error) {
	c := &Config{Path: path}
	doc := tomlfile.Doc{Path: path, Src: string(raw)}
	if err := doc.Decode(c, "see docs/configuration.md's \"Your settings\"", "on_wait is a string", "on_wait"); err != nil {
		return nil, err
	}
	if err := CheckCommand(c.OnWait); err != nil {
		return nil, doc.Errorf("on_wait", "", "on_wait %v", err)
	}
	return c, nil
}

// CheckCommand checks a command the host runs for the user (on_wait, run
// --on-wait): one sh -c command line.
func CheckCommand(cmd string) error {
	if strings.ContainsRune(cmd, 0) || len(cmd) > 4096 {
		return errors.New("is not a command line (hint: at most 4096 characters, no NUL)")
	}
	return nil
}
