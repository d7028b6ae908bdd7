package vagrantbackend

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/seed"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vagrant"
)

func TestVagrantProvision(t *testing.T) {
	staging, final := state.Layout{Dir: t.TempDir()}, state.Layout{Dir: "/final/feat"}
	for _, d := range []string{staging.RunDir(), staging.Workspace()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	r := &state.Record{ID: "0123abcd-aaaa", Branch: "feat", Slug: "feat", MachineName: "agent-vm-feat", Backend: Name,
		Resources: state.Resources{CPUs: 2, MemoryMiB: 2048}, Guest: state.Guest{User: "dev"}, Paths: final.Paths()}
	r.Ports.SSH, r.Ports.MCP = 2201, 8001
	b := &Backend{}
	if err := b.Provision(context.Background(), staging, r, backend.CreateFlags{Box: "debian/bookworm64"}); err != nil {
		t.Fatal(err)
	}
	vf, err := os.ReadFile(filepath.Join(vagrant.Project(staging.RunDir()), "Vagrantfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`machine.vm.box = "debian/bookworm64"`, `path=/final/feat/run/virtiofsd.sock"`, `host: 8001, host_ip: "127.0.0.1"`, `"/final/feat/seed.iso"`, `"` + seed.MACOf(r.ID) + `"`} {
		if !strings.Contains(string(vf), want) {
			t.Errorf("the Vagrantfile lacks %s:\n%s", want, vf)
		}
	}
	if _, err := os.Stat(filepath.Join(staging.Workspace(), "Vagrantfile")); err == nil {
		t.Error("a Vagrantfile was written into the workspace")
	}

	if r.Guest.Foreign != "" {
		t.Errorf("agent-vm's own Vagrantfile recorded as foreign: %q", r.Guest.Foreign)
	}
	if err := b.CheckStart(r, backend.StartFlags{}); err != nil {
		t.Errorf("a new VM's start refused: %v", err)
	}
}

// A VM of agent-vm's own Vagrantfile made before the backend contained
// networks (its settings say nothing of it) is not started, saying to
// reset it; reset makes it one that starts. The repository's own
// Vagrantfile is not concerned.
func TestOlderMachineRefusedUntilReset(t *testing.T) {
	r := &state.Record{Branch: "feat", Slug: "feat", Backend: Name}
	if err := r.SetSection(Settings{Provision: 1}); err != nil {
		t.Fatal(err)
	}
	b := &Backend{}
	if err := b.CheckStart(r, backend.StartFlags{}); err == nil || !strings.Contains(err.Error(), "`agent-vm reset feat`") || !strings.Contains(err.Error(), "NAT network") {
		t.Errorf("an older machine's start: %v", err)
	}
	if err := b.Reset(context.Background(), state.Layout{}, r); err != nil {
		t.Fatal(err)
	}
	if err := b.CheckStart(r, backend.StartFlags{}); err != nil {
		t.Errorf("after reset: %v", err)
	}
	var s Settings
	if err := r.Section(&s); err != nil || !s.Contained || s.Provision != 1 {
		t.Errorf("reset's settings: %+v %v", s, err)
	}
	own := &state.Record{Branch: "web", Slug: "web", Backend: Name}
	if err := own.SetSection(Settings{Vagrantfile: "/repo/Vagrantfile", Machine: "default"}); err != nil {
		t.Fatal(err)
	}
	if err := b.CheckStart(own, backend.StartFlags{}); err != nil {
		t.Errorf("the repository's own Vagrantfile: %v", err)
	}
}

// TestVagrantProvisionOwnVagrantfile puts a FAKE vagrant (execxtest) at the
// exec boundary, answering `vagrant status --machine-readable` as vagrant
// does for the repository's Vagrantfile; the backend above it is real.
func TestVagrantProvisionOwnVagrantfile(t *testing.T) {
	machines := []string{"default"}
	fake := execxtest.New(t).On("vagrant", func(c execxtest.Call) execxtest.Reply {
		var out strings.Builder
		for _, m := range machines {
			out.WriteString("1700000000," + m + ",metadata,provider,libvirt\n1700000000," + m + ",state,not_created\n")
		}
		return execxtest.Reply{Stdout: out.String()}
	})
	b := &Backend{Run: fake, Home: hostdir.Top("/vh", 0o755, hostdir.InSystem)}
	setup := func(t *testing.T) (state.Layout, *state.Record, string) {
		staging, source := state.Layout{Dir: t.TempDir()}, t.TempDir()
		for _, d := range []string{staging.RunDir(), staging.Workspace()} {
			if err := os.MkdirAll(d, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		r := &state.Record{ID: "0123abcd-aaaa", Branch: "feat", Slug: "feat", MachineName: "agent-vm-feat", Backend: Name, Guest: state.Guest{User: "dev"},
			Resources: state.Resources{CPUs: 2, MemoryMiB: 2048}, Paths: state.Layout{Dir: "/final/feat"}.Paths(), Git: state.Git{Source: source}}
		r.Ports.SSH, r.Ports.MCP = 2201, 8001
		vf := filepath.Join(source, "Vagrantfile")
		if err := os.WriteFile(vf, []byte("mine"), 0o644); err != nil {
			t.Fatal(err)
		}
		return staging, r, vf
	}

	staging, r, vf := setup(t)
	if err := b.Provision(context.Background(), staging, r, backend.CreateFlags{}); err != nil {
		t.Fatal(err)
	}
	s, err := state.SectionOf[Settings](r)
	if err != nil || s.Vagrantfile != vf || s.Machine != "default" || r.Guest.Foreign != vf {
		t.Errorf("record: %+v, foreign %q, %v", s, r.Guest.Foreign, err)
	}
	if _, err := os.Stat(filepath.Join(vagrant.Project(staging.RunDir()), "Vagrantfile")); err == nil {
		t.Error("agent-vm also wrote its own Vagrantfile")
	}
	u, err := os.ReadFile(filepath.Join(vagrant.Project(staging.RunDir()), vagrant.UserFile))
	if err != nil || !strings.Contains(string(u), `"dir": "/final/feat/run/vagrant/agent-vm-feat-0123abcd"`) || !strings.Contains(string(u), `"machine": "default"`) {
		t.Errorf("%s: %s %v", vagrant.UserFile, u, err)
	}
	if ws, err := os.Readlink(filepath.Join(vagrant.Project(staging.RunDir()), "agent-vm-feat-0123abcd")); err != nil || ws != "/final/feat/workspace" {
		t.Errorf("the project link: %q %v", ws, err)
	}
	calls := fake.Calls()
	if len(calls) != 1 || strings.Join(calls[0].Args, " ") != "status --machine-readable" || !slices.Contains(calls[0].Env, "VAGRANT_CWD="+staging.Workspace()) ||
		!slices.Contains(calls[0].Env, "VAGRANT_VAGRANTFILE="+vf) || !slices.Contains(calls[0].Env, "VAGRANT_DOTFILE_PATH="+filepath.Join(vagrant.Project(staging.RunDir()), ".vagrant")) {
		t.Errorf("vagrant calls: %+v", calls)
	}
	if got, _ := os.ReadFile(vf); string(got) != "mine" {
		t.Errorf("the repository's Vagrantfile was changed: %q", got)
	}

	// --vagrantfile=generate: agent-vm's own, the repository's untouched.
	staging, r, _ = setup(t)
	if err := b.Provision(context.Background(), staging, r, backend.CreateFlags{Vagrantfile: VagrantfileGenerate}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(vagrant.Project(staging.RunDir()), "Vagrantfile")); err != nil || r.Guest.Foreign != "" {
		t.Errorf("generate: %v, foreign %q", err, r.Guest.Foreign)
	}

	refused := map[string]struct {
		flags    backend.CreateFlags
		machines []string
		noFile   bool
		want     string
	}{
		"two machines":      {machines: []string{"web", "db"}, want: "2 machines (web, db)"},
		"--box":             {flags: backend.CreateFlags{Box: "x/y"}, want: "--box does not apply"},
		"--agent":           {flags: backend.CreateFlags{Agent: "claude"}, want: "--agent"},
		"packages":          {flags: backend.CreateFlags{Packages: []string{"jq"}}, want: "--packages"},
		"repo without file": {flags: backend.CreateFlags{Vagrantfile: VagrantfileRepo}, noFile: true, want: "has no Vagrantfile"},
	}
	for name, c := range refused {
		t.Run(name, func(t *testing.T) {
			machines = c.machines
			if machines == nil {
				machines = []string{"default"}
			}
			staging, r, vf := setup(t)
			if c.noFile {
				_ = os.Remove(vf)
			}
			err := b.Provision(context.Background(), staging, r, c.flags)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "hint:") {
				t.Errorf("got %v, want an error saying %q with a hint", err, c.want)
			}
		})
	}
}

func TestVagrantPrepareOwnVagrantfile(t *testing.T) {
	l, source := state.Layout{Dir: t.TempDir()}, t.TempDir()
	r := &state.Record{ID: "0123abcd-aaaa", Branch: "feat", MachineName: "agent-vm-feat", Backend: Name, Git: state.Git{Source: source}}
	if err := r.SetSection(Settings{Vagrantfile: filepath.Join(source, "Vagrantfile"), Machine: "default"}); err != nil {
		t.Fatal(err)
	}
	b := &Backend{}
	if _, err := b.Prepare(context.Background(), l, r, backend.PrepareOptions{}); err == nil || !strings.Contains(err.Error(), "which is gone") {
		t.Errorf("a Vagrantfile gone since create: %v", err)
	}
	if err := os.Mkdir(filepath.Join(source, "Vagrantfile"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Prepare(context.Background(), l, r, backend.PrepareOptions{}); !errors.Is(err, vagrant.ErrNotUsable) {
		t.Errorf("a Vagrantfile now a directory: %v", err)
	}
	_ = os.Remove(filepath.Join(source, "Vagrantfile"))
	if err := os.WriteFile(filepath.Join(source, "Vagrantfile"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Prepare(context.Background(), l, r, backend.PrepareOptions{StartFlags: backend.StartFlags{Reprovision: true}}); err == nil || !strings.Contains(err.Error(), "vagrant provision") {
		t.Errorf("--reprovision: %v", err)
	}
	plan, err := b.Prepare(context.Background(), l, r, backend.PrepareOptions{})
	if err != nil {
		t.Fatal(err)
	}
	boot, ok := plan.Boot.(vagrant.Boot)
	if !ok || boot.User == nil || boot.User.Machine != "default" || plan.Settle != "" {
		t.Fatalf("plan %+v", plan)
	}
	if ws, err := os.Readlink(boot.User.Dir); err != nil || ws != l.Workspace() || filepath.Base(boot.User.Dir) != "agent-vm-feat-0123abcd" {
		t.Errorf("VAGRANT_CWD %s is not a link named after the machine to the workspace: %q %v", boot.User.Dir, ws, err)
	}
	if _, err := os.Stat(filepath.Join(l.Dir, seed.File)); err == nil {
		t.Error("a seed was written for the repository's own Vagrantfile")
	}
}

// CheckCreate checks --box and --vagrantfile, and refuses the qemu
// backend's --image.
func TestCheckCreateFlags(t *testing.T) {
	for _, box := range []string{"x\ny", "nul\x00byte", "\xff\xfe invalid", "\x04", " padded"} {
		if err := (&Backend{}).CheckCreate(backend.CreateFlags{Box: box}); err == nil || !strings.Contains(err.Error(), "--box") {
			t.Errorf("--box %q: %v; want it refused, naming --box", box, err)
		}
	}
	if err := (&Backend{}).CheckCreate(backend.CreateFlags{Box: "debian/bookworm64"}); err != nil {
		t.Errorf("--box debian/bookworm64: %v", err)
	}
	if err := (&Backend{}).CheckCreate(backend.CreateFlags{Image: "/a.qcow2"}); err == nil {
		t.Error("vagrant backend took --image")
	}
	if err := (&Backend{}).CheckCreate(backend.CreateFlags{Vagrantfile: "mine"}); err == nil || !strings.Contains(err.Error(), "auto") {
		t.Errorf("--vagrantfile mine: %v", err)
	}
}
