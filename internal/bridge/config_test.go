package bridge

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

func TestConfigFileRoundTripAndNoneRemovesIt(t *testing.T) {
	dir := t.TempDir()
	if d, err := ReadConfig(dir); err != nil || d.Any() {
		t.Fatalf("no file: %+v, %v; want no bridge", d, err)
	}
	want := Config{ChromeBridge: "/tmp/claude-mcp-browser-bridge-me", DevTools: "127.0.0.1:9333", Launched: true, OpenURLs: true, Opener: "/usr/bin/xdg-open"}
	if err := WriteConfig(dir, want); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, ConfigFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("browser.json: %v, %v; want mode 0600", fi, err)
	}
	got, err := ReadConfig(dir)
	if err != nil || got != want {
		t.Fatalf("read back %+v, %v; want %+v", got, err, want)
	}
	if err := WriteConfig(dir, Config{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, ConfigFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no bridge left the file: %v", err)
	}
}

func TestConfigFileRefusesANonLoopbackEndpoint(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), []byte(`{"devtools":"10.0.0.5:9222"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadConfig(dir); err == nil || !strings.Contains(err.Error(), "only the host's 127.0.0.1") {
		t.Fatalf("ReadConfig = %v, want the endpoint refused", err)
	}
	for _, bad := range []string{"localhost:9222", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:x", "[::1]:9222"} {
		if CheckDevToolsAddr(bad) == nil {
			t.Errorf("CheckDevToolsAddr(%q) accepted", bad)
		}
	}
	if err := CheckDevToolsAddr("127.0.0.1:9222"); err != nil {
		t.Error(err)
	}
}

func TestConfigLinesSayWhatIsOpen(t *testing.T) {
	if l := (Config{}).Lines(); len(l) != 0 {
		t.Errorf("no bridge: %q", l)
	}
	l := Config{DevTools: "127.0.0.1:9222", OpenURLs: true, Opener: "/usr/bin/xdg-open", Forced: true}.Lines()
	got := strings.Join(l, "\n")
	for _, want := range []string{"host Chrome reachable (CDP", "URLs open on the host", "offline VM (--force)"} {
		if !strings.Contains(got, want) {
			t.Errorf("lines %q lack %q", got, want)
		}
	}
}

// PrepareSocket's command, run by a real sh: the directory made 0700 and a
// stale socket file removed; a directory of another user refused (as root,
// one owned by nobody).
func TestPrepareSocketMakesTheDirectoryAndRemovesAStaleSocket(t *testing.T) {
	base := t.TempDir()
	sock := filepath.Join(base, "bridge dir", "agent-vm.sock")
	if out, err := exec.Command("sh", "-c", PrepareSocket(sock)).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	fi, err := os.Stat(filepath.Dir(sock))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("directory: %v, %v", fi, err)
	}
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-c", PrepareSocket(sock)).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stale socket is still there: %v", err)
	}
	if os.Geteuid() == 0 {
		other := filepath.Join(base, "theirs", "x.sock")
		if err := os.Mkdir(filepath.Dir(other), 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Dir(other), 65534, 65534); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command("sh", "-c", PrepareSocket(other)).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "is not this user's") {
			t.Fatalf("another user's directory: %v, %s", err, out)
		}
	}
}

// Tunnel joins a guest connection to the host end, both ways, several at
// once, finding the end at each connection; an end that cannot be found
// closes the guest's connection.
func TestTunnelJoinsEachConnectionToTheHostEnd(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "host.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = c.Write([]byte("host saw " + line))
			}()
		}
	}()
	found := 0
	serve := Tunnel("unix", func() (string, error) { found++; return sock, nil }, hclog.NewNullLogger())
	for range 3 {
		guestEnd, holderEnd := net.Pipe()
		go serve(context.Background(), holderEnd)
		_ = guestEnd.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := guestEnd.Write([]byte("hi\n")); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(guestEnd).ReadString('\n')
		if err != nil || line != "host saw hi\n" {
			t.Fatalf("through the tunnel: %q, %v", line, err)
		}
		guestEnd.Close()
	}
	if found != 3 {
		t.Errorf("the host end was found %d times, want once per connection", found)
	}

	none := Tunnel("unix", func() (string, error) { return "", errors.New("no socket") }, hclog.NewNullLogger())
	guestEnd, holderEnd := net.Pipe()
	go none(context.Background(), holderEnd)
	_ = guestEnd.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := guestEnd.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection with no host end stayed open")
	}
}
