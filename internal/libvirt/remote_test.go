package libvirt

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostlink/hostlinktest"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/testutil/libvirtd"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveAgentVMBinary()
	os.Exit(code)
}

// A machine placed on another host, for real: this machine reached through
// the remote path (a real sshd, agent-vm's link, agent-vm's binary copied
// there and run per verb, the system libvirtd), with the host's files
// under a directory of the test's own so nothing can take a local
// shortcut. No guest boots: the start stops where the workspace is missing
// on the host, after the image went into the host's pool.
func TestVerbsRunOnTheHost(t *testing.T) {
	testutil.Need(t, os.Geteuid() == 0, "the system libvirtd and sshd need root")
	libvirtd.ForTest(t)
	virsh := testutil.Program(t, libvirtd.Virsh)
	srv, _ := hostlinktest.Dial(t)
	// t.TempDir() is 0700, which libvirt's QEMU could not pass through:
	// the host's directory is refused there (checked below), and made in
	// a searchable one.
	hidden := filepath.Join(t.TempDir(), "agent-vm-host")
	top, err := os.MkdirTemp("", "agent-vm-remote-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(top) })
	if err := os.Chmod(top, 0o711); err != nil {
		t.Fatal(err)
	}
	hostDir := filepath.Join(top, "agent-vm-host")
	t.Cleanup(func() {
		pool := hostPoolName(hostDir)
		for _, args := range [][]string{{"pool-destroy", pool}, {"pool-undefine", pool}} {
			_ = exec.Command(virsh, append([]string{"-c", libvirtd.URI}, args...)...).Run()
		}
	})
	d := &Driver{Run: execx.OS{}, Log: hclog.NewNullLogger(), Executable: func() (string, error) { return testutil.AgentVMBinary(t), nil }}
	local := t.TempDir()
	netDir := filepath.Join(local, "net")
	if err := os.Mkdir(netDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(netDir, "policy.json"), []byte(`{"allow":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(local, "token")
	if err := os.WriteFile(token, []byte("s3cret-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := driver.Machine{Name: "agent-vm-remote-test", UUID: state.NewID(), CPUs: 1, MemoryMiB: 256,
		RunDir: filepath.Join(local, "run"), LogsDir: filepath.Join(local, "logs"),
		Share:       driver.Share{Source: filepath.Join(local, "workspace"), Tag: "workspace", UID: 1000, GID: 1000},
		Credentials: []driver.Credential{{Name: "token", File: token}},
		Network:     &driver.Network{Addr: "10.0.2.100", ProxyPort: 3128, Proxy: []string{"/local/agent-vm", "net-proxy", "--dir", netDir}, Dir: netDir},
		Remote:      &driver.Remote{Host: "test", Addr: srv.Addr, User: srv.User, KeyFile: srv.KeyFile, KnownHosts: srv.KnownHosts, Dir: hostDir}}
	ctx := context.Background()

	lv, err := d.Inspect(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	if lv.State != driver.StateStopped || lv.Launch != nil {
		t.Errorf("a machine never started on the host: %+v", lv)
	}
	if bins, _ := filepath.Glob(filepath.Join(hostDir, "bin", "agent-vm-*")); len(bins) != 1 {
		t.Errorf("agent-vm's binary on the host: %v, want one copy", bins)
	}
	if err := d.Stop(ctx, m, 0); !errors.Is(err, driver.ErrNotRunning) || !strings.Contains(err.Error(), "on host test") {
		t.Errorf("stopping a stopped machine on the host: %v, want driver.ErrNotRunning named by the host", err)
	}

	if err := d.Destroy(ctx, m); err != nil {
		t.Errorf("destroying a machine never started on the host (no pool there yet): %v", err)
	}

	img := Image{Version: "remote-test-" + m.UUID[:8], Format: "raw", Cmdline: "console=ttyS0"}
	for i, f := range []*string{&img.Disk, &img.Kernel, &img.Initrd} {
		*f = filepath.Join(local, "img-"+strconv.Itoa(i))
		if err := os.WriteFile(*f, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	seed := filepath.Join(local, "seed.iso")
	if err := os.WriteFile(seed, []byte("seed"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = d.Start(ctx, m, Boot{Image: img, DiskBytes: 1 << 30, Seed: seed, MAC: "52:54:00:12:34:56"}, driver.StartOptions{Accel: "tcg"})
	want := filepath.Join(hostDir, "vms", DomainName(m), "workspace")
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "is not on the host") {
		t.Fatalf("a start whose workspace is not on the host: %v, want it named (%s)", err, want)
	}
	for _, suffix := range []string{"disk.raw", "vmlinuz", "initrd.img"} {
		if _, err := os.Stat(filepath.Join(hostDir, "pool", img.Version+"-"+suffix)); err != nil {
			t.Errorf("the base image's %s is not in the host's pool: %v", suffix, err)
		}
	}
	vmDir := filepath.Join(hostDir, "vms", DomainName(m))
	if b, err := os.ReadFile(filepath.Join(vmDir, "net", "policy.json")); err != nil || string(b) != `{"allow":[]}` {
		t.Errorf("the proxy's policy on the host: %q, %v", b, err)
	}
	if creds, _ := filepath.Glob(filepath.Join(vmDir, "run", "creds-*")); len(creds) != 0 {
		t.Errorf("the credentials the start wrote on the host stayed: %v", creds)
	}
	if _, err := os.Stat(m.RunDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the start made the local run directory %s (%v): a remote machine's files are the host's", m.RunDir, err)
	}

	if err := d.Destroy(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(vmDir, "net", "policy.json")); err != nil {
		t.Errorf("Destroy (as reset uses it) removed the machine's files on the host: %v", err)
	}
	if err := d.RemoveFromHost(ctx, m); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(vmDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("RemoveFromHost left the machine's directory on the host: %v", err)
	}

	inHidden := m
	inHidden.Remote = &driver.Remote{Host: "test", Addr: srv.Addr, User: srv.User, KeyFile: srv.KeyFile, KnownHosts: srv.KnownHosts, Dir: hidden}
	if _, err := d.PrepareHost(ctx, inHidden); err == nil || !strings.Contains(err.Error(), "cannot pass through") {
		t.Errorf("a host directory inside a 0700 one: %v, want it refused with the reason", err)
	}

	unlinked := m
	unlinked.Remote = &driver.Remote{Host: "gone", Dir: hostDir}
	if _, err := d.Inspect(ctx, unlinked); err == nil || !strings.Contains(err.Error(), "host link gone") {
		t.Errorf("a machine on a host with no link: %v, want a hint to `host link`", err)
	}
}
