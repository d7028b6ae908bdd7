package qemu

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/driver"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
)

// render puts one option and its value per line, for readable diffs.
func render(argv []string) string {
	var b strings.Builder
	for i := 0; i < len(argv); i++ {
		b.WriteString(argv[i])
		if strings.HasPrefix(argv[i], "-") && i+1 < len(argv) && !strings.HasPrefix(argv[i+1], "-") {
			b.WriteString(" " + argv[i+1])
			i++
		}
		b.WriteString("\n")
	}
	return b.String()
}

func sampleMachine() Machine {
	return Machine{Machine: driver.Machine{
		Name: "agent-vm-feature-x", UUID: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9", CPUs: 2, MemoryMiB: 1024,
		RunDir: "/state/feature-x/run", LogsDir: "/state/feature-x/logs",
		Share:       driver.Share{Source: "/state/feature-x/workspace", Tag: "workspace"},
		Forwards:    []driver.Forward{{Name: "ssh", Host: 2222, Guest: 22}, {Name: "mcp", Host: 8000, Guest: 8000}},
		Credentials: []driver.Credential{{Name: "agent-vm.mcp-token", File: "/state/feature-x/secrets/mcp-token"}},
		Network: &driver.Network{Addr: "10.0.2.100", ProxyPort: 3128, Exposed: []int{4599},
			Proxy: []string{"/usr/bin/agent-vm", "net-proxy"}, Relay: []string{"/usr/bin/agent-vm", "net-relay"}},
	}}
}

func TestDirectArgvGolden(t *testing.T) {
	a, _ := ArchFor("amd64")
	d := &Direct{
		Disks:  []Disk{{Path: "/state/feature-x/disk.qcow2", Format: "qcow2"}, {Path: "/state/feature-x/seed.iso", Format: "raw", ReadOnly: true}},
		Kernel: "/cache/images/debian-bookworm/vmlinuz", Initrd: "/cache/images/debian-bookworm/initrd.img",
		Append: "root=/dev/vda rw console=ttyS0,115200",
		MAC:    "52:54:00:12:34:56",
	}
	tu.Golden(t, filepath.Join("testdata", "direct-tcg-virtiofs.golden"), []byte(render(DirectArgv(a, sampleMachine(), d, "tcg", driver.ShareVirtiofs, sampleHardening()))))
	tu.Golden(t, filepath.Join("testdata", "direct-kvm-9p.golden"), []byte(render(DirectArgv(a, sampleMachine(), &Direct{Disks: d.Disks}, "kvm", driver.Share9p, userHardening()))))
}

func TestScriptArgsGolden(t *testing.T) {
	tu.Golden(t, filepath.Join("testdata", "script-tcg-virtiofs.golden"), []byte(render(ScriptArgs(sampleMachine(), "tcg", driver.ShareVirtiofs, userHardening()))))
	tu.Golden(t, filepath.Join("testdata", "script-kvm-virtiofs.golden"), []byte(render(ScriptArgs(sampleMachine(), "kvm", driver.ShareVirtiofs, userHardening()))))
	// The run script brings its own shared memory (qemu-vm.nix's
	// enableSharedMemory); a second backend would clash.
	if a := strings.Join(ScriptArgs(sampleMachine(), "kvm", driver.ShareVirtiofs, Hardening{}), " "); strings.Contains(a, "memory-backend") || strings.Contains(a, "-numa") {
		t.Errorf("script args add a memory backend: %s", a)
	}
}

func TestForwardsBindLoopbackOnly(t *testing.T) {
	for _, a := range netArgs(sampleMachine(), "") {
		if strings.Contains(a, "hostfwd") {
			for _, rule := range strings.Split(a, ",")[2:] {
				if strings.HasPrefix(rule, "hostfwd=") && !strings.HasPrefix(rule, "hostfwd=tcp:127.0.0.1:") {
					t.Errorf("forward %q is not bound to 127.0.0.1", rule)
				}
			}
		}
	}
}

func TestCommasInPathsAreEscaped(t *testing.T) {
	m := sampleMachine()
	m.Share.Source = "/home/a,b/ws"
	got := strings.Join(shareArgs(driver.Share9p, m.Share, "", ""), " ")
	if !strings.Contains(got, "path=/home/a,,b/ws,") {
		t.Errorf("comma not escaped: %s", got)
	}
}

func TestSharedMemoryMatchesGuestMemory(t *testing.T) {
	argv := strings.Join(DirectArgv(Arch{Binary: "q", Machine: "q35"}, sampleMachine(), &Direct{}, "tcg", driver.ShareVirtiofs, Hardening{}), " ")
	if !strings.Contains(argv, "-m 1024M") || !strings.Contains(argv, "size=1024M,share=on") {
		t.Errorf("memfd size must equal -m: %s", argv)
	}
	if strings.Contains(strings.Join(DirectArgv(Arch{}, sampleMachine(), &Direct{}, "tcg", driver.Share9p, Hardening{}), " "), "memory-backend") {
		t.Error("9p needs no shared memory backend")
	}
}

func TestSocketDirForLongPaths(t *testing.T) {
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	short := "/s/run"
	if d := SocketDirFor(short, "0f1e2d3c-4b5a"); d != short {
		t.Errorf("short run dir moved: %s", d)
	}
	long := "/" + strings.Repeat("x", 120) + "/run"
	m := Machine{Machine: driver.Machine{RunDir: long}, SocketDir: SocketDirFor(long, "0f1e2d3c-4b5a-4978-8695")}
	if _, err := os.Stat(m.SocketDir); !os.IsNotExist(err) {
		t.Errorf("SocketDirFor created %s; only Start may", m.SocketDir)
	}
	if err := ensureSocketDir(m); err != nil {
		t.Fatal(err)
	}
	if len(filepath.Join(m.SocketDir, VirtiofsdSock)) > maxSocketPath {
		t.Errorf("socket dir %s still too long", m.SocketDir)
	}
	fi, _ := os.Stat(m.SocketDir)
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("socket dir mode %v", fi.Mode().Perm())
	}
	// A shared parent someone else could write is refused.
	os.Chmod(filepath.Dir(m.SocketDir), 0o777)
	if err := ensureSocketDir(m); err == nil {
		t.Error("a world-writable socket parent was accepted")
	}
}

// A VM that stopped leaves no socket directory outside its run directory:
// a template's VM is saved and kept, never destroyed, so nothing later
// would remove it. The run directory itself stays.
func TestCleanupRemovesTheSocketDirOutsideTheRunDir(t *testing.T) {
	short, err := os.MkdirTemp("", "av") // t.TempDir's name is too long for sockets
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(short) })
	t.Setenv("XDG_RUNTIME_DIR", short)
	run := filepath.Join(t.TempDir(), strings.Repeat("x", 120), "run")
	if err := os.MkdirAll(run, 0o700); err != nil {
		t.Fatal(err)
	}
	m := Machine{Machine: driver.Machine{RunDir: run, UUID: "0f1e2d3c-4b5a-4978-8695"}, SocketDir: SocketDirFor(run, "0f1e2d3c-4b5a-4978-8695")}
	if m.SocketDir == run {
		t.Fatalf("the run dir %s is short enough for its sockets: the test needs one that is not", run)
	}
	if err := ensureSocketDir(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(m.QMPPath(), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	(&Launcher{}).cleanup(m)
	if _, err := os.Stat(m.SocketDir); !os.IsNotExist(err) {
		t.Errorf("the socket dir %s is left after cleanup: %v", m.SocketDir, err)
	}
	if _, err := os.Stat(run); err != nil {
		t.Errorf("cleanup removed the run dir: %v", err)
	}
}

func TestUnescUndoesEsc(t *testing.T) {
	for _, s := range []string{"", "plain", "a,b", ",lead", "trail,", "a,,b", "/x,y/qmp.sock"} {
		for _, rest := range []string{"", ",server=on,wait=off"} {
			if got := unesc(esc(s) + rest); got != s {
				t.Errorf("unesc(%q): got %q, want %q", esc(s)+rest, got, s)
			}
		}
	}
}

// A contained machine's netdev is restricted and its only ways out are its
// guestfwd rules: the proxy and each exposed port, through the relay.
func TestNetworkIsContained(t *testing.T) {
	m := sampleMachine()
	got := strings.Join(netArgs(m, ""), " ")
	for _, want := range []string{",restrict=on,",
		",guestfwd=tcp:10.0.2.100:3128-cmd:/usr/bin/agent-vm net-relay /state/feature-x/run/egress.sock,",
		",guestfwd=tcp:10.0.2.100:4599-cmd:/usr/bin/agent-vm net-relay /state/feature-x/run/exposed.sock 4599 "} {
		if !strings.Contains(got+" ", want) {
			t.Errorf("netdev %s lacks %q", got, want)
		}
	}
	if n := strings.Count(got, "guestfwd="); n != 2 {
		t.Errorf("%d guestfwd rules, want 2 (the proxy and one exposed port): %s", n, got)
	}
	opts := ScriptNetOpts(m, &Script{Forwarded: []int{2222, 8000}})
	if want := "restrict=on,guestfwd=tcp:10.0.2.100:3128-cmd:/usr/bin/agent-vm net-relay /state/feature-x/run/egress.sock," +
		"guestfwd=tcp:10.0.2.100:4599-cmd:/usr/bin/agent-vm net-relay /state/feature-x/run/exposed.sock 4599"; opts != want {
		t.Errorf("ScriptNetOpts = %q\nwant %q", opts, want)
	}
	m.Network = nil
	if got := strings.Join(netArgs(m, ""), " "); strings.Contains(got, "restrict") || strings.Contains(got, "guestfwd") {
		t.Errorf("a machine without a Network got %s", got)
	}
}

func TestCheckNetwork(t *testing.T) {
	for name, change := range map[string]func(n *driver.Network){
		"space in the relay": func(n *driver.Network) { n.Relay = []string{"/opt/my tools/agent-vm", "net-relay"} },
		"quote":              func(n *driver.Network) { n.Relay = []string{"/opt/it's/agent-vm", "net-relay"} },
		"proxy port exposed": func(n *driver.Network) { n.Exposed = []int{3128} },
		"no proxy":           func(n *driver.Network) { n.Proxy = nil },
	} {
		m := sampleMachine()
		change(m.Network)
		if err := checkNetwork(m); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := checkNetwork(sampleMachine()); err != nil {
		t.Errorf("the sample network: %v", err)
	}
}

// Under TCG the guest's kernel gets norandmaps, on a Direct boot's command
// line and through a run script's QEMU_KERNEL_PARAMS; under KVM neither.
func TestTCGGuestsKeepTheirProcessesMapsInPlace(t *testing.T) {
	a, _ := ArchFor("amd64")
	d := &Direct{Kernel: "/k/vmlinuz", Append: "root=/dev/vda"}
	for accel, want := range map[string]string{"tcg": "root=/dev/vda norandmaps", "kvm": "root=/dev/vda"} {
		argv := DirectArgv(a, sampleMachine(), d, accel, driver.ShareVirtiofs, Hardening{})
		i := slices.Index(argv, "-append")
		if i < 0 || argv[i+1] != want {
			t.Errorf("%s: -append %v, want %q", accel, argv, want)
		}
		s := &Script{Path: "/nix/store/x-run-vm", Env: []string{"PATH=/bin"}}
		env := (&Launcher{}).detached(sampleMachine(), Boot{Script: s}, accel, driver.ShareVirtiofs, Hardening{}, false).Env
		has := slices.Contains(env, "QEMU_KERNEL_PARAMS=norandmaps")
		if has != (accel == "tcg") {
			t.Errorf("%s: the script's environment %v", accel, env)
		}
		if len(s.Env) != 1 {
			t.Errorf("the script's own environment was changed: %v", s.Env)
		}
	}
}
