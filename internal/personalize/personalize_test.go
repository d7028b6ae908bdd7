package personalize

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
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
}

func (k *fakeKernel) AddEntropy(b []byte) error     { k.entropy = b; return nil }
func (k *fakeKernel) SetHostname(name string) error { k.hostname = name; return nil }
func (k *fakeKernel) Signal(pid int, s syscall.Signal) error {
	k.signals = append(k.signals, s.String()+" "+strconv.Itoa(pid))
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
		"/home/dev/.ssh/authorized_keys":  "template key\n",
		"/var/lib/cloud/data/instance-id": "template-0\n",
		// sshd's listener (470) with two connections: one saved with the
		// template (520 and its child 534) and the caller's (1092, whose
		// descendant 1200 applies the plan); an unrelated process (600)
		// whose name has a parenthesis and spaces.
		"/run/sshd.pid":   "470\n",
		"/proc/1/stat":    "1 (systemd) S 0 1 1 0",
		"/proc/470/stat":  "470 (sshd) S 1 470 470 0",
		"/proc/520/stat":  "520 (sshd) S 470 520 520 0",
		"/proc/534/stat":  "534 (sshd) S 520 520 520 0",
		"/proc/1092/stat": "1092 (sshd) S 470 1092 1092 0",
		"/proc/1100/stat": "1100 (sshd) S 1092 1092 1092 0",
		"/proc/1150/stat": "1150 (sudo) S 1100 1150 1150 0",
		"/proc/1200/stat": "1200 (agent-vm) R 1150 1150 1150 0",
		"/proc/600/stat":  "600 (a) b (470) S 1 1 1 0",
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
	}
}

// Apply on a directory laid out as a guest, as root (owners are set), with
// the kernel and systemctl FAKE (recorded).
func TestApply(t *testing.T) {
	testutil.Need(t, os.Geteuid() == 0, "sets files' owners: runs as root (as CI does)")
	root := guestRoot(t)
	k := &fakeKernel{}
	run := execxtest.New(t).On("systemctl", func(execxtest.Call) execxtest.Reply { return execxtest.Reply{} })
	a := Applier{Root: root, Kernel: k, Run: run, Self: 1200}
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
	if !slices.Equal(k.signals, []string{"terminated 520"}) {
		t.Errorf("signals %v, want the template's connection (sshd 520) alone ended", k.signals)
	}
	calls := run.Calls()
	if len(calls) != 1 || strings.Join(calls[0].Args, " ") != "restart --no-block systemd-journald" {
		t.Errorf("programs run: %+v", calls)
	}

	// A second clone of the same template gets another machine-id.
	root2 := guestRoot(t)
	if err := (Applier{Root: root2, Kernel: &fakeKernel{}, Run: run}).Apply(context.Background(), p); err != nil {
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
