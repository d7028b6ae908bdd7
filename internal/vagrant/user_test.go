package vagrant

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

func TestFindUserVagrantfile(t *testing.T) {
	repo := t.TempDir()
	if _, ok, err := FindUserVagrantfile(repo); ok || err != nil {
		t.Fatalf("no Vagrantfile: ok %v, err %v", ok, err)
	}
	vf := filepath.Join(repo, "Vagrantfile")
	testutil.WriteFile(t, vf, "Vagrant.configure(\"2\") {}\n")
	if p, ok, err := FindUserVagrantfile(repo); !ok || err != nil || p != vf {
		t.Fatalf("a plain Vagrantfile: %q %v %v", p, ok, err)
	}

	// A symlink inside the repository is followed.
	in := t.TempDir()
	testutil.WriteFile(t, filepath.Join(in, "vagrant", "Vagrantfile.dev"), "x")
	if err := os.Symlink("vagrant/Vagrantfile.dev", filepath.Join(in, "Vagrantfile")); err != nil {
		t.Fatal(err)
	}
	want, _ := filepath.EvalSymlinks(filepath.Join(in, "vagrant", "Vagrantfile.dev"))
	if p, ok, err := FindUserVagrantfile(in); !ok || err != nil || p != want {
		t.Errorf("a symlink within the repository: %q %v %v, want %q", p, ok, err, want)
	}

	outside := filepath.Join(t.TempDir(), "Vagrantfile")
	testutil.WriteFile(t, outside, "x")
	cases := map[string]struct {
		make func(repo string)
		want string
	}{
		"symlink out of the repo": {func(r string) { _ = os.Symlink(outside, filepath.Join(r, "Vagrantfile")) }, "outside the repository"},
		"dangling symlink":        {func(r string) { _ = os.Symlink("gone", filepath.Join(r, "Vagrantfile")) }, "leads nowhere"},
		"a directory":             {func(r string) { _ = os.Mkdir(filepath.Join(r, "Vagrantfile"), 0o755) }, "is a directory, not a file"},
		"a symlink to a directory": {func(r string) {
			_ = os.Mkdir(filepath.Join(r, "d"), 0o755)
			_ = os.Symlink("d", filepath.Join(r, "Vagrantfile"))
		}, "is a directory"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			r := t.TempDir()
			c.make(r)
			_, ok, err := FindUserVagrantfile(r)
			if ok || !errors.Is(err, ErrNotUsable) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--vagrantfile=generate") {
				t.Errorf("ok %v, err %v; want ErrNotUsable saying %q and the fix", ok, err, c.want)
			}
		})
	}
}

func TestOneMachine(t *testing.T) {
	if m, err := OneMachine("/r/Vagrantfile", []string{"default"}); m != "default" || err != nil {
		t.Errorf("one machine: %q %v", m, err)
	}
	_, err := OneMachine("/r/Vagrantfile", []string{"web", "db"})
	if !errors.Is(err, ErrNotUsable) || !strings.Contains(err.Error(), "2 machines (web, db)") || !strings.Contains(err.Error(), "--vagrantfile=generate") {
		t.Errorf("two machines: %v", err)
	}
	if _, err := OneMachine("/r/Vagrantfile", nil); !errors.Is(err, ErrNotUsable) {
		t.Errorf("no machine: %v", err)
	}
}

// sshConfigOut is what vagrant-libvirt 0.11 prints for `vagrant ssh-config
// default` (copied from a real run), with a path holding a space.
const sshConfigOut = `Host default
  HostName 192.168.121.45
  User vagrant
  Port 22
  UserKnownHostsFile /dev/null
  StrictHostKeyChecking no
  PasswordAuthentication no
  IdentityFile "/var/lib/agent vms/feat/run/vagrant/.vagrant/machines/default/libvirt/private_key"
  IdentitiesOnly yes
  LogLevel FATAL
  PubkeyAcceptedKeyTypes +ssh-rsa
  HostKeyAlgorithms +ssh-rsa

`

func TestParseSSHConfig(t *testing.T) {
	e, err := ParseSSHConfig([]byte(sshConfigOut), "default")
	if err != nil {
		t.Fatal(err)
	}
	if e.Host != "192.168.121.45" || e.Port != 22 || e.User != "vagrant" ||
		!slices.Equal(e.IdentityFiles, []string{"/var/lib/agent vms/feat/run/vagrant/.vagrant/machines/default/libvirt/private_key"}) {
		t.Errorf("parsed %+v", e)
	}
	if !slices.Contains(e.Options, [2]string{"stricthostkeychecking", "no"}) {
		t.Errorf("options %v", e.Options)
	}
	// Keyword=value, tabs, comments, another machine's block first.
	other := "# comment\nHost web\n  HostName 10.0.0.9\n  User w\n  IdentityFile /w\nHost=db\n\tHostName=10.0.0.7\n\tPort = 2222\n\tUser\tdev\n\tIdentityFile /k\n"
	if e, err := ParseSSHConfig([]byte(other), "db"); err != nil || e.Host != "10.0.0.7" || e.Port != 2222 || e.User != "dev" {
		t.Errorf("db: %+v %v", e, err)
	}
	bad := map[string]string{
		"no block":      "Host web\n  HostName h\n  User u\n  IdentityFile /k\n",
		"no identity":   "Host default\n  HostName h\n  User u\n",
		"bad port":      "Host default\n  HostName h\n  Port 99999\n",
		"open quote":    "Host default\n  IdentityFile \"/k\n",
		"proxy command": "Host default\n  HostName h\n  User u\n  IdentityFile /k\n  ProxyCommand ssh -W %h:%p remote\n",
		"no argument":   "Host default\n  HostName\n",
		"garbage":       "Vagrant failed: the machine is not running\n",
	}
	for name, out := range bad {
		if _, err := ParseSSHConfig([]byte(out), "default"); err == nil {
			t.Errorf("%s: parsed without an error", name)
		}
	}
}

// userRig is the driver test rig (a FAKE vagrant at the exec boundary) for
// a machine of the repository's own Vagrantfile.
func userRig(t *testing.T) (*rig, UserProject) {
	r := newRig(t)
	repo := t.TempDir()
	u := UserProject{Vagrantfile: filepath.Join(repo, "Vagrantfile"), Dir: filepath.Join(filepath.Dir(r.m.RunDir), "workspace"), Machine: "default"}
	testutil.WriteFile(t, u.Vagrantfile, "Vagrant.configure(\"2\") { |c| c.vm.box = \"debian/bookworm64\" }\n")
	return r, u
}

func TestUserVagrantfileLifecycle(t *testing.T) {
	r, u := userRig(t)
	ctx := context.Background()
	before, _ := os.Stat(u.Vagrantfile)
	if _, err := r.d.Start(ctx, r.m, Boot{User: &u}, driver.StartOptions{Accel: "tcg", Share: driver.Share9p}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(Project(r.m.RunDir), "Vagrantfile")); err == nil {
		t.Error("agent-vm wrote a Vagrantfile of its own for a machine of the repository's")
	}
	if err := r.d.Suspend(ctx, r.m, driver.GuestHooks{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.d.Resume(ctx, r.m, Boot{User: &u}, driver.StartOptions{}); err != nil {
		t.Fatal(err)
	}
	r.fake.On("vagrant", func(c execxtest.Call) execxtest.Reply {
		switch c.Args[0] {
		case "ssh-config":
			return execxtest.Reply{Stdout: sshConfigOut}
		case "status":
			return execxtest.Reply{Stdout: statusOut("default", r.state)}
		}
		r.state = "not_created"
		return execxtest.Reply{}
	})
	ep, err := r.d.ForeignSSH(ctx, r.m)
	if err != nil || ep.Host != "192.168.121.45" {
		t.Fatalf("ssh endpoint %+v, %v", ep, err)
	}
	if err := r.d.Destroy(ctx, r.m); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"status --machine-readable default", "up --no-color default",
		"status --machine-readable default", "suspend --no-color default", "status --machine-readable default",
		"status --machine-readable default", "resume --no-color default",
		"ssh-config --no-color default",
		"status --machine-readable default", "destroy -f --no-color default",
	}
	var got []string
	for _, c := range r.fake.Calls() {
		if c.Path != "vagrant" {
			continue
		}
		got = append(got, strings.Join(c.Args, " "))
		for _, e := range []string{"VAGRANT_CWD=" + u.Dir, "VAGRANT_VAGRANTFILE=" + u.Vagrantfile,
			"VAGRANT_DOTFILE_PATH=" + filepath.Join(r.m.RunDir, "vagrant", ".vagrant"), "VAGRANT_HOME=/vh", "VAGRANT_CHECKPOINT_DISABLE=1"} {
			if !slices.Contains(c.Env, e) {
				t.Errorf("vagrant %s ran without %s: %v", c.Args[0], e, c.Env)
			}
		}
		for _, e := range c.Env {
			if strings.HasPrefix(e, "VAGRANT_DEFAULT_PROVIDER=") {
				t.Errorf("vagrant %s forced the provider (%s): the user's Vagrantfile chooses it", c.Args[0], e)
			}
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("vagrant commands:\n got %q\nwant %q", got, want)
	}
	after, _ := os.Stat(u.Vagrantfile)
	if !after.ModTime().Equal(before.ModTime()) || after.Size() != before.Size() {
		t.Error("the repository's Vagrantfile changed")
	}
}

func TestForeignSSHOfOwnVagrantfile(t *testing.T) {
	r := newRig(t)
	if _, err := r.d.ForeignSSH(context.Background(), r.m); err == nil || !strings.Contains(err.Error(), "pinned key") {
		t.Errorf("ForeignSSH of agent-vm's own machine: %v", err)
	}
	r, u := userRig(t)
	if err := WriteUser(r.m.RunDir, u); err != nil {
		t.Fatal(err)
	}
	r.fake.On("vagrant", func(execxtest.Call) execxtest.Reply { return execxtest.Reply{Stdout: "Host default\n  HostName\n"} })
	if _, err := r.d.ForeignSSH(context.Background(), r.m); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("unparseable ssh-config: %v", err)
	}
	// The Vagrantfile gone: no vagrant command runs, and the error says why.
	if err := os.Remove(u.Vagrantfile); err != nil {
		t.Fatal(err)
	}
	calls := len(r.fake.Calls())
	if _, err := r.d.Inspect(context.Background(), r.m); err == nil || !strings.Contains(err.Error(), "restore the file") {
		t.Errorf("status without the Vagrantfile: %v", err)
	}
	// A machine vagrant never made is destroyed without it; one it made
	// (its id recorded) needs it.
	if err := r.d.Destroy(context.Background(), r.m); err != nil {
		t.Errorf("destroying a machine never made: %v", err)
	}
	testutil.WriteFile(t, filepath.Join(Project(r.m.RunDir), DotDir, "machines", "default", "libvirt", "id"), "5d2c")
	if err := r.d.Destroy(context.Background(), r.m); err == nil || !strings.Contains(err.Error(), "restore the file") {
		t.Errorf("destroying a made machine without its Vagrantfile: %v", err)
	}
	if len(r.fake.Calls()) != calls {
		t.Errorf("vagrant ran without the Vagrantfile: %+v", r.fake.Calls()[calls:])
	}
}

// TestUserMachinesRealVagrant runs the real vagrant on a repository's own
// Vagrantfiles (one machine, two, a broken one), with agent-vm's dotfile
// directory, and checks that the repository's .vagrant/ and Vagrantfile are
// left exactly as they were.
func TestUserMachinesRealVagrant(t *testing.T) {
	if testing.Short() {
		t.Skip("runs vagrant (seconds per run)")
	}
	if _, err := exec.LookPath("vagrant"); err != nil {
		testutil.SkipOrFail(t, "vagrant is not installed (`agent-vm setup --backend vagrant` installs it)")
	}
	ctx := testutil.Context(t, "vagrant up of the test box")
	run := execx.OS{}
	repo, ws, vm := t.TempDir(), t.TempDir(), t.TempDir()
	vf := filepath.Join(repo, "Vagrantfile")
	testutil.WriteFile(t, vf, `Vagrant.configure("2") do |config|
  config.vm.box = "debian/bookworm64"
  config.vm.provision "shell", path: "setup.sh"
  config.vm.provider :libvirt do |l|
    l.memory = 1024
  end
end
`)
	testutil.WriteFile(t, filepath.Join(repo, ".vagrant", "machines", "default", "libvirt", "id"), "the user's own machine\n")
	old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, p := range []string{vf, filepath.Join(repo, ".vagrant", "machines", "default", "libvirt", "id")} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	// The provisioner's path is relative: vagrant finds it in the
	// workspace, through the project link (UserRoot), and only there.
	testutil.WriteFile(t, filepath.Join(repo, "setup.sh"), "true\n")
	if err := LinkUserRoot(vm, "agent-vm-feat-0123abcd", ws); err != nil {
		t.Fatal(err)
	}
	u := UserProject{Vagrantfile: vf, Dir: UserRoot(vm, "agent-vm-feat-0123abcd")}
	dot := filepath.Join(vm, ".vagrant")
	if res, err := run.Run(ctx, execx.Cmd{Path: "vagrant", Args: []string{"validate"}, Env: UserEnv(u, dot, filepath.Join(vm, "home"))}); err == nil || !strings.Contains(err.Error()+string(res.Stdout), filepath.Join(u.Dir, "setup.sh")) {
		t.Errorf("vagrant validate with setup.sh in the repository only: %v\n%s", err, res.Stdout)
	}
	testutil.WriteFile(t, filepath.Join(ws, "setup.sh"), "true\n")
	names, err := UserMachines(ctx, run, u, dot, filepath.Join(vm, "home"))
	if err != nil || !slices.Equal(names, []string{"default"}) {
		t.Fatalf("machines %v, %v", names, err)
	}
	res, err := run.Run(ctx, execx.Cmd{Path: "vagrant", Args: []string{"validate"}, Env: UserEnv(u, dot, filepath.Join(vm, "home"))})
	if err != nil {
		t.Fatalf("vagrant validate: %v\n%s", err, res.Stdout)
	}
	if _, err := os.Stat(filepath.Join(dot, "machines")); err != nil {
		t.Errorf("vagrant did not use agent-vm's dotfile directory: %v", err)
	}
	for _, p := range []string{vf, filepath.Join(repo, ".vagrant", "machines", "default", "libvirt", "id")} {
		fi, err := os.Stat(p)
		if err != nil || !fi.ModTime().Equal(old) {
			t.Errorf("%s was touched: %v %v", p, fi.ModTime(), err)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(repo, ".vagrant"))
	if len(entries) != 1 {
		t.Errorf("the repository's .vagrant/ changed: %v", entries)
	}
	if _, err := os.Stat(filepath.Join(ws, ".vagrant")); err == nil {
		t.Error("vagrant made a .vagrant/ in the workspace")
	}

	testutil.WriteFile(t, vf, "Vagrant.configure(\"2\") do |c|\n  c.vm.box = \"b\"\n  c.vm.define \"web\", primary: true\n  c.vm.define \"db\"\nend\n")
	if names, err = UserMachines(ctx, run, u, dot, filepath.Join(vm, "home")); err != nil {
		t.Fatal(err)
	}
	if _, err := OneMachine(vf, names); err == nil || !strings.Contains(err.Error(), "(web, db)") {
		t.Errorf("two machines: %v", err)
	}
	testutil.WriteFile(t, vf, "Vagrant.configure(\"2\") do |c|\n  c.vm.box = \nend end\n")
	if _, err := UserMachines(ctx, run, u, dot, filepath.Join(vm, "home")); err == nil || !strings.Contains(err.Error(), "vagrant validate") {
		t.Errorf("a broken Vagrantfile: %v", err)
	}
}
