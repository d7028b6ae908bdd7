package bridge

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
)

// ChromeBridgeDirEnv, when set, is where FindChromeBridge looks instead of
// the native host's own directory (tests, unusual setups).
const ChromeBridgeDirEnv = "AGENT_VM_CHROME_BRIDGE_DIR"

// chromeBridgePrefix is the start of the directory the Claude in Chrome
// native host makes in /tmp for its sockets; the user's name follows.
const chromeBridgePrefix = "/tmp/claude-mcp-browser-bridge-"

// ChromeSetupHint is what a user does to have a Claude in Chrome bridge on
// the host.
const ChromeSetupHint = "run `claude --chrome` on the host (Claude Code with the Claude in Chrome extension installed in Chrome, https://claude.ai/chrome)"

// ChromeBridgeDir is where the host's Claude in Chrome native host keeps
// its sockets: $AGENT_VM_CHROME_BRIDGE_DIR when set, else
// /tmp/claude-mcp-browser-bridge-USER. USER is the name of the user this
// process runs as, from the user database, not $USER: $USER is whatever
// the environment says (kept across su, set by hand), and a directory
// named for another user would only be refused by FindChromeBridge, which
// wants the directory to be this user's.
func ChromeBridgeDir(getenv func(string) string) (string, error) {
	if d := getenv(ChromeBridgeDirEnv); d != "" {
		return d, nil
	}
	u, err := user.Current()
	if err != nil {
		return "", fmt.Errorf("finding the Claude in Chrome bridge: who is this user: %w (hint: set %s to the bridge's directory)", err, ChromeBridgeDirEnv)
	}
	return chromeBridgePrefix + u.Username, nil
}

// FindChromeBridge returns the Claude in Chrome bridge socket in dir: the
// newest (by modification time) *.sock that is a socket of this user's,
// the one the host's own Claude Code would pick. dir lies in /tmp, where
// any local user can make it first or put a socket of their own in it,
// and a planted socket would receive what the agent sends its browser and
// answer in the browser's name: a dir that is not this user's, or that
// group or others can write to, is refused, and sockets of other users
// are passed over.
func FindChromeBridge(dir string) (string, error) {
	none := fmt.Errorf("no Claude in Chrome bridge socket in %s: %s", dir, ChromeSetupHint)
	fi, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return "", none
	}
	if err != nil {
		return "", fmt.Errorf("finding the Claude in Chrome bridge: %w", err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory (a %s), where Claude in Chrome keeps its bridge sockets: another local user may have put it there (hint: remove it, then %s)", dir, fi.Mode().Type(), ChromeSetupHint)
	}
	if uid, me := owner(fi), os.Geteuid(); uid != me {
		return "", fmt.Errorf("%s belongs to uid %d, not to you (uid %d): in /tmp another local user can make it first and plant a socket that answers in your browser's name, so agent-vm does not use it (hint: remove it, then %s)", dir, uid, me, ChromeSetupHint)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return "", fmt.Errorf("%s has mode %04o: other local users can put a socket there that answers in your browser's name, so agent-vm does not use it (hint: `chmod 700 %s`, or remove it, then %s)", dir, perm, dir, ChromeSetupHint)
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("finding the Claude in Chrome bridge: %w", err)
	}
	var best string
	var bestInfo fs.FileInfo
	var foreign []string
	for _, de := range des {
		if !strings.HasSuffix(de.Name(), ".sock") {
			continue
		}
		p := filepath.Join(dir, de.Name())
		fi, err := os.Lstat(p)
		if err != nil || fi.Mode().Type() != fs.ModeSocket {
			continue
		}
		if owner(fi) != os.Geteuid() {
			foreign = append(foreign, de.Name())
			continue
		}
		if bestInfo == nil || fi.ModTime().After(bestInfo.ModTime()) {
			best, bestInfo = p, fi
		}
	}
	if best == "" && len(foreign) > 0 {
		return "", fmt.Errorf("%w (passed over %s: not yours)", none, strings.Join(foreign, ", "))
	}
	if best == "" {
		return "", none
	}
	return best, nil
}

// owner is the uid a file belongs to (-1 when the system does not say).
func owner(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
