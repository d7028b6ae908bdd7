package libvirtd

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
)

// FAKE at the exec boundary: virsh answers, so the fixture uses the running
// libvirtd, starts nothing and stops nothing.
func TestStartUsesALibvirtdThatAnswers(t *testing.T) {
	f := execxtest.New(t).On("virsh", func(c execxtest.Call) execxtest.Reply {
		if strings.Join(c.Args, " ") != "-c qemu:///system version" {
			t.Errorf("virsh %q", c.Args)
		}
		return execxtest.Reply{Stdout: "Running hypervisor: QEMU 7.2.22\n"}
	})
	d, err := Start(context.Background(), Options{Run: f, LogDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if d.Started || d.Version != "Running hypervisor: QEMU 7.2.22" {
		t.Errorf("got started %v, version %q; want a daemon not started here", d.Started, d.Version)
	}
	if err := d.Stop(context.Background()); err != nil {
		t.Error(err)
	}
	if n := len(f.Calls()); n != 1 {
		t.Errorf("%d calls, want only virsh version: %+v", n, f.Calls())
	}
}

// FAKE at the exec boundary: nothing answers and the daemon the fixture
// starts exits at once; the error names it, quotes its log and says what
// to look at.
func TestStartReportsADaemonThatExits(t *testing.T) {
	f := execxtest.New(t).
		On("virsh", func(execxtest.Call) execxtest.Reply {
			return execxtest.Reply{ExitCode: 1, Stderr: "error: Failed to connect socket to '/var/run/libvirt/libvirt-sock': No such file or directory"}
		}).
		On("virtlogd", func(c execxtest.Call) execxtest.Reply {
			return execxtest.Reply{ExitCode: 0}
		}).
		On("libvirtd", func(c execxtest.Call) execxtest.Reply {
			if err := os.WriteFile(c.Stdout, []byte("error : main:1234 : Unable to obtain pidfile\n"), 0o600); err != nil {
				t.Error(err)
			}
			return execxtest.Reply{ExitCode: 1}
		})
	logs := t.TempDir()
	_, err := Start(context.Background(), Options{Run: f, LogDir: logs, Timeout: 5 * time.Second, Root: t.TempDir()})
	if err == nil {
		t.Fatal("Start succeeded with no libvirtd answering")
	}
	if os.Geteuid() != 0 {
		if !strings.Contains(err.Error(), "only root can start") || !strings.Contains(err.Error(), "hint:") {
			t.Errorf("as non-root: %v", err)
		}
		return
	}
	for _, want := range []string{"exited", "Unable to obtain pidfile", filepath.Join(logs, "libvirtd.log"), "hint:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// live reads the networks and domains a libvirtd runs from their status
// files, so Stop can leave a previous daemon's alone.
func TestLiveReadsStatusFiles(t *testing.T) {
	root := t.TempDir()
	for _, p := range []string{"run/libvirt/network/vagrant-libvirt.xml", "run/libvirt/network/vagrant-libvirt.pid", "run/libvirt/qemu/proj_default.xml"} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d := &Daemon{opts: Options{Root: root}}
	if got := d.live("network"); len(got) != 1 || got[0] != "vagrant-libvirt" {
		t.Errorf("networks %q, want [vagrant-libvirt]", got)
	}
	if got := d.live("qemu"); len(got) != 1 || got[0] != "proj_default" {
		t.Errorf("domains %q, want [proj_default]", got)
	}
}
