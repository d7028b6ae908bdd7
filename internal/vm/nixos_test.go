package vm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/execx/execxtest"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/nixos"
	"github.com/agent-vm/agent-vm/internal/ports"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/state"
	tu "github.com/agent-vm/agent-vm/internal/testutil"
	"github.com/agent-vm/agent-vm/internal/virtiofsd"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// TestNixOSStartHandsTheRunScriptItsArguments drives `start` of a
// nixos-backend VM through the real orchestration and launcher, with a FAKE
// at the exec boundary (execxtest) standing in for nix (these machines cannot
// evaluate nixpkgs) and for the run-<name>-vm script it builds. The fake
// records what it was asked; the test checks the exact nix build command and
// what the launcher handed the run script: its environment and the QEMU
// arguments for QMP, the pid file, the serial log, the workspace and the
// secrets. The fake run script "exits at once", so the start fails the way a
// QEMU that cannot start does.
func TestNixOSStartHandsTheRunScriptItsArguments(t *testing.T) {
	m, fake, root, store, exe := nixosVM(t)
	runScript := nixosRunScript(store)
	// --reprovision means nothing to a NixOS guest: refused before any build.
	_, err := m.Start(context.Background(), "feature/x", vm.StartOptions{Reprovision: true})
	if err == nil || !strings.Contains(err.Error(), "--reprovision") || !strings.Contains(err.Error(), "nixos backend") {
		t.Fatalf("start --reprovision of a nixos VM: got %v, want a refusal naming the flag and the backend", err)
	}
	for _, c := range fake.Calls() {
		if filepath.Base(c.Path) == "nix" && slices.Contains(c.Args, "build") {
			t.Fatalf("a refused start ran nix build: %v", c.Args)
		}
	}
	_, err = m.Start(context.Background(), "feature/x", vm.StartOptions{})
	if err == nil || !strings.Contains(err.Error(), "QEMU exited at once") {
		t.Fatalf("start: got %v, want the fake run script's early exit reported", err)
	}

	l := root.Layout("feature-x")
	rec, _ := state.ReadRecord(l.Record())
	var build, run *execxtest.Call
	for _, c := range fake.Calls() {
		c := c
		switch {
		case filepath.Base(c.Path) == "nix" && len(c.Args) > 2 && c.Args[2] == "build":
			build = &c
		case c.Detached && c.Path == runScript:
			run = &c
		}
	}
	if build == nil || run == nil {
		t.Fatalf("calls: %+v", fake.Calls())
	}
	if got := strings.Join(build.Args, " "); got != "--extra-experimental-features nix-command build --out-link "+filepath.Join(l.Dir, "nix-gcroot")+" --print-out-paths --json --file "+filepath.Join(l.Dir, "default.nix")+" vm launcher" {
		t.Errorf("nix build: %s", got)
	}
	// The out-links (GC roots) point at the build's outputs.
	for link, want := range map[string]string{"nix-gcroot": filepath.Join(store, "vm"), "nix-gcroot-1": filepath.Join(store, "launcher.json")} {
		if got, err := os.Readlink(filepath.Join(l.Dir, link)); err != nil || got != want {
			t.Errorf("out-link %s -> %q (%v), want %s", link, got, err, want)
		}
	}
	// The run script's whole environment, nothing inherited from ours.
	wantEnv := []string{
		"PATH=", // the test backend's Getenv has no PATH
		"NIX_DISK_IMAGE=" + filepath.Join(l.Dir, "disk.qcow2"),
		"TMPDIR=" + filepath.Join(l.RunDir(), "tmp"),
		"USE_TMPDIR=1",
		// The same containment as the Debian guest's: restrict=on
		// and the egress proxy's guestfwd rules, appended to the script's netdev.
		"QEMU_NET_OPTS=restrict=on,guestfwd=tcp:10.0.2.100:3128-cmd:" + exe + " __net-relay " + filepath.Join(l.RunDir(), "egress.sock"),
		// Under TCG, the kernel's parameter that lets TCG reuse its
		// translations (accel.TCGKernelParams).
		"QEMU_KERNEL_PARAMS=norandmaps",
	}
	if !run.ExactEnv || !slices.Equal(run.Env, wantEnv) {
		t.Errorf("run script env (exact %v):\n%q\nwant exactly\n%q", run.ExactEnv, run.Env, wantEnv)
	}
	env := strings.Join(run.Env, "\n")
	args := strings.Join(run.Args, " ")
	for _, want := range []string{
		"-uuid " + rec.ID,
		"-machine accel=tcg",
		"-virtfs local,path=" + l.Workspace() + ",mount_tag=workspace,security_model=none",
		"-fw_cfg name=opt/io.systemd.credentials/agent-vm.mcp-token,file=" + l.MCPToken(),
		"-fw_cfg name=opt/io.systemd.credentials/agent-vm.ssh-host-key,file=" + l.HostKey(),
		"-serial file:" + l.Log("console.log"),
		"-qmp unix:" + l.Run("qmp.sock") + ",server=on,wait=off",
		"-pidfile " + l.Run("qemu.pid"),
	} {
		if !strings.Contains(args, want) {
			t.Errorf("run script args lack %q:\n%s", want, args)
		}
	}
	// The secrets reach QEMU as file names, never as values.
	key, _ := os.ReadFile(l.HostKey())
	tok, _ := os.ReadFile(l.MCPToken())
	if strings.Contains(args+env, strings.TrimSpace(string(tok))) || strings.Contains(args+env, "PRIVATE KEY") || len(key) == 0 {
		t.Error("a secret's value is on the run script's command line or environment")
	}
}

// TestNixOSDestroyRemovesTheGCRoots: destroy leaves no out-link behind,
// anywhere under the state directory, so nix may collect the VM's system.
func TestNixOSDestroyRemovesTheGCRoots(t *testing.T) {
	repo := tu.Repo(t, false)
	root, err := state.Open(hostdir.StateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	fake := execxtest.New(t).Installed("git", "/usr/bin/git")
	fake.On("git", func(c execxtest.Call) execxtest.Reply {
		res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: "git", Args: c.Args, Env: c.Env})
		r := execxtest.Reply{Stdout: string(res.Stdout), Stderr: string(res.Stderr), ExitCode: res.ExitCode}
		if err != nil && res.ExitCode <= 0 {
			r.Err = err
		}
		return r
	})
	launcher, _ := qemu.NewLauncher(fake, hclog.NewNullLogger())
	exe := staticTestBinary(t)
	nixpkgs := t.TempDir()
	os.MkdirAll(filepath.Join(nixpkgs, "nixos", "lib"), 0o755)
	os.WriteFile(filepath.Join(nixpkgs, "nixos", "lib", "eval-config.nix"), nil, 0o644)
	be := &nixos.Backend{Run: fake, Log: hclog.NewNullLogger(), Getenv: func(string) string { return "" }, Pinned: nixpkgs,
		Executable: func() (string, error) { return exe, nil }}
	m := vm.New(root, fake, hclog.NewNullLogger(), []driver.Driver{qemu.NewDriver(launcher)}, be)
	fakeEgress(fake, m, exe)
	if _, err := m.Create(context.Background(), vm.CreateOptions{Repo: repo, Branch: "feature/x", Backend: vm.BackendNixOS, CPUs: 2, MemoryMiB: 2048}); err != nil {
		t.Fatal(err)
	}
	// What a build left: the two out-links into the store.
	l := root.Layout("feature-x")
	store := t.TempDir()
	for _, p := range nixos.GCRoots(l.Dir) {
		if err := os.Symlink(store, p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Destroy(context.Background(), "feature/x", true); err != nil {
		t.Fatal(err)
	}
	filepath.WalkDir(root.Dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSymlink != 0 {
			if dst, _ := os.Readlink(p); dst == store {
				t.Errorf("out-link %s survived destroy", p)
			}
		}
		return nil
	})
}

// staticTestBinary builds a static program to stand in for agent-vm as the
// guest's MCP proxy (the nixos backend refuses a dynamic one).
func staticTestBinary(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\nfunc main() {}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module x\ngo 1.24\n"), 0o644)
	cmd := exec.Command("go", "build", "-o", "stand-in", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return filepath.Join(dir, "stand-in")
}

// fakeEgress makes exe the VM's agent-vm and answers its egress proxy's
// start by creating the sockets the launcher waits for.
func fakeEgress(fake *execxtest.Fake, m *vm.Manager, exe string) {
	m.Executable = func() (string, error) { return exe, nil }
	fake.On(filepath.Base(exe), func(c execxtest.Call) execxtest.Reply {
		for i, a := range c.Args {
			if (a == "--proxy-socket" || a == "--exposed-socket") && i+1 < len(c.Args) {
				os.WriteFile(c.Args[i+1], nil, 0o600)
			}
		}
		return execxtest.Reply{}
	})
}

// nixosVM makes the nixos-backend VM feature/x with a FAKE at the exec
// boundary (execxtest) standing in for nix, which builds a run script
// (nixosRunScript(store)) whose start the fake records and "exits at once";
// git is the real one, for create's clone. exe stands in for agent-vm.
func nixosVM(t *testing.T) (m *vm.Manager, fake *execxtest.Fake, root *state.Root, store, exe string) {
	t.Helper()
	repo := tu.Repo(t, false)
	root, err := state.Open(hostdir.StateDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	store = t.TempDir()
	nixpkgs := t.TempDir()
	os.MkdirAll(filepath.Join(nixpkgs, "nixos", "lib"), 0o755)
	os.WriteFile(filepath.Join(nixpkgs, "nixos", "lib", "eval-config.nix"), nil, 0o644)
	runScript := nixosRunScript(store)
	fake = execxtest.New(t).Installed("git", "/usr/bin/git")
	fake.On("git", func(c execxtest.Call) execxtest.Reply { // the real git, for create's clone
		res, err := execx.OS{}.Run(context.Background(), execx.Cmd{Path: "git", Args: c.Args, Env: c.Env})
		r := execxtest.Reply{Stdout: string(res.Stdout), Stderr: string(res.Stderr), ExitCode: res.ExitCode}
		if err != nil && res.ExitCode <= 0 {
			r.Err = err
		}
		return r
	})
	fake.On("nix", func(c execxtest.Call) execxtest.Reply {
		if len(c.Args) == 1 && c.Args[0] == "--version" {
			return execxtest.Reply{Stdout: "nix (Nix) 2.24.9\n"}
		}
		os.MkdirAll(filepath.Dir(runScript), 0o755)
		os.WriteFile(runScript, []byte("#!/bin/sh\n"), 0o755)
		launcher := filepath.Join(store, "launcher.json")
		os.WriteFile(launcher, []byte(`{"runScript":"bin/run-feature-x-vm","workspace":{"transport":"9p"}}`), 0o644)
		// As nix build --out-link L does for two installables: L and L-1.
		for i, a := range c.Args {
			if a == "--out-link" && i+1 < len(c.Args) {
				os.Symlink(filepath.Join(store, "vm"), c.Args[i+1])
				os.Symlink(launcher, c.Args[i+1]+"-1")
			}
		}
		return execxtest.Reply{Stdout: fmt.Sprintf(`[{"outputs":{"out":%q}},{"outputs":{"out":%q}}]`, filepath.Join(store, "vm"), launcher)}
	})
	fake.On("run-feature-x-vm", func(execxtest.Call) execxtest.Reply { return execxtest.Reply{ExitCode: 1} })

	launcher, _ := qemu.NewLauncher(fake, hclog.NewNullLogger())
	exe = staticTestBinary(t)
	be := &nixos.Backend{Run: fake, Log: hclog.NewNullLogger(), Getenv: func(string) string { return "" }, Pinned: nixpkgs,
		Executable: func() (string, error) { return exe, nil }}
	// A host without virtiofsd: the VM is built for, and given, a 9p share.
	d := qemu.NewDriver(launcher)
	d.FindVirtiofsd = func(context.Context) (*virtiofsd.Binary, error) { return nil, fmt.Errorf("no virtiofsd") }
	m = vm.New(root, fake, hclog.NewNullLogger(), []driver.Driver{d}, be)
	fakeEgress(fake, m, exe)
	m.Accel = func(context.Context) accel.Result { return accel.Result{Accel: accel.TCG, Reason: "test"} }
	if _, err := m.Create(context.Background(), vm.CreateOptions{Repo: repo, Branch: "feature/x", Backend: vm.BackendNixOS, CPUs: 2, MemoryMiB: 2048}); err != nil {
		t.Fatal(err)
	}
	return m, fake, root, store, exe
}

func nixosRunScript(store string) string {
	return filepath.Join(store, "vm", "bin", "run-feature-x-vm")
}

// A port agent-vm picked that another program takes after the start's
// rebind looked (between its check and QEMU's bind) fails the launcher's
// check with ports.ErrTaken: the start then moves it, prepares again (a
// NixOS build has its SSH and MCP ports in it) and starts on the moved
// one. Here the Manager's probe tells rebind the port is free once, as
// the race would; the launcher's own probe is the real one.
func TestAPortTakenAfterTheCheckMovesAtTheStart(t *testing.T) {
	m, fake, root, store, _ := nixosVM(t)
	l := root.Layout("feature-x")
	rec, err := state.ReadRecord(l.Record())
	if err != nil {
		t.Fatal(err)
	}
	held := rec.Ports.SSH
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", held))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lied := false
	m.PortFree = func(p int) bool {
		if p == held && !lied {
			lied = true
			return true
		}
		return ports.Listenable(p)
	}
	_, err = m.Start(context.Background(), "feature/x", vm.StartOptions{})
	if err == nil || !strings.Contains(err.Error(), "QEMU exited at once") {
		t.Fatalf("start: got %v, want it past the taken port, at the fake run script's early exit", err)
	}
	if rec, err = state.ReadRecord(l.Record()); err != nil || rec.Ports.SSH == held || rec.Ports.SSHChosen {
		t.Fatalf("the record's SSH port: %d (chosen %v, %v), want moved from %d", rec.Ports.SSH, rec.Ports.SSHChosen, err, held)
	}
	var builds, runs int
	for _, c := range fake.Calls() {
		switch {
		case filepath.Base(c.Path) == "nix" && slices.Contains(c.Args, "build"):
			builds++
		case c.Detached && c.Path == nixosRunScript(store):
			runs++
		}
	}
	if builds != 2 || runs != 1 {
		t.Errorf("%d nix builds and %d run script starts, want 2 (the second with the moved port) and 1", builds, runs)
	}
	var v struct {
		Ports struct{ SSH int }
	}
	if b, err := os.ReadFile(filepath.Join(l.Dir, nixos.VMJSONFile)); err != nil || json.Unmarshal(b, &v) != nil || v.Ports.SSH != rec.Ports.SSH {
		t.Errorf("vm.json's SSH port %d (%v), want the moved %d", v.Ports.SSH, err, rec.Ports.SSH)
	}
	if b, _ := os.ReadFile(l.KnownHosts()); !strings.Contains(string(b), fmt.Sprintf("[127.0.0.1]:%d ", rec.Ports.SSH)) {
		t.Errorf("known_hosts does not pin the host key at the moved port %d:\n%s", rec.Ports.SSH, b)
	}
}
