package sshconfig

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// resolve asks OpenSSH itself (ssh -G) what it makes of the config for
// host: the options as ssh would use them, lowercased, one per line.
func resolve(t *testing.T, config, host string) map[string]string {
	t.Helper()
	ssh := tu.Program(t, "ssh")
	p := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(p, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(ssh, "-G", "-F", p, host).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh -G %s: %v\n%s\nconfig:\n%s", host, err, out, config)
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			if _, seen := got[k]; !seen { // the first identityfile is ours
				got[k] = v
			}
		}
	}
	return got
}

// The Host blocks reach each VM with its key and pinned host key as ssh
// reads them, a state directory with a space in its path included; a
// branch name cannot break out of its comment line; a VM whose record is
// unreadable is a comment.
func TestBlocksAsSSHReadsThem(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "my vms")
	rec := &state.Record{Branch: "feat/x\nHost *\n  ProxyCommand evil", Slug: "feat-x",
		Ports: state.Ports{SSH: 2301, MCP: 8001}, Guest: state.Guest{User: "dev"},
		Forwards: []state.Forward{{Guest: 3000, Host: 3100}}}
	l := state.Layout{Dir: filepath.Join(dir, "feat-x")}
	config := Blocks([]state.Entry{
		{Slug: "broken", Err: errors.New("unreadable record")},
		{Slug: "feat-x", Layout: l, Record: rec},
	})
	if strings.Contains(config, "\nHost *") || strings.Contains(config, "\n  ProxyCommand") {
		t.Fatalf("the branch name broke out of its comment:\n%s", config)
	}
	if !strings.Contains(config, "# broken: skipped, unreadable record\n") || !strings.Contains(config, "# guest port 3000: on 127.0.0.1:3100") {
		t.Errorf("the skipped VM or the forward is not noted:\n%s", config)
	}
	got := resolve(t, config, "agent-vm-feat-x")
	for k, want := range map[string]string{
		"hostname": "127.0.0.1", "port": "2301", "user": "dev",
		"identityfile": l.ClientKey(), "identitiesonly": "yes", "userknownhostsfile": l.KnownHosts(),
		"stricthostkeychecking": "true", "hostkeyalgorithms": "ssh-ed25519", "proxycommand": "",
	} {
		if got[k] != want {
			t.Errorf("ssh -G: %s = %q, want %q", k, got[k], want)
		}
	}
}

// A foreign guest's block is the driver's endpoint, options included.
func TestForeignAsSSHReadsIt(t *testing.T) {
	rec := &state.Record{Branch: "own", Slug: "own", Guest: state.Guest{Foreign: "Vagrantfile"}}
	key := filepath.Join(t.TempDir(), "private key")
	config := Foreign(rec, driver.SSHEndpoint{Host: "192.168.121.5", Port: 22, User: "vagrant",
		IdentityFiles: []string{key}, Options: [][2]string{{"stricthostkeychecking", "no"}}})
	if !strings.Contains(config, "NO pinned host key") {
		t.Errorf("the block does not say the host key is not pinned:\n%s", config)
	}
	got := resolve(t, config, Alias("own"))
	for k, want := range map[string]string{"hostname": "192.168.121.5", "port": "22", "user": "vagrant", "identityfile": key, "stricthostkeychecking": "false"} {
		if got[k] != want {
			t.Errorf("ssh -G: %s = %q, want %q", k, got[k], want)
		}
	}
}
