package bridge

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
)

// ConfigFile is the file in a VM's run directory that says which browser
// bridges are open; none is open without it.
const ConfigFile = "browser.json"

// Config says which browser bridges a VM has open. They last while the VM runs:
// a boot starts with none (vm removes the file), a suspend and resume
// keeps them (the holder of the resumed VM reads the file again).
type Config struct {
	// ChromeBridge is the host directory of Claude in Chrome's bridge
	// sockets (ChromeBridgeDir when the bridge was opened), whose newest
	// socket the guest's guest.ChromeBridgeSocket leads to; "" for none.
	// It is recorded because the holder, a process started before, finds
	// the socket at each connection.
	ChromeBridge string `json:"chrome_bridge,omitempty"`
	// DevTools is the host's DevTools endpoint (127.0.0.1:PORT) the guest
	// reaches at its own 127.0.0.1:guest.DevToolsPort; "" for none.
	DevTools string `json:"devtools,omitempty"`
	// Launched says DevTools is the Chromium agent-vm launched (browser
	// --launch), with agent-vm's own profile, rather than the user's.
	Launched bool `json:"launched,omitempty"`
	// OpenURLs lets the guest ask the host to open http and https URLs;
	// Opener is the host program that opens them (its path, found when
	// the bridge was opened), "" when the host has none: the URL is shown
	// and logged, not opened.
	OpenURLs bool   `json:"open_urls,omitempty"`
	Opener   string `json:"opener,omitempty"`
	// Log is the VM's net log, where the URL opener logs each URL and the
	// DevTools relay each call it refuses.
	Log string `json:"log,omitempty"`
	// Forced says the bridges were opened for a VM whose network is offline.
	Forced bool `json:"forced,omitempty"`
}

// Any reports whether a bridge is open.
func (d Config) Any() bool { return d.ChromeBridge != "" || d.DevTools != "" || d.OpenURLs }

// Lines say what is open, one line each, for status and net show.
func (d Config) Lines() []string {
	var out []string
	if d.ChromeBridge != "" {
		out = append(out, "host Claude in Chrome reachable (the guest's "+guest.ChromeBridgeSocket+" leads to the newest socket in "+d.ChromeBridge+")")
	}
	if d.DevTools != "" {
		what := "host Chrome"
		if d.Launched {
			what = "agent-vm's Chromium"
		}
		out = append(out, fmt.Sprintf("%s reachable (CDP at the guest's 127.0.0.1:%d, host %s, through agent-vm's relay: web pages only, no downloads, no host files)", what, guest.DevToolsPort, d.DevTools))
	}
	switch {
	case d.OpenURLs && d.Opener != "":
		out = append(out, "URLs open on the host (xdg-open in the guest; http and https only, opened with "+d.Opener+")")
	case d.OpenURLs:
		out = append(out, "URLs from the guest shown on the host (xdg-open in the guest; no opener on the host)")
	}
	if d.Forced && len(out) > 0 {
		out = append(out, "opened on an offline VM (--force)")
	}
	return out
}

// CheckDevToolsAddr accepts a DevTools endpoint on the host's loopback
// only: 127.0.0.1:PORT.
func CheckDevToolsAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("DevTools endpoint %q: want 127.0.0.1:PORT", addr)
	}
	if host != "127.0.0.1" {
		return fmt.Errorf("DevTools endpoint %q: only the host's 127.0.0.1 (a browser's debugging port elsewhere is open to more than this VM)", addr)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("DevTools endpoint %q: the port must be 1-65535", addr)
	}
	return nil
}

// ReadConfig reads the bridges of the VM with this run directory (none when
// the file is missing).
func ReadConfig(runDir string) (Config, error) {
	var d Config
	b, err := os.ReadFile(filepath.Join(runDir, ConfigFile))
	if errors.Is(err, fs.ErrNotExist) {
		return d, nil
	}
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("reading %s: %w (hint: agent-vm browser BRANCH --off removes it)", filepath.Join(runDir, ConfigFile), err)
	}
	if d.DevTools != "" {
		if err := CheckDevToolsAddr(d.DevTools); err != nil {
			return Config{}, fmt.Errorf("%s: %w", filepath.Join(runDir, ConfigFile), err)
		}
	}
	return d, nil
}

// WriteConfig records d for the VM with this run directory; no bridge
// removes the file.
func WriteConfig(runDir string, d Config) error {
	p := filepath.Join(runDir, ConfigFile)
	if !d.Any() {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(p, append(b, '\n'), 0o600)
}

// PrepareSocket is the guest command run before a bridge on a guest socket opens:
// the socket's directory, the user's own (0700), and no stale socket in the way.
// A directory there that is not the user's is an error: another user of the guest
// made it.
func PrepareSocket(sock string) string {
	dir := execx.ShellQuote(filepath.Dir(sock))
	return fmt.Sprintf(`mkdir -p -m 0700 %[1]s && test -O %[1]s && chmod 0700 %[1]s && rm -f %[2]s || { echo "%[1]s is not this user's" >&2; exit 1; }`,
		dir, execx.ShellQuote(sock))
}
