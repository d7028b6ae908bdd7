package vm_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/forward"
	"github.com/agent-vm/agent-vm/internal/gitws"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/template"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/vagrant"
	"github.com/agent-vm/agent-vm/internal/vagrantbackend"
	"github.com/agent-vm/agent-vm/internal/vm"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// TestForeignGuestLifecycle runs the real orchestration, the real vagrant
// backend and driver and real git, with a FAKE vagrant and virsh
// (execxtest, labelled) at the exec boundary, on a repository with its own
// Vagrantfile: start and resume wait for vagrant alone (no SSH wait, no
// agent-mcp, no holder: the fake fails on any program it was not told of,
// the holder's agent-vm included), exec refuses with the way in, so do
// port changes while it runs, suspend, stop and destroy go through
// vagrant, and the Vagrantfile is untouched.
func TestForeignGuestLifecycle(t *testing.T) {
	repo := tu.Repo(t, true)
	vf := filepath.Join(repo, "Vagrantfile")
	tu.WriteFile(t, vf, "Vagrant.configure(\"2\") { |c| c.vm.box = \"debian/bookworm64\" }\n")
	before, err := os.Stat(vf)
	if err != nil {
		t.Fatal(err)
	}
	machine := "not_created"
	fake := execxtest.New(t).On("vagrant", func(c execxtest.Call) execxtest.Reply {
		switch c.Args[0] {
		case "status":
			return execxtest.Reply{Stdout: "1,default,metadata,provider,libvirt\n1,default,provider-name,libvirt\n1,default,state," + machine + "\n"}
		case "up", "resume":
			machine = "running"
			// As vagrant does once it made the machine.
			for _, e := range c.Env {
				if dot, ok := strings.CutPrefix(e, "VAGRANT_DOTFILE_PATH="); ok {
					tu.WriteFile(t, filepath.Join(dot, "machines", "default", "libvirt", "id"), "5d2c")
				}
			}
		case "ssh-config":
			return execxtest.Reply{Stdout: "Host default\n  HostName 192.168.121.45\n  User vagrant\n  Port 22\n  UserKnownHostsFile /dev/null\n  StrictHostKeyChecking no\n  IdentityFile \"/a b/private_key\"\n"}
		case "suspend":
			machine = "paused"
		case "halt":
			machine = "shutoff"
		case "destroy":
			machine = "not_created"
		}
		return execxtest.Reply{Stdout: "==> default: " + c.Args[0] + "\n"}
	}).On("virsh", func(c execxtest.Call) execxtest.Reply {
		return execxtest.Reply{Stderr: "error: failed to get domain", ExitCode: 1}
	})
	root, err := state.Open(hostdir.StateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	log := hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: testWriter{t}})
	home := t.TempDir()
	m := vm.New(root, fake, log, []driver.Driver{&vagrant.Driver{Run: fake, Log: log, Home: home, QEMUUser: "agent-vm-no-such-user"}},
		&vagrantbackend.Backend{Run: fake, Log: log, Home: hostdir.Top(home, 0o755, hostdir.InSystem)})
	m.Git = gitws.New(execx.OS{})
	m.Accel = func(context.Context) accel.Result { return accel.Result{Accel: accel.TCG, Reason: "test"} }
	ctx := context.Background()

	rec, err := m.Create(ctx, vm.CreateOptions{Repo: repo, Branch: "feat", Backend: vm.BackendVagrant})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Guest.Foreign != vf {
		t.Fatalf("foreign %q, want %q", rec.Guest.Foreign, vf)
	}
	res, err := m.Start(ctx, "feat", vm.StartOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Info.State != vminfo.StateRunning || res.Info.Foreign != vf || res.Info.Agent.State != "none" || res.Info.Ports.SSH != 0 || res.Info.Share != "" {
		t.Errorf("after start: state %s, foreign %q, agent %s, ports %+v", res.Info.State, res.Info.Foreign, res.Info.Agent.State, res.Info.Ports)
	}
	cfg, err := m.SSHConfigFor(ctx, "feat")
	for _, want := range []string{"NO pinned host key", "Host agent-vm-feat\n", "  HostName 192.168.121.45\n", "  Port 22\n", "  User vagrant\n", "  IdentityFile \"/a b/private_key\"\n", "  stricthostkeychecking no\n"} {
		if err != nil || !strings.Contains(cfg, want) {
			t.Errorf("ssh-config lacks %q (%v):\n%s", want, err, cfg)
		}
	}
	var out strings.Builder
	if _, err := m.Exec(ctx, "feat", []string{"true"}, nil, &out, &out); err == nil || !strings.Contains(err.Error(), "pinned host key") || !strings.Contains(err.Error(), "agent-vm ssh-config feat") {
		t.Errorf("exec: %v", err)
	}
	// vagrant forwards what the Vagrantfile says: its driver is no
	// driver.Forwarder, so a running VM's forwards do not change.
	if _, err := forward.Add(ctx, m, "feat", 3000, 0, m.Log); !errors.Is(err, driver.ErrUnsupported) || !strings.Contains(err.Error(), "hint:") {
		t.Errorf("port add: %v", err)
	}
	l := root.Layout("feat")
	r, err := state.ReadRecord(l.Record())
	if err != nil {
		t.Fatal(err)
	}
	r.Forwards = append(r.Forwards, state.Forward{Guest: 3001, Host: 3001})
	if err := state.WriteRecord(l.Record(), r); err != nil {
		t.Fatal(err)
	}
	if _, err := forward.Remove(ctx, m, "feat", 3001, m.Log); !errors.Is(err, driver.ErrUnsupported) {
		t.Errorf("port rm: %v", err)
	}
	// Neither the vagrant backend nor its driver makes templates.
	if _, err := templates(m).Build(ctx, "feat", "none", template.Boot{}); err == nil || !strings.Contains(err.Error(), "only Debian (qemu backend) VMs start from templates") {
		t.Errorf("template build: %v", err)
	}
	if _, err := m.Suspend(ctx, "feat", vm.SuspendOptions{}); err != nil {
		t.Fatal(err)
	}
	if res, err = m.Resume(ctx, "feat", vm.StartOptions{}); err != nil || !res.Resumed || res.Info.State != vminfo.StateRunning {
		t.Fatalf("resume: %+v, %v", res, err)
	}
	if _, err := m.Stop(ctx, "feat"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Destroy(ctx, "feat", false); err != nil {
		t.Fatal(err)
	}
	var verbs []string
	for _, c := range fake.Calls() {
		if c.Path == "vagrant" && c.Args[0] != "status" {
			verbs = append(verbs, strings.Join(c.Args, " "))
		}
	}
	want := "up --no-color default|ssh-config --no-color default|suspend --no-color default|resume --no-color default|halt --no-color default|destroy -f --no-color default"
	if got := strings.Join(verbs, "|"); got != want {
		t.Errorf("vagrant verbs:\n got %s\nwant %s", got, want)
	}
	after, err := os.Stat(vf)
	if err != nil || !after.ModTime().Equal(before.ModTime()) || after.Size() != before.Size() {
		t.Errorf("the repository's Vagrantfile changed: %v", err)
	}
}
