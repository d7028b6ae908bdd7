package vagrant

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/testutil"
)

// The tests below put a FAKE vagrant (execxtest) at the exec boundary: it
// records the argv and environment asked and answers with canned
// machine-readable output. Everything above it is the real driver.

func statusOut(machine, state string) string {
	return "1700000000,," + "metadata,provider,libvirt\n" +
		"1700000000," + machine + ",provider-name,libvirt\n" +
		"1700000000," + machine + ",state," + state + "\n" +
		"1700000000," + machine + ",state-human-long,The machine is " + state + ".\\nMore%!(VAGRANT_COMMA) text\n"
}

// recordID does what vagrant does once it made a machine: it records the
// machine's id in its dotfile directory.
func recordID(c execxtest.Call) {
	for _, e := range c.Env {
		if dot, ok := strings.CutPrefix(e, "VAGRANT_DOTFILE_PATH="); ok {
			p := filepath.Join(dot, "machines", c.Args[len(c.Args)-1], "libvirt", "id")
			_ = os.MkdirAll(filepath.Dir(p), 0o700)
			_ = os.WriteFile(p, []byte("5d2c0c4e-0000-4000-8000-000000000000"), 0o600)
		}
	}
}

type rig struct {
	d     *Driver
	m     driver.Machine
	fake  *execxtest.Fake
	state string
	// reason is libvirt's (virsh domstate --reason) for a machine vagrant
	// says is shutoff or paused; "" makes virsh fail.
	reason string
	fail   map[string]bool // vagrant subcommands that fail
	prog   bytes.Buffer
	now    time.Time
}

func newRig(t *testing.T) *rig {
	dir := t.TempDir()
	r := &rig{state: "not_created", fail: map[string]bool{}, now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	r.m = driver.Machine{Name: "agent-vm-feat", UUID: "0123abcd-1111", CPUs: 2, MemoryMiB: 1024,
		RunDir: filepath.Join(dir, "run"), LogsDir: filepath.Join(dir, "logs"),
		// No forwards: their forwarders are real ssh processes, which
		// forward_test.go runs; the fake vagrant starts none.
		Share: driver.Share{Source: filepath.Join(dir, "workspace"), UID: 65534, GID: 65534}}
	for _, d := range []string{r.m.RunDir, r.m.LogsDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	r.fake = execxtest.New(t).On("vagrant", func(c execxtest.Call) execxtest.Reply {
		sub := c.Args[0]
		if r.fail[sub] {
			return execxtest.Reply{Stdout: "Error: the domain broke\n", ExitCode: 1}
		}
		switch sub {
		case "status":
			return execxtest.Reply{Stdout: statusOut(c.Args[len(c.Args)-1], r.state)}
		case "up", "resume":
			r.state = "running"
			recordID(c)
		case "halt":
			r.state, r.reason = "shutoff", "shutdown"
		case "suspend":
			r.state, r.reason = "paused", "user"
		case "destroy":
			r.state = "not_created"
		}
		return execxtest.Reply{Stdout: "==> " + sub + " progress\n"}
	}).On("virsh", func(c execxtest.Call) execxtest.Reply {
		if slices.Equal(c.Args, []string{"-c", DefaultURI, "domstate", c.Args[len(c.Args)-1]}) && len(c.Args) == 4 {
			// Running's question: libvirt's state alone.
			states := map[string]string{"running": "running", "paused": "paused", "shutoff": "shut off", "poweroff": "shut off", "aborted": "shut off"}
			if st, ok := states[r.state]; ok {
				return execxtest.Reply{Stdout: st + "\n"}
			}
			return execxtest.Reply{Stderr: "error: failed to get domain", ExitCode: 1}
		}
		if !slices.Equal(c.Args[:4], []string{"-c", DefaultURI, "domstate", "--reason"}) {
			return execxtest.Reply{Stderr: "unexpected virsh " + strings.Join(c.Args, " "), ExitCode: 2}
		}
		if r.reason == "" {
			return execxtest.Reply{Stderr: "error: failed to get domain", ExitCode: 1}
		}
		states := map[string]string{"shutoff": "shut off", "poweroff": "shut off", "paused": "paused"}
		return execxtest.Reply{Stdout: states[r.state] + " (" + r.reason + ")\n"}
	})
	// The workspace's virtiofsd (startShare), a fake: QEMU's C one by its
	// --help, and its start (the jail, run as agent-vm's own binary, this
	// test's, as root; virtiofsd itself otherwise) makes its socket.
	fakeVirtiofsd := func(c execxtest.Call) execxtest.Reply {
		if !c.Detached {
			return execxtest.Reply{Stdout: "usage: virtiofsd [options]\n    -o source=PATH\n"}
		}
		for _, a := range c.Args {
			if sock, ok := strings.CutPrefix(a, "--socket-path="); ok {
				// A listening socket, as virtiofsd's (Start waits for one),
				// kept until the test ends.
				_ = os.Remove(sock)
				if ln, err := net.Listen("unix", sock); err == nil {
					ln.(*net.UnixListener).SetUnlinkOnClose(false)
					t.Cleanup(func() { ln.Close() })
				}
			}
		}
		return execxtest.Reply{}
	}
	self, _ := os.Executable()
	r.fake.On("virtiofsd", fakeVirtiofsd).On(filepath.Base(self), fakeVirtiofsd)
	// QEMUUser: no such user, so Start leaves file access alone (see
	// TestPrepareAccess for it).
	r.d = &Driver{Run: r.fake, Log: hclog.NewNullLogger(), Progress: &r.prog, Home: "/vh", QEMUUser: "agent-vm-no-such-user", Now: func() time.Time { return r.now }}
	return r
}

func (r *rig) verbs() []string {
	var out []string
	for _, c := range r.fake.Calls() {
		out = append(out, strings.Join(c.Args, " "))
	}
	return out
}

var boot = Boot{Box: DefaultBox, Seed: "/s/seed.iso", MAC: "52:54:00:00:00:01", SSHUser: "dev", SSHKey: "/s/key"}

func TestLifecycle(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	name := "agent-vm-feat-0123abcd"
	started, err := r.d.Start(ctx, r.m, boot, driver.StartOptions{Accel: "tcg", Share: driver.Share9p, BootTimeout: 15 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.d.MarkReady(r.m, r.now); err != nil {
		t.Fatal(err)
	}
	vf, err := os.ReadFile(filepath.Join(r.m.RunDir, "vagrant", "Vagrantfile"))
	if err != nil || !strings.Contains(string(vf), `libvirt.driver = "qemu"`) || !strings.Contains(string(vf), "machine.vm.boot_timeout = 900\n") {
		t.Errorf("the Vagrantfile for TCG with a 15 minute boot timeout (%v):\n%s", err, vf)
	}
	if !strings.Contains(r.prog.String(), "==> up progress") {
		t.Errorf("vagrant up's output did not stream: %q", r.prog.String())
	}
	if !strings.Contains(string(vf), `"socket,id=agentvm-fs,path=`+filepath.Join(r.m.RunDir, VirtiofsdSock)+`"`) || strings.Contains(string(vf), "synced_folder "+RubyString(r.m.Share.Source)) {
		t.Errorf("the Vagrantfile does not share the workspace through agent-vm's virtiofsd, or lets vagrant share it:\n%s", vf)
	}
	for _, c := range r.fake.Calls() {
		if filepath.Base(c.Path) != "vagrant" {
			continue
		}
		for _, want := range []string{"VAGRANT_CWD=" + filepath.Join(r.m.RunDir, "vagrant"), "VAGRANT_DOTFILE_PATH=" + filepath.Join(r.m.RunDir, "vagrant", ".vagrant"), "VAGRANT_HOME=/vh", "VAGRANT_VAGRANTFILE=Vagrantfile"} {
			if !slices.Contains(c.Env, want) {
				t.Errorf("%q ran without %s: %q", c.Args, want, c.Env)
			}
		}
	}
	// A pause keeps the share mounted: the guest's hooks must not run.
	if err := r.d.Suspend(ctx, r.m, failingHooks(t)); err != nil {
		t.Fatal(err)
	}
	if lv, _ := r.d.Inspect(ctx, r.m); lv.State != driver.StateSuspended {
		t.Errorf("after suspend: %+v", lv)
	}
	resumed, err := r.d.Resume(ctx, r.m, boot, driver.StartOptions{Accel: "kvm"})
	if err != nil {
		t.Fatal(err)
	}
	// The same machine goes on: its start's launch, waiting for the guest.
	if resumed.ReadyAt != nil || !resumed.StartedAt.Equal(started.StartedAt) || resumed.Accel != "tcg" {
		t.Errorf("Resume's launch %+v; want the start's (%+v), not ready", resumed, started)
	}
	if lv, _ := r.d.Inspect(ctx, r.m); lv.State != driver.StateRunning || lv.Launch == nil || lv.Launch.ReadyAt != nil {
		t.Errorf("after resume: %+v", lv)
	}
	if err := r.d.Stop(ctx, r.m, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := r.d.Destroy(ctx, r.m); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"status --machine-readable " + name,
		// The workspace's virtiofsd, QEMU's C one, in agent-vm's jail as
		// the workspace's owner, before vagrant up.
		"--help", "__virtiofsd-jail --uid=65534 --gid=65534 --source=" + r.m.Share.Source + " --socket-path=" + filepath.Join(r.m.RunDir, VirtiofsdSock) + " -- /usr/lib/qemu/virtiofsd -o cache=auto",
		"up --provider=libvirt --no-color " + name,
		"status --machine-readable " + name, "suspend --no-color " + name,
		"status --machine-readable " + name, "-c qemu:///system domstate --reason " + name, // suspend reads the state again
		"status --machine-readable " + name, "-c qemu:///system domstate --reason " + name, // Inspect after suspend: the verb dropped the cache
		"status --machine-readable " + name, "-c qemu:///system domstate --reason " + name, "resume --no-color " + name,
		"status --machine-readable " + name, // Inspect after resume
		"status --machine-readable " + name, "halt --no-color " + name,
		"status --machine-readable " + name, "-c qemu:///system domstate --reason " + name, "destroy -f --no-color " + name,
	}
	if got := r.verbs(); !slices.Equal(got, want) {
		t.Errorf("vagrant ran\n%q\nwant\n%q", got, want)
	}
}

// failingHooks are guest hooks that fail the test when run.
func failingHooks(t *testing.T) driver.GuestHooks {
	fail := func(what string) func(context.Context) error {
		return func(context.Context) error { t.Errorf("the guest's %s hook ran", what); return nil }
	}
	return driver.GuestHooks{Detach: fail("detach"), Attach: fail("attach")}
}

func TestInspectStates(t *testing.T) {
	for _, tc := range []struct {
		vagrant, reason, want string
		launched              bool
		marker                string
	}{
		{"running", "", driver.StateRunning, true, ""},
		{"not_created", "", driver.StateStopped, false, ""},
		{"shutoff", "", driver.StateStopped, true, CleanMarker},
		{"shutoff", "", driver.StateCrashed, true, ""}, // libvirt cannot say, no clean stop: killed
		// libvirt tells a kill from a halt where vagrant says shutoff for both:
		{"shutoff", "crashed", driver.StateCrashed, true, CleanMarker},
		{"shutoff", "shutdown", driver.StateStopped, true, CleanMarker},
		{"shutoff", "shutdown", driver.StateStopped, true, ""}, // the guest powered itself off
		{"shutoff", "destroyed", driver.StateCrashed, true, ""},
		{"shutoff", "destroyed", driver.StateStopped, true, CleanMarker}, // halt --force
		{"shutoff", "saved", driver.StateSuspended, true, ""},
		// A pause-suspended machine whose QEMU died has lost its memory:
		{"shutoff", "crashed", driver.StateCrashed, true, SuspendMark},
		{"poweroff", "", driver.StateStopped, false, ""},
		{"aborted", "", driver.StateCrashed, true, ""},
		{"saved", "", driver.StateSuspended, true, ""},
		{"paused", "user", driver.StatePaused, true, ""},
		{"paused", "user", driver.StateSuspended, true, SuspendMark},
		{"preparing", "", driver.StateRunning, true, ""},
		{"weird_new_state", "", driver.StateCrashed, true, ""},
	} {
		r := newRig(t)
		r.state, r.reason = tc.vagrant, tc.reason
		if err := os.MkdirAll(Project(r.m.RunDir), 0o700); err != nil {
			t.Fatal(err)
		}
		if tc.launched {
			if err := writeJSON(runFile(r.m, LaunchFile), driver.Launch{Accel: "kvm"}); err != nil {
				t.Fatal(err)
			}
		}
		if tc.marker != "" {
			_ = touch(runFile(r.m, tc.marker))
		}
		lv, err := r.d.Inspect(context.Background(), r.m)
		if err != nil || lv.State != tc.want {
			t.Errorf("vagrant %s, libvirt %q (launched %v, marker %q): got %+v, %v; want %s", tc.vagrant, tc.reason, tc.launched, tc.marker, lv, err, tc.want)
		}
		wantKind := "" // how a suspended machine keeps its memory
		switch {
		case tc.want != driver.StateSuspended:
		case tc.vagrant == "paused":
			wantKind = driver.SuspendPaused
		default:
			wantKind = driver.SuspendSaved
		}
		if lv.Suspend != wantKind {
			t.Errorf("vagrant %s, libvirt %q (marker %q): suspended as %q, want %q", tc.vagrant, tc.reason, tc.marker, lv.Suspend, wantKind)
		}
		if lv.State == driver.StateSuspended && tc.vagrant == "paused" && !strings.Contains(lv.Detail, "still holds its memory") {
			t.Errorf("a paused suspend does not say it holds its memory: %q", lv.Detail)
		}
		if lv.State == driver.StateCrashed && !strings.Contains(lv.Detail, "`agent-vm start feat` recovers it") {
			t.Errorf("crashed without the next step: %q", lv.Detail)
		}
	}
}

// vagrant suspend exits 0 when libvirt refuses (as it refuses managedsave
// with a share mounted): the driver reads the state again and fails.
func TestSuspendThatDidNotHappenFails(t *testing.T) {
	r := newRig(t)
	r.state = "running"
	_ = Write(r.m.RunDir, SpecOf(r.m, boot, driver.StartOptions{Accel: "kvm", Share: driver.Share9p}, DefaultURI))
	r.fake.On("vagrant", func(c execxtest.Call) execxtest.Reply {
		if c.Args[0] == "status" {
			return execxtest.Reply{Stdout: statusOut(c.Args[len(c.Args)-1], r.state)}
		}
		return execxtest.Reply{Stdout: "error: Requested operation is not valid: Migration is disabled\n"} // and exit 0
	})
	err := r.d.Suspend(context.Background(), r.m, failingHooks(t))
	if err == nil || !strings.Contains(err.Error(), "the machine is running") {
		t.Errorf("a suspend vagrant did not do: %v", err)
	}
	if exists(runFile(r.m, SuspendMark)) {
		t.Error("the suspend marker outlived a failed suspend")
	}
}

func TestParseDomState(t *testing.T) {
	for in, want := range map[string]DomState{
		"shut off (crashed)\n": {"shut off", "crashed"}, "paused (user)": {"paused", "user"}, "running\n": {State: "running"},
	} {
		if got := ParseDomState(in); got != want {
			t.Errorf("ParseDomState(%q) = %+v, want %+v", in, got, want)
		}
	}
}

func TestInspectCache(t *testing.T) {
	r := newRig(t)
	r.state = "running"
	_ = os.MkdirAll(Project(r.m.RunDir), 0o700)
	ctx := context.Background()
	for range 3 {
		if _, err := r.d.Inspect(ctx, r.m); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.vagrantCalls(); n != 1 {
		t.Errorf("three Inspects within the TTL ran vagrant %d times, want 1", n)
	}
	// Killed within the TTL: libvirt says so at once, and vagrant is
	// asked again.
	r.state, r.reason = "shutoff", "crashed"
	if lv, _ := r.d.Inspect(ctx, r.m); lv.State != driver.StateCrashed || r.vagrantCalls() != 2 {
		t.Errorf("killed within the TTL: %+v, %d vagrant calls", lv, r.vagrantCalls())
	}
	r.now = r.now.Add(CacheTTL)
	r.state = "aborted"
	if lv, _ := r.d.Inspect(ctx, r.m); lv.State != driver.StateCrashed || r.vagrantCalls() != 3 {
		t.Errorf("after the TTL: %+v, %d vagrant calls", lv, r.vagrantCalls())
	}
}

func (r *rig) vagrantCalls() int {
	n := 0
	for _, c := range r.fake.Calls() {
		if c.Path == "vagrant" {
			n++
		}
	}
	return n
}

func TestFailuresNameCommandAndLog(t *testing.T) {
	ctx := context.Background()
	logPath := func(r *rig) string { return filepath.Join(r.m.LogsDir, VagrantLog) }
	for _, tc := range []struct {
		verb  string
		state string
		run   func(r *rig) error
	}{
		{"up", "not_created", func(r *rig) error { _, err := r.d.Start(ctx, r.m, boot, driver.StartOptions{Accel: "kvm"}); return err }},
		{"halt", "running", func(r *rig) error { return r.d.Stop(ctx, r.m, time.Minute) }},
		{"suspend", "running", func(r *rig) error { return r.d.Suspend(ctx, r.m, driver.GuestHooks{}) }},
		{"resume", "saved", func(r *rig) error { _, err := r.d.Resume(ctx, r.m, boot, driver.StartOptions{}); return err }},
		{"halt", "paused", func(r *rig) error { // a suspended machine's stop discards it
			_ = touch(runFile(r.m, SuspendMark))
			return r.d.Stop(ctx, r.m, time.Minute)
		}},
		{"destroy", "shutoff", func(r *rig) error { return r.d.Destroy(ctx, r.m) }},
		{"status", "running", func(r *rig) error { _, err := r.d.Inspect(ctx, r.m); return err }},
	} {
		r := newRig(t)
		r.state = tc.state
		r.fail[tc.verb] = true
		_ = Write(r.m.RunDir, SpecOf(r.m, boot, driver.StartOptions{Accel: "kvm", Share: driver.Share9p}, DefaultURI))
		err := tc.run(r)
		if err == nil || !strings.Contains(err.Error(), "`vagrant "+tc.verb) || !strings.Contains(err.Error(), logPath(r)) {
			t.Errorf("failing vagrant %s: %v (want the command and %s)", tc.verb, err, logPath(r))
		}
		if b, _ := os.ReadFile(logPath(r)); !strings.Contains(string(b), "the domain broke") {
			t.Errorf("vagrant %s's output is not in its log: %q", tc.verb, b)
		}
	}
}

func TestStartRefuses(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	if _, err := r.d.Start(ctx, r.m, otherBoot{}, driver.StartOptions{}); err == nil || !strings.Contains(err.Error(), `"qemu" driver`) {
		t.Errorf("a QEMU plan: %v", err)
	}
	r.state = "running"
	_ = os.MkdirAll(Project(r.m.RunDir), 0o700)
	if _, err := r.d.Start(ctx, r.m, boot, driver.StartOptions{Accel: "kvm"}); !errors.Is(err, driver.ErrRunning) {
		t.Errorf("start of a running machine: %v", err)
	}
	r.state = "shutoff"
	if err := r.d.Stop(ctx, r.m, time.Second); !errors.Is(err, driver.ErrNotRunning) {
		t.Errorf("stop of a stopped machine: %v", err)
	}
	if err := r.d.Suspend(ctx, r.m, failingHooks(t)); !errors.Is(err, driver.ErrNotRunning) {
		t.Errorf("suspend of a stopped machine: %v", err)
	}
	if _, err := r.d.Resume(ctx, r.m, boot, driver.StartOptions{}); !errors.Is(err, driver.ErrNotRunning) {
		t.Errorf("resume of a stopped machine: %v", err)
	}
	if _, err := r.d.Resume(ctx, r.m, otherBoot{}, driver.StartOptions{}); err == nil || !strings.Contains(err.Error(), `"qemu" driver`) {
		t.Errorf("resume with a QEMU plan: %v", err)
	}
	// Suspended by agent-vm: Resume it (or Stop it), never `vagrant up`.
	r.state, r.reason = "paused", "user"
	_ = touch(runFile(r.m, SuspendMark))
	if _, err := r.d.Start(ctx, r.m, boot, driver.StartOptions{Accel: "kvm"}); !errors.Is(err, driver.ErrSuspended) {
		t.Errorf("start of a suspended machine: %v", err)
	}
	if slices.ContainsFunc(r.verbs(), func(v string) bool { return strings.HasPrefix(v, "up ") || strings.HasPrefix(v, "resume ") }) {
		t.Errorf("start of a suspended machine ran %q", r.verbs())
	}
	// vagrant forwards what the Vagrantfile says: the driver is no
	// driver.Forwarder, and vm refuses `agent-vm port` on a running VM
	// (internal/vm's TestForeignGuestLifecycle).
	if _, ok := any(r.d).(driver.Forwarder); ok {
		t.Error("the vagrant driver is a driver.Forwarder")
	}
}

type otherBoot struct{}

func (otherBoot) DriverName() string { return "qemu" }

func TestDoctor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		plugins string
		virshOK bool
		want    []bool
		detail  string
	}{
		{"all there", "1,,plugin-name,vagrant-libvirt\n1,vagrant-libvirt,plugin-version,0.11.2%!(VAGRANT_COMMA) system\n", true, []bool{true, true, true, true, true}, "vagrant-libvirt 0.11.2, system"},
		{"libvirt's version", "1,,plugin-name,vagrant-libvirt\n", true, []bool{true, true, true, true, true}, "libvirt 9.0.0, hypervisor QEMU 7.2.0"},
		{"other plugins", "1,,plugin-name,vagrant-share\n1,,plugin-name,vagrant-libvirt\n1,vagrant-libvirt,plugin-version,0.11.2\n1,,plugin-name,vagrant-vbguest\n", true, []bool{true, true, true, true, true}, "vagrant-libvirt 0.11.2; other plugins: vagrant-share, vagrant-vbguest"},
		{"no plugin", "1,,plugin-name,vagrant-share\n", true, []bool{true, false, true, true, true}, "not among vagrant's plugins (vagrant-share)"},
		{"no libvirtd", "1,,plugin-name,vagrant-libvirt\n", false, []bool{true, true, false, true, true}, "libvirtd is not running"},
		{"not root", "1,,plugin-name,vagrant-libvirt\n", true, []bool{true, true, true, false, true}, "can only be made as root"},
		{"no nft", "1,,plugin-name,vagrant-libvirt\n", true, []bool{true, true, true, false, true}, "nft is not installed"},
		{"root-only /dev/kvm", "1,,plugin-name,vagrant-libvirt\n", true, []bool{true, true, true, true, true}, "probes QEMU again at every call (about a minute per vagrant up) `sudo agent-vm setup --backend vagrant` lets group kvm use it"},
	} {
		// A stand-in /dev/kvm, root's only as where no udev ran, for the
		// one case about it; the others' host has none.
		root := t.TempDir()
		if tc.name == "root-only /dev/kvm" {
			os.MkdirAll(filepath.Join(root, "dev"), 0o755)
			os.MkdirAll(filepath.Join(root, "etc"), 0o755)
			os.WriteFile(filepath.Join(root, "dev", "kvm"), nil, 0o600)
			os.WriteFile(filepath.Join(root, "etc", "group"), []byte("kvm:x:4242:libvirt-qemu\n"), 0o644)
		}
		fake := execxtest.New(t).On("vagrant", func(c execxtest.Call) execxtest.Reply {
			if c.Args[0] == "--version" {
				return execxtest.Reply{Stdout: "Vagrant 2.3.4\n"}
			}
			return execxtest.Reply{Stdout: tc.plugins}
		}).On("virsh", func(c execxtest.Call) execxtest.Reply {
			if !tc.virshOK {
				return execxtest.Reply{Stderr: "error: failed to connect to the hypervisor\nerror: Failed to connect socket to '/var/run/libvirt/libvirt-sock': No such file or directory", ExitCode: 1}
			}
			return execxtest.Reply{Stdout: "Compiled against library: libvirt 9.0.0\nUsing library: libvirt 9.0.0\nRunning hypervisor: QEMU 7.2.0\n"}
		})
		if tc.name != "no nft" {
			fake.Installed("nft", "/usr/sbin/nft")
		}
		uid := 0
		if tc.name == "not root" {
			uid = 1000
		}
		d := &Driver{Run: fake, Log: hclog.NewNullLogger(), HostRoot: root, Euid: func() int { return uid }}
		checks, ok := d.Doctor(context.Background())
		all := true
		var text []string
		if len(checks) != len(tc.want) {
			t.Fatalf("%s: %d checks, want %d: %+v", tc.name, len(checks), len(tc.want), checks)
		}
		for i, c := range checks {
			if c.OK != tc.want[i] {
				t.Errorf("%s: check %s: ok %v, want %v (%s)", tc.name, c.Name, c.OK, tc.want[i], c.Detail)
			}
			if c.Name != "other vagrant providers" {
				all = all && c.OK
			}
			text = append(text, c.Detail+" "+c.Hint)
		}
		if ok != all || !strings.Contains(strings.Join(text, "\n"), tc.detail) {
			t.Errorf("%s: ok %v, checks %q; want %q", tc.name, ok, text, tc.detail)
		}
	}
}

func TestLibvirtVersion(t *testing.T) {
	if got := LibvirtVersion("error: nothing\n"); !strings.Contains(got, "not in `virsh version`") {
		t.Errorf("no version lines: %q", got)
	}
}

func TestDoctorOtherProviders(t *testing.T) {
	d := &Driver{Run: execxtest.New(t).Installed("VBoxManage", "/usr/bin/VBoxManage"), Log: hclog.NewNullLogger()}
	if c := d.otherProviders(); !c.OK || !strings.Contains(c.Detail, "virtualbox (/usr/bin/VBoxManage)") || !strings.Contains(c.Detail, "never tested") {
		t.Errorf("with VirtualBox: %+v", c)
	}
	d = &Driver{Run: execxtest.New(t), Log: hclog.NewNullLogger()}
	if c := d.otherProviders(); !c.OK || !strings.Contains(c.Detail, "none found") {
		t.Errorf("without: %+v", c)
	}
}

func TestParseStatus(t *testing.T) {
	st, err := ParseStatus([]byte(statusOut("m", "running")+"garbage line\n"), "m")
	if err != nil || st.State != "running" || st.Provider != "libvirt" || st.Long != "The machine is running.\nMore, text" {
		t.Errorf("got %+v, %v", st, err)
	}
	if _, err := ParseStatus([]byte(statusOut("other", "running")), "m"); err == nil {
		t.Error("a status of another machine was taken")
	}
	_, err = ParseStatus([]byte("1,,error-exit,Vagrant::Errors::VagrantfileSyntaxError,There is a syntax error%!(VAGRANT_COMMA) line 3\n"), "m")
	if err == nil || !strings.Contains(err.Error(), "There is a syntax error, line 3") {
		t.Errorf("error-exit: %v", err)
	}
}

// TestStartRefusesUnjailedShare: as root, a workspace whose owner is
// unknown cannot go to a jailed virtiofsd, and an unjailed one would let
// the guest's root write as root on the host: the start fails saying so,
// before vagrant runs.
func TestStartRefusesUnjailedShare(t *testing.T) {
	testutil.Need(t, os.Geteuid() == 0, "runs as root: the jail is used as root only (unprivileged, virtiofsd runs as the user)")
	r := newRig(t)
	r.m.Share.UID, r.m.Share.GID = 0, 0
	_, err := r.d.Start(context.Background(), r.m, boot, driver.StartOptions{Accel: "kvm", Share: driver.ShareVirtiofs})
	if err == nil || !strings.Contains(err.Error(), "root-owned and setuid files") || !strings.Contains(err.Error(), "hint: ") {
		t.Errorf("start with an unknown workspace owner, as root: %v", err)
	}
	for _, v := range r.verbs() {
		if strings.HasPrefix(v, "up ") || strings.HasPrefix(v, "__virtiofsd-jail") {
			t.Errorf("ran %q after refusing", v)
		}
	}
}
