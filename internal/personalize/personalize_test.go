package personalize

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// fakeKernel is a FAKE Kernel: it records what Apply asked of the
// kernel (the real one is Linux; the real boots of internal/vm's
// TestTemplate run it in a guest).
type fakeKernel struct {
	entropy  []byte
	hostname string
	signals  []string
	onSignal func() // sshd re-executing itself
}

func (k *fakeKernel) AddEntropy(b []byte) error     { k.entropy = b; return nil }
func (k *fakeKernel) SetHostname(name string) error { k.hostname = name; return nil }
func (k *fakeKernel) Signal(pid int, s syscall.Signal) error {
	k.signals = append(k.signals, s.String()+" "+strconv.Itoa(pid))
	if k.onSignal != nil {
		k.onSignal()
	}
	return nil
}

// guestRoot is a directory laid out as a restored template guest's.
func guestRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for path, content := range map[string]string{
		"/etc/ssh/ssh_host_ed25519_key":   "template private",
		"/etc/ssh/ssh_host_rsa_key":       "template rsa",
		"/etc/ssh/sshd_config":            "keep",
		"/etc/hosts":                      "127.0.0.1 localhost\n127.0.1.1 t-template\n::1 localhost",
		"/etc/machine-id":                 "0123456789abcdef0123456789abcdef\n",
		"/var/lib/dbus/machine-id":        "0123456789abcdef0123456789abcdef\n",
		"/sys/fw_cfg/raw":                 "the-vm-token\n",
		"/run/sshd.pid":                   "7\n",
		"/home/dev/.ssh/authorized_keys":  "template key\n",
		"/var/lib/cloud/data/instance-id": "template-0\n",
		"/proc/net/tcp":                   netTCP("111"),
	} {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func samplePlan() Plan {
	return Plan{
		Entropy: bytes.Repeat([]byte{7}, 32),
		Remove:  []string{"/etc/ssh/ssh_host_*"},
		Dirs:    []Entry{{Path: "/home/dev/.claude", UID: 4242, GID: 4343, Mode: 0o755}},
		Files: []Entry{
			{Path: "/etc/ssh/ssh_host_ed25519_key", Mode: 0o600, Content: []byte("vm private\n")},
			{Path: "/home/dev/.ssh/authorized_keys", UID: 4242, GID: 4343, Mode: 0o600, Content: []byte("vm key\n")},
			{Path: "/home/dev/.claude/CLAUDE.md", UID: 4242, GID: 4343, Mode: 0o644, Content: []byte("notes")},
		},
		Hostname:    "feat-x",
		Token:       Copy{From: "/sys/fw_cfg/raw", To: "/run/agent-vm/mcp-token"},
		Restart:     []string{"systemd-journald"},
		SSHDPidFile: "/run/sshd.pid",
		SSHDPort:    22,
	}
}

// Apply on a directory laid out as a guest, as root (owners are set), with
// the kernel and systemctl FAKE (recorded).
func TestApply(t *testing.T) {
	testutil.Need(t, os.Geteuid() == 0, "sets files' owners: runs as root (as CI does)")
	root := guestRoot(t)
	// sshd listens on a new socket once it has re-executed itself; Apply
	// waits for that (were it not to see it, the hour-long wait would
	// outlast the context, an error).
	k := &fakeKernel{onSignal: func() {
		if err := os.WriteFile(filepath.Join(root, "/proc/net/tcp"), []byte(netTCP("222")), 0o644); err != nil {
			t.Error(err)
		}
	}}
	run := execxtest.New(t).On("systemctl", func(execxtest.Call) execxtest.Reply { return execxtest.Reply{} })
	a := Applier{Root: root, Kernel: k, Run: run, SSHDWait: time.Hour}
	p := samplePlan()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.Apply(ctx, p); err != nil {
		t.Fatal(err)
	}
	read := func(path string) string {
		b, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	owner := func(path string) (int, int, os.FileMode) {
		fi, err := os.Stat(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return int(st.Uid), int(st.Gid), fi.Mode()
	}
	if _, err := os.Stat(filepath.Join(root, "/etc/ssh/ssh_host_rsa_key")); err == nil {
		t.Error("the template's RSA host key is still there")
	}
	if got := read("/etc/ssh/ssh_host_ed25519_key"); got != "vm private\n" {
		t.Errorf("host key %q", got)
	}
	if u, g, m := owner("/etc/ssh/ssh_host_ed25519_key"); u != 0 || g != 0 || m != 0o600 {
		t.Errorf("host key %d:%d %v", u, g, m)
	}
	if u, g, m := owner("/home/dev/.ssh/authorized_keys"); u != 4242 || g != 4343 || m != 0o600 || read("/home/dev/.ssh/authorized_keys") != "vm key\n" {
		t.Errorf("authorized_keys %d:%d %v", u, g, m)
	}
	if u, g, m := owner("/home/dev/.claude"); u != 4242 || g != 4343 || m != os.ModeDir|0o755 {
		t.Errorf("guidance dir %d:%d %v", u, g, m)
	}
	if read("/etc/ssh/sshd_config") != "keep" {
		t.Error("a file outside the plan changed")
	}
	id := read("/etc/machine-id")
	if id == "0123456789abcdef0123456789abcdef\n" || len(id) != 33 || read("/var/lib/dbus/machine-id") != id {
		t.Errorf("machine-id %q, D-Bus' %q", id, read("/var/lib/dbus/machine-id"))
	}
	if got := read("/etc/hosts"); got != "127.0.0.1 localhost\n::1 localhost\n127.0.1.1 feat-x\n" {
		t.Errorf("/etc/hosts:\n%s", got)
	}
	if read("/etc/hostname") != "feat-x\n" || k.hostname != "feat-x" {
		t.Errorf("hostname: file %q, kernel %q", read("/etc/hostname"), k.hostname)
	}
	if u, _, m := owner("/run/agent-vm/mcp-token"); read("/run/agent-vm/mcp-token") != "the-vm-token\n" || u != 0 || m != 0o600 {
		t.Errorf("token %q %v", read("/run/agent-vm/mcp-token"), m)
	}
	if !bytes.Equal(k.entropy, p.Entropy) {
		t.Error("the entropy did not reach the kernel")
	}
	if strings.Join(k.signals, ",") != "hangup 7" {
		t.Errorf("signals %v, want sshd (pid 7) a hangup", k.signals)
	}
	calls := run.Calls()
	if len(calls) != 1 || strings.Join(calls[0].Args, " ") != "restart --no-block systemd-journald" {
		t.Errorf("programs run: %+v", calls)
	}

	// A second clone of the same template gets another machine-id. Its
	// sshd never shows a new socket: past the wait, no error.
	root2 := guestRoot(t)
	if err := (Applier{Root: root2, Kernel: &fakeKernel{}, Run: run, SSHDWait: 50 * time.Millisecond}).Apply(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root2, "/etc/machine-id")); string(b) == id {
		t.Error("two clones got the same machine-id")
	}
}

// Each failure names what is wrong; a plan that is wrong in itself is
// refused before anything changes.
func TestApplyFailures(t *testing.T) {
	for name, tc := range map[string]struct {
		edit func(root string, p *Plan)
		want string
	}{
		"little entropy": {func(_ string, p *Plan) { p.Entropy = p.Entropy[:8] }, "8 bytes of entropy"},
		"bad hostname":   {func(_ string, p *Plan) { p.Hostname = "a b" }, `hostname "a b"`},
		"no token": {func(root string, _ *Plan) { os.Remove(filepath.Join(root, "/sys/fw_cfg/raw")) },
			"no MCP token in fw_cfg (/sys/fw_cfg/raw)"},
		"empty token": {func(root string, _ *Plan) { os.WriteFile(filepath.Join(root, "/sys/fw_cfg/raw"), []byte("\n"), 0o600) },
			"it is empty"},
		"no sshd pid": {func(root string, _ *Plan) { os.WriteFile(filepath.Join(root, "/run/sshd.pid"), []byte("x"), 0o600) },
			`/run/sshd.pid holds "x"`},
	} {
		t.Run(name, func(t *testing.T) {
			root := guestRoot(t)
			p := samplePlan()
			p.Dirs, p.Files = nil, nil // owners need root; not what this test is about
			tc.edit(root, &p)
			run := execxtest.New(t).
				On("systemctl", func(execxtest.Call) execxtest.Reply { return execxtest.Reply{} }).
				On("modprobe", func(execxtest.Call) execxtest.Reply { return execxtest.Reply{ExitCode: 1} })
			err := Applier{Root: root, Kernel: &fakeKernel{}, Run: run}.Apply(context.Background(), p)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
			if (name == "little entropy" || name == "bad hostname") && read(t, root, "/etc/machine-id") != "0123456789abcdef0123456789abcdef\n" {
				t.Error("a refused plan changed the machine-id")
			}
			if name == "no token" {
				if c := run.Calls(); len(c) != 1 || c[0].Path != "modprobe" {
					t.Errorf("a missing fw_cfg file: programs run %+v, want modprobe qemu_fw_cfg first", c)
				}
			}
		})
	}
}

func read(t *testing.T, root, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// netTCP is /proc/net/tcp with sshd listening on port 22 (socket inode
// ino) and a connection to it.
func netTCP(ino string) string {
	return "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n" +
		"   0: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 " + ino + " 1 0000000000000000 100 0 0 10 0\n" +
		"   1: 0F02000A:0016 0202000A:D1D2 01 00000000:00000000 02:000AB3F7 00000000     0        0 999 2 0000000000000000 20 4 30 10 -1\n"
}
