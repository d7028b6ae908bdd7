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
	"time"

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
	// IdleSuspend, when set, hibernates a VM that has been idle this long
	// (internal/idle): "30m". Idle is read from it (IdleAfter).
	IdleSuspend string `toml:"idle_suspend"`
	// IdleAfter is IdleSuspend read; 0 when it is not set.
	IdleAfter time.Duration `toml:"-"`
}

// MinIdle is the least idle_suspend: shorter would hibernate a VM between
// two of its user's commands.
const MinIdle = 10 * time.Second

// ParseIdle reads an idle_suspend ("30m"); "" is 0, off. The repository's
// config.toml takes the same.
func ParseIdle(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < MinIdle {
		return 0, fmt.Errorf("idle_suspend %q is not a duration of %s or more (hint: idle_suspend = \"30m\")", s, MinIdle)
	}
	return d, nil
}

// PathEnv names another file to read in place of the default one.
const PathEnv = "AGENT_VM_CONFIG"

// Path is the user's config.toml: $AGENT_VM_CONFIG, else under
// $XDG_CONFIG_HOME (else ~/.config).
func Path(getenv func(string) string) string {
	if p := getenv(PathEnv); p != "" {
		return p
	}
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
	if err := doc.Decode(c, "see docs/configuration.md's \"Your settings\"", "on_wait and idle_suspend are strings", "on_wait, idle_suspend"); err != nil {
		return nil, err
	}
	d, err := ParseIdle(c.IdleSuspend)
	if err != nil {
		return nil, doc.Errorf("idle_suspend", "", "%v", err)
	}
	c.IdleAfter = d
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
