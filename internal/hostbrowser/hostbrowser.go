// Package hostbrowser is the host's Chromium that agent-vm launches for a
// VM's DevTools relay (agent-vm browser BRANCH --launch), and doctor's
// facts about the host's browser.
//
// The launched browser is one per user: a Chrome or Chromium found on PATH,
// started detached with a dedicated, persistent profile in agent-vm's data
// directory (hostdir.Table.Browser), its DevTools endpoint on the host's loopback
// only. A dedicated profile because a profile can be used by one browser at a
// time (a second start hands its arguments to the first and exits), and because
// Chrome ignores --remote-debugging-port on the user's default profile (since
// Chrome 136): the user's everyday profile, cookies and all, is never put behind
// a debugging port. Whoever reaches the endpoint drives the browser; the guest
// reaches it only through its DevTools relay. A second launch finds the first by
// its command line (internal/proc: never a recycled pid) and reuses it.
package hostbrowser

import (
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
)

// Programs are the browsers Find looks for on PATH, in this order.
var Programs = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// DefaultPort is the DevTools port a launch uses unless told otherwise:
// Chrome's customary one, the guest's (guest.DevToolsPort) too.
const DefaultPort = 9222

// Find returns the path of the first of Programs on PATH.
func Find(run execx.Runner) (string, error) {
	for _, name := range Programs {
		if p, err := run.LookPath(name); err == nil {
			return p, nil
		}
	}
	hint := "install Chromium or Google Chrome"
	if p, err := hostpkgs.Lookup("chromium"); err == nil {
		hint = "install Chromium (" + p.PackageHint() + ") or Google Chrome"
	}
	return "", errors.New("no Chrome or Chromium on PATH (looked for " + strings.Join(Programs, ", ") + "): " + hint)
}

// Args is the command line (without the program) that starts a browser
// with profile as its user data directory and its DevTools endpoint on
// 127.0.0.1:port. headless: no display to show a window on. root: running
// as root, where Chromium refuses to start without --no-sandbox.
func Args(profile string, port int, headless, root bool) []string {
	args := []string{
		"--remote-debugging-address=127.0.0.1",
		"--remote-debugging-port=" + strconv.Itoa(port),
		"--user-data-dir=" + profile,
		"--no-first-run",
		"--no-default-browser-check",
	}
	if headless {
		args = append(args, "--headless=new")
	}
	if root {
		args = append(args, "--no-sandbox")
	}
	return args
}

// NoSandboxWarning is what a launch as root warns of.
const NoSandboxWarning = "running as root, so Chromium runs with --no-sandbox (it refuses root otherwise): a page that breaks out of a renderer runs as root on this host; run agent-vm browser as your own user instead"

// Headless reports whether getenv names no display to show a window on
// (neither DISPLAY nor WAYLAND_DISPLAY).
func Headless(getenv func(string) string) bool {
	return getenv("DISPLAY") == "" && getenv("WAYLAND_DISPLAY") == ""
}

// isLaunched matches the browser process (not its helpers, which carry
// --type=) of profile.
func isLaunched(profile string) func(args []string) bool {
	return func(args []string) bool {
		mine := false
		for _, a := range args {
			if strings.HasPrefix(a, "--type=") {
				return false
			}
			if a == "--user-data-dir="+profile {
				mine = true
			}
		}
		return mine
	}
}

// usesProfile matches any process of the browser of profile, helpers
// included.
func usesProfile(profile string) func(args []string) bool {
	return func(args []string) bool { return slices.Contains(args, "--user-data-dir="+profile) }
}

// portOf reads --remote-debugging-port from a browser's command line (0
// when it has none).
func portOf(args []string) int {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--remote-debugging-port="); ok {
			n, err := strconv.Atoi(v)
			if err == nil {
				return n
			}
		}
	}
	return 0
}
