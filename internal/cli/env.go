package cli

import (
	"context"
	"os"
	"path/filepath"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/agent-vm/agent-vm/internal/accel"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/cloudinit"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/nixos"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vm"
)

// env is what a command's action works with.
type env struct {
	g     globals
	log   hclog.Logger
	stdio IO
	run   execx.Runner
	// nixpkgs is start's --nixpkgs (nixos backend).
	nixpkgs string
}

func newEnv(cliCtx *cli.Context, stdio IO) *env {
	g := parseGlobals(cliCtx, stdio)
	e := &env{g: g, log: newLogger(g, stdio.Err), stdio: stdio, run: execx.OS{}}
	if cliCtx.Command != nil && hasFlag(cliCtx.Command, "nixpkgs") {
		e.nixpkgs = cliCtx.String("nixpkgs")
	}
	return e
}

// cacheDir is $XDG_CACHE_HOME/agent-vm (images, the accelerator probe).
func (e *env) cacheDir() string {
	if d := e.stdio.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "agent-vm")
	}
	home := e.stdio.Getenv("HOME")
	if home == "" {
		home, _ = os.UserHomeDir()
	}
	return filepath.Join(home, ".cache", "agent-vm")
}

// manager opens the state directory and wires the orchestration.
func (e *env) manager() (*vm.Manager, error) {
	root, err := state.Open(e.g.stateDir)
	if err != nil {
		return nil, err
	}
	launcher, err := qemu.NewLauncher(e.run, e.log.Named("qemu"))
	if err != nil {
		return nil, err
	}
	m := vm.New(root, e.run, e.log, launcher, e.backends()...)
	m.Accel = e.probeAccel
	m.WorkDir, _ = os.Getwd() // "" (outside any repository) if it is gone
	return m, nil
}

// backends lists the VM flavours this build has.
func (e *env) backends() []backend.Backend {
	q := &cloudinit.Backend{Run: e.run, Log: e.log.Named("qemu"), ImageDir: e.imageDir(), Executable: os.Executable}
	if os.Geteuid() == 0 {
		// "It works first time": the first start on a host builds the base
		// image (mmdebstrap's root mode needs root).
		q.BuildImage = func(ctx context.Context) (*image.Image, error) {
			if err := setupFirst(ctx, e, hostpkgs.Image); err != nil {
				return nil, err
			}
			return e.buildImage(ctx)
		}
	}
	return []backend.Backend{
		q,
		&nixos.Backend{Run: e.run, Log: e.log.Named("nixos"), Getenv: e.stdio.Getenv, Nixpkgs: e.nixpkgs,
			Executable: os.Executable, Progress: e.stdio.Err},
	}
}

// probeAccel decides between KVM and TCG once per host boot (cached).
func (e *env) probeAccel(ctx context.Context) accel.Result {
	a, err := qemu.HostArch()
	if err != nil {
		return accel.Result{Accel: accel.TCG, Reason: err.Error()}
	}
	qemuPath, err := e.run.LookPath(a.Binary)
	if err != nil {
		qemuPath = a.Binary
	}
	kernels, _ := filepath.Glob(filepath.Join(e.cacheDir(), "images", "*", "vmlinuz*"))
	kernels = append(kernels, "/run/current-system/kernel")
	p := &accel.Prober{Run: e.run, QEMU: qemuPath, Kernels: kernels,
		Cache: filepath.Join(e.cacheDir(), "accel.json"), Override: e.stdio.Getenv("AGENT_VM_ACCEL")}
	return p.Probe(ctx)
}

func hasFlag(c *cli.Command, name string) bool {
	for _, f := range c.Flags {
		for _, n := range f.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}
