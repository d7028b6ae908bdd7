package wire

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/hostsetup"
	"github.com/agent-vm/agent-vm/internal/qemu"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vagrant"
	"github.com/agent-vm/agent-vm/internal/vagrantbackend"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// What a new machine runs (setup opens the manager, a qemu VM probes the
// accelerator and finds or pulls the base image, image prune opens the
// templates, a vagrant VM makes its handoff directory, VAGRANT_HOME and,
// for a qemu VM dropping to the workspace's owner, the egress directory)
// makes every well-known directory with the table's mode, in whichever
// order it comes, under any umask, and after an older agent-vm left them
// with other modes. Nothing boots: the steps make what a boot would make
// first, with the entries the manager hands its packages.
func TestHostDirsComeOutAsTheTableSaysInAnyOrder(t *testing.T) {
	tu.Need(t, os.Geteuid() == 0, "/var/lib/agent-vm and the egress directory are root's")
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })

	const (
		open    = "open the manager (setup)"
		probe   = "probe the accelerator"
		pull    = "pull an image"
		prune   = "prune images (opens the templates)"
		handoff = "make the vagrant handoff directory"
		home    = "make VAGRANT_HOME"
		egress  = "make the egress directory"
	)
	for _, c := range []struct {
		name  string
		older bool // /var/lib/agent-vm and the cache as the registry and the probe made them before
		steps []string
	}{
		{"setup first", false, []string{open, probe, pull, prune, egress, handoff, home}},
		{"vagrant's directories first", false, []string{handoff, home, egress, open, pull, prune, probe}},
		{"after an older agent-vm", true, []string{open, probe, pull, prune, egress, handoff, home}},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			roots := hostdir.Roots{Lib: filepath.Join(base, "var", "lib", "agent-vm"), Egress: filepath.Join(base, "run", "agent-vm-egress"),
				Cache: filepath.Join(base, "home", ".cache", "agent-vm")}
			env := map[string]string{"HOME": filepath.Join(base, "home")}
			getenv := func(k string) string { return env[k] }
			dirs := hostdir.NewTable(roots, getenv, os.Geteuid())
			state := hostdir.StateDir(filepath.Join(base, "home", ".local", "share", "agent-vms"))
			if c.older {
				for _, d := range []string{dirs.Registry.Path, roots.Cache} {
					if err := os.MkdirAll(d, 0o700); err != nil {
						t.Fatal(err)
					}
				}
			}
			want := map[string]fs.FileMode{state.Path: 0o700}
			for _, d := range []string{".locks", ".tmp", ".trash"} {
				want[filepath.Join(state.Path, d)] = 0o700
			}
			for _, d := range []*hostdir.Dir{dirs.Lib, dirs.Registry, dirs.VagrantHome, dirs.Handoff, dirs.Egress, dirs.Cache, dirs.Templates, dirs.Images} {
				want[d.Path] = d.Mode
			}
			var m *vm.Manager
			ctx := context.Background()
			for _, step := range c.steps {
				var err error
				switch step {
				case open:
					m, err = Open(Config{StateDir: state.Path, Getenv: getenv, Roots: roots, Run: execxtest.New(t)})
					if err == nil {
						checkWiring(t, m, dirs)
					}
				case probe:
					p := Prober(m, "qemu-system-x86_64")
					p.Device = filepath.Join(base, "kvm") // a device that opens; no kernel: no QEMU runs, the result is cached
					p.Kernels = nil
					if err := os.WriteFile(p.Device, nil, 0o600); err != nil {
						t.Fatal(err)
					}
					p.Probe(ctx)
					if _, err := os.Stat(filepath.Join(roots.Cache, accel.CacheFile)); err != nil {
						t.Errorf("the probe cached nothing: %v", err)
					}
				case pull:
					cancelled, cancel := context.WithCancel(ctx)
					cancel() // the store is opened; nothing is fetched
					_, _ = m.Host.PullImage(cancelled, hostsetup.ImagePullOptions{Name: "debian-12", BaseURL: "http://127.0.0.1:1/"})
				case prune:
					_, err = m.Host.PruneImages(ctx)
				case handoff:
					err = dirs.Handoff.Make()
				case home:
					err = dirs.VagrantHome.Make()
				case egress:
					err = dirs.Egress.Make()
				}
				if err != nil {
					t.Fatalf("%s: %v", step, err)
				}
				if !c.older { // an older agent-vm's directory is set right by the first step that uses it
					checkModes(t, "after "+step, want, false)
				}
			}
			checkModes(t, "in the end", want, true)
		})
	}
}

// checkModes: each of want's directories that exists (all of them, with
// all) is a directory of this user with its mode.
func checkModes(t *testing.T, when string, want map[string]fs.FileMode, all bool) {
	t.Helper()
	for p, mode := range want {
		fi, err := os.Lstat(p)
		if err != nil {
			if all || !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s: %s: %v", when, p, err)
			}
			continue
		}
		if uid := int(fi.Sys().(*syscall.Stat_t).Uid); fi.Mode().Perm() != mode || !fi.IsDir() || uid != os.Geteuid() {
			t.Errorf("%s: %s: %v, uid %d; want a directory of uid %d with %04o", when, p, fi.Mode(), uid, os.Geteuid(), mode)
		}
	}
}

// checkWiring: the manager hands each package the table's entry.
func checkWiring(t *testing.T, m *vm.Manager, dirs hostdir.Table) {
	t.Helper()
	vd := m.Drivers[vagrant.DriverName].(*vagrant.Driver)
	vb := m.Backends[vagrantbackend.Name].(*vagrantbackend.Backend)
	launcher := m.Drivers[qemu.DriverName].(*qemu.Driver).Launcher
	for _, c := range []struct{ name, got, want string }{
		{"the vagrant driver's handoff directory", vd.Handoff.Path, dirs.Handoff.Path},
		{"the vagrant driver's VAGRANT_HOME", vd.Home, dirs.VagrantHome.Path},
		{"the vagrant backend's VAGRANT_HOME", vb.Home.Path, dirs.VagrantHome.Path},
		{"the launcher's egress directory", launcher.Egress.Path, dirs.Egress.Path},
		{"the registry", m.Registry.Dir.Path, dirs.Registry.Path},
		{"the templates", m.TemplateDir.Path, dirs.Templates.Path},
		{"the image cache", m.ImageDir(), dirs.Images.Path},
	} {
		if c.got != c.want {
			t.Errorf("%s is %s, want %s", c.name, c.got, c.want)
		}
	}
}
