package bridge

import (
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// listen makes a real unix socket at path with modification time at.
func listen(t *testing.T, path string, at time.Time) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if err := os.Chtimes(path, at, at); err != nil {
		t.Fatal(err)
	}
}

func TestFindChromeBridgeTakesTheNewestSocket(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	listen(t, filepath.Join(dir, "older.sock"), now.Add(-time.Hour))
	listen(t, filepath.Join(dir, "newest.sock"), now)
	listen(t, filepath.Join(dir, "newer-but-not-a-bridge.socket"), now.Add(time.Minute))
	// A newer *.sock that is a file, not a socket, is not a bridge.
	if err := os.WriteFile(filepath.Join(dir, "file.sock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(filepath.Join(dir, "file.sock"), now.Add(time.Hour), now.Add(time.Hour))
	got, err := FindChromeBridge(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "newest.sock"); got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestFindChromeBridgeWithoutASocketSaysWhatToRun(t *testing.T) {
	empty := t.TempDir()
	for _, dir := range []string{empty, filepath.Join(empty, "missing")} {
		_, err := FindChromeBridge(dir)
		want := "no Claude in Chrome bridge socket in " + dir + ": run `claude --chrome` on the host (Claude Code with the Claude in Chrome extension installed in Chrome, https://claude.ai/chrome)"
		if err == nil || err.Error() != want {
			t.Errorf("%s: err = %v, want %q", dir, err, want)
		}
	}
}

// The directory lies in /tmp: one others can write to, one that is not a
// directory, or one of another user's is refused, and says why.
func TestFindChromeBridgeRefusesADirectoryOthersControl(t *testing.T) {
	open := t.TempDir()
	listen(t, filepath.Join(open, "a.sock"), time.Now())
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(open, link); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ dir, want string }{
		{open, "has mode 0777: other local users can put a socket there"},
		{link, "is not a directory"},
	}
	if os.Geteuid() == 0 {
		theirs := t.TempDir()
		listen(t, filepath.Join(theirs, "a.sock"), time.Now())
		if err := os.Chown(theirs, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct{ dir, want string }{theirs, "belongs to uid 65534, not to you (uid 0): in /tmp another local user can make it first"})
	}
	for _, c := range cases {
		_, err := FindChromeBridge(c.dir)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "claude --chrome") {
			t.Errorf("%s: err = %v, want %q and what to run", c.dir, err, c.want)
		}
	}
}

// A socket of another user's in this user's directory is passed over,
// however new.
func TestFindChromeBridgePassesOverAnotherUsersSocket(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "giving a socket to another user needs root")
	dir := t.TempDir()
	now := time.Now()
	listen(t, filepath.Join(dir, "mine.sock"), now.Add(-time.Hour))
	listen(t, filepath.Join(dir, "theirs.sock"), now)
	if err := os.Lchown(filepath.Join(dir, "theirs.sock"), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if got, err := FindChromeBridge(dir); err != nil || got != filepath.Join(dir, "mine.sock") {
		t.Errorf("got %s, %v; want mine.sock", got, err)
	}
	os.Remove(filepath.Join(dir, "mine.sock"))
	if _, err := FindChromeBridge(dir); err == nil || !strings.Contains(err.Error(), "passed over theirs.sock: not yours") {
		t.Errorf("err = %v, want one naming the socket passed over", err)
	}
}

func TestChromeBridgeDir(t *testing.T) {
	set := func(k string) string {
		return map[string]string{ChromeBridgeDirEnv: "/srv/bridge", "USER": "mallory"}[k]
	}
	if d, err := ChromeBridgeDir(set); err != nil || d != "/srv/bridge" {
		t.Errorf("with %s: %s, %v", ChromeBridgeDirEnv, d, err)
	}
	// $USER is not trusted: the name is this process's user's.
	unset := func(k string) string { return map[string]string{"USER": "mallory"}[k] }
	d, err := ChromeBridgeDir(unset)
	if err != nil {
		t.Fatal(err)
	}
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	if want := "/tmp/claude-mcp-browser-bridge-" + me.Username; d != want {
		t.Errorf("got %s, want %s", d, want)
	}
}
