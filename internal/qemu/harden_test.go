package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// sampleHardening is a root host's with a network: the sandbox relaxed
// for -runas and for the network's guestfwd commands.
func sampleHardening() Hardening {
	owner := &Owner{UID: 1000, GID: 1000}
	p := Sandbox(owner, true)
	return Hardening{Sandbox: &p, RunAs: owner}
}

// userHardening is an unprivileged host's, and every Script boot's.
func userHardening() Hardening { return Hardening{Sandbox: &SandboxPolicy{}} }

func TestSandboxOption(t *testing.T) {
	for _, c := range []struct {
		p    SandboxPolicy
		want string
	}{
		{SandboxPolicy{}, "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"},
		{Sandbox(nil, false), "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"},
		{Sandbox(&Owner{UID: 1000, GID: 1000}, false), "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny"},
		{Sandbox(nil, true), "on,obsolete=deny,elevateprivileges=deny,spawn=allow,resourcecontrol=deny"},
		{SandboxPolicy{AllowSpawn: true}, "on,obsolete=deny,elevateprivileges=deny,spawn=allow,resourcecontrol=deny"},
	} {
		if got := c.p.Option(); got != c.want {
			t.Errorf("%+v: got %q, want %q", c.p, got, c.want)
		}
	}
}

func TestHardeningPerBootAndUser(t *testing.T) {
	m, _ := Machine{}, Boot{}
	m.Share.UID, m.Share.GID = 1001, 1002
	direct, script := Boot{Direct: &Direct{}}, Boot{Script: &Script{}}
	for _, c := range []struct {
		name    string
		euid    int
		boot    Boot
		off     bool
		want    string
		wantRun bool
	}{
		{"root, direct: drops to the owner", 0, direct, false, "-sandbox on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny -runas 1001:1002", true},
		{"user, direct: nothing to drop", 1001, direct, false, "-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny", false},
		{"root, script: the script's QEMU keeps its user", 0, script, false, "-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny", false},
		{"sandbox off", 1001, direct, true, "", false},
	} {
		l := &Launcher{NoSandbox: c.off, Geteuid: func() int { return c.euid }}
		h := l.hardening(m, c.boot)
		if got := strings.Join(hardeningArgs(h), " "); got != c.want {
			t.Errorf("%s: got %q, want %q", c.name, got, c.want)
		}
	}
	// A network's guestfwd commands are programs QEMU spawns: the sandbox
	// allows exactly that, and nothing else changes.
	m.Network = &driver.Network{Addr: "10.0.2.100", ProxyPort: 3128}
	for euid, want := range map[int]string{
		0:    "-sandbox on,obsolete=deny,elevateprivileges=allow,spawn=allow,resourcecontrol=deny -runas 1001:1002",
		1001: "-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=allow,resourcecontrol=deny",
	} {
		l := &Launcher{Geteuid: func() int { return euid }}
		if got := strings.Join(hardeningArgs(l.hardening(m, direct)), " "); got != want {
			t.Errorf("euid %d with a network: got %q, want %q", euid, got, want)
		}
	}
	// The egress proxy drops to the owner whenever agent-vm is root, also
	// when a script's QEMU keeps root; never for a user agent-vm.
	for _, c := range []struct {
		euid int
		boot Boot
		want string
	}{{0, direct, "1001:1002"}, {0, script, "1001:1002"}, {1001, direct, "none"}} {
		l := &Launcher{Geteuid: func() int { return c.euid }}
		got := "none"
		if o := l.proxyOwner(m, l.hardening(m, c.boot)); o != nil {
			got = fmt.Sprintf("%d:%d", o.UID, o.GID)
		}
		if got != c.want {
			t.Errorf("euid %d, script %v: the proxy runs as %s, want %s", c.euid, c.boot.Script != nil, got, c.want)
		}
	}
	m.Network = nil
	// An owner that is unknown (0: a machine without its record) or root
	// is never a user to drop to.
	m.Share.UID = 0
	l := &Launcher{Geteuid: func() int { return 0 }}
	if h := l.hardening(m, direct); h.RunAs != nil || l.proxyOwner(m, h) != nil {
		t.Errorf("runas %+v, proxy %+v for an unknown owner", h.RunAs, l.proxyOwner(m, h))
	}
}

// FAKE runner at the exec boundary: a QEMU without seccomp says so, and
// the start fails before anything is launched.
func TestQEMUWithoutSeccompIsRefusedUpFront(t *testing.T) {
	f := execxtest.New(t).Installed("qemu-system-x86_64", "/usr/bin/qemu-system-x86_64")
	f.On("qemu-system-x86_64", func(c execxtest.Call) execxtest.Reply {
		if !strings.Contains(strings.Join(c.Args, " "), "-sandbox on,") || !strings.Contains(string(c.Stdin), "quit") {
			t.Errorf("probe %q stdin %q", c.Args, c.Stdin)
		}
		return execxtest.Reply{ExitCode: 1, Stderr: "qemu-system-x86_64: -sandbox on: There is no option group 'sandbox'"}
	})
	l := &Launcher{Run: f, Log: hclog.NewNullLogger(), Arch: Arch{Binary: "qemu-system-x86_64"}}
	m, _ := testMachineDirs(t)
	_, err := l.Start(context.Background(), m, Boot{Direct: &Direct{}}, StartOptions{Accel: "tcg"})
	if !errors.Is(err, ErrNoSandbox) || !strings.Contains(err.Error(), "no option group 'sandbox'") || !strings.Contains(err.Error(), "AGENT_VM_QEMU_SANDBOX=off") {
		t.Fatalf("got %v", err)
	}
	for _, c := range f.Calls() {
		if c.Detached {
			t.Errorf("something was launched: %s %q", c.Path, c.Args)
		}
	}
}

// testMachineDirs is a machine with real directories and no kernel.
func testMachineDirs(t *testing.T) (Machine, string) {
	dir := t.TempDir()
	m := sampleMachine()
	m.RunDir, m.LogsDir, m.SocketDir = dir+"/run", dir+"/logs", ""
	m.Forwards = nil
	return m, dir
}

// The host's real QEMU accepts the policy, with and without -runas.
func TestRealQEMUAcceptsTheSandbox(t *testing.T) {
	tu.Program(t, "qemu-system-x86_64")
	if err := CheckSandbox(context.Background(), execx.OS{}, "qemu-system-x86_64", Hardening{Sandbox: &SandboxPolicy{}}); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := CheckSandbox(context.Background(), execx.OS{}, "qemu-system-x86_64", sampleHardening()); err != nil {
			t.Fatal(err)
		}
		// QEMU 7.2 handles -runas after installing its filter: with
		// elevateprivileges=deny it dies, which the probe reports.
		bad := sampleHardening()
		bad.Sandbox = &SandboxPolicy{}
		if err := CheckSandbox(context.Background(), execx.OS{}, "qemu-system-x86_64", bad); !errors.Is(err, ErrNoSandbox) {
			t.Errorf("-runas under elevateprivileges=deny: got %v", err)
		}
	}
}
