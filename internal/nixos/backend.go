package nixos

import (
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/tidwall/gjson"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/qemu"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/modules"
)

// Name is the backend's name in VM records.
const Name = "nixos"

// Backend builds per-branch NixOS VMs with nix.
type Backend struct {
	Run    execx.Runner
	Log    hclog.Logger
	Getenv func(string) string
	// Pinned replaces the nixpkgs this build carries (set at link time by
	// the flake); tests point it at a stand-in tree. Start's --nixpkgs and
	// create's still win over it.
	Pinned string
	// Executable is the agent-vm binary the guest runs as its MCP proxy.
	Executable func() (string, error)
	// Progress receives nix's own output while it builds.
	Progress io.Writer
}

var _ backend.Backend = (*Backend)(nil)

// Name implements backend.Backend.
func (b *Backend) Name() string { return Name }

// Driver is "qemu": QEMU runs the VMs.
func (b *Backend) Driver() string { return qemu.DriverName }

// Provision writes vm.json, default.nix, data.nix and the modules into the
// new VM's directory. A local nixpkgs is resolved now; a flake reference at
// start (fetching it needs nix, which this host may not have yet).
func (b *Backend) Provision(ctx context.Context, l state.Layout, r *state.Record, f backend.CreateFlags) error {
	s := Settings{Config: f.Config, Nixpkgs: f.Nixpkgs}
	if s.Config != "" {
		abs, err := filepath.Abs(s.Config)
		if err != nil {
			return fmt.Errorf("--config %s: %w", s.Config, err)
		}
		s.Config = abs
	}
	nixpkgs := ""
	if src, err := pickNixpkgs("", s.Nixpkgs, b.pinned(), b.Getenv("NIX_PATH")); err == nil && isPath(src.value) {
		p, err := resolveNixpkgs(ctx, b.Run, "", src)
		if err != nil && s.Nixpkgs != "" {
			return err
		}
		if s.Nixpkgs != "" {
			s.Nixpkgs = p // the absolute path, so a later cwd does not matter
		}
		nixpkgs = p
	}
	if err := r.SetSection(s); err != nil {
		return err
	}
	exe, err := b.guestExecutable()
	if err != nil {
		return err
	}
	v, err := newVMJSON(l, r, nixpkgs, string(driver.ShareVirtiofs), exe)
	if err != nil {
		return err
	}
	return writeFiles(l.Dir, v)
}

// Settings is this backend's section of the VM record.
type Settings struct {
	// Config is the user's extra NixOS module (--config), an absolute path.
	Config string `json:"config,omitempty"`
	// Nixpkgs is the nixpkgs chosen at create (--nixpkgs: a path or a flake
	// reference); empty means the pinned one, else NIX_PATH.
	Nixpkgs string `json:"nixpkgs,omitempty"`
}

// Doctor implements backend.Backend: the VM is built with nix, so nix (new
// enough to evaluate nixpkgs) is all this backend needs besides QEMU.
func (b *Backend) Doctor(ctx context.Context) backend.Readiness {
	nix, err := b.findNix(ctx)
	if err != nil {
		return backend.Readiness{Checks: []backend.Check{{Name: "nix (nixos backend)", Detail: err.Error()}}}
	}
	return backend.Readiness{Ready: true, Checks: []backend.Check{{Name: "nix (nixos backend)", OK: true, Detail: nix}}}
}

// Release implements backend.Backend: the out-links that keep the VM's
// system from nix-collect-garbage go before the directory.
func (b *Backend) Release(l state.Layout) error {
	if err := RemoveGCRoots(l.Dir); err != nil {
		return fmt.Errorf("removing the VM's nix GC roots: %w", err)
	}
	return nil
}

// ImagesInUse implements backend.Backend: a NixOS VM's disk is its own,
// built by nix; it uses no cached image.
func (b *Backend) ImagesInUse(state.Layout) []string { return nil }

// CheckCreate implements backend.Backend.
func (b *Backend) CheckCreate(f backend.CreateFlags) error {
	if f.Image != "" {
		return fmt.Errorf("--image sets the base disk image of the qemu backend; the nixos backend builds its own (hint: drop --image, or pass --backend qemu)")
	}
	if f.Box != "" {
		return fmt.Errorf("--box chooses the Vagrant box of the vagrant backend; the nixos backend builds its own system (hint: drop --box, or pass --backend vagrant)")
	}
	if f.Vagrantfile != "" && f.Vagrantfile != "auto" {
		return fmt.Errorf("--vagrantfile chooses the Vagrantfile of the vagrant backend; the nixos backend runs no vagrant (hint: drop --vagrantfile, or pass --backend vagrant)")
	}
	if err := CheckPackages(f.Packages); err != nil {
		return err
	}
	if f.Agent != "" {
		return fmt.Errorf("--agent %s: the nixos backend cannot install agent CLIs yet (hint: use --backend qemu, or add the package in your --config module)", f.Agent)
	}
	if f.Config != "" {
		fi, err := os.Stat(f.Config)
		if err != nil || fi.IsDir() {
			return fmt.Errorf("--config %s: not a readable file (hint: pass the path of a NixOS module, e.g. ./vm-config.nix)", f.Config)
		}
	}
	return nil
}

// Reset implements backend.Backend: the root disk image goes (qemu-vm.nix's
// run script makes a new one at the next boot), and with it the
// provisioning stamp. The system is rebuilt from the record as at any start;
// the host key comes from fw_cfg at every boot, so it stays the same.
func (b *Backend) Reset(_ context.Context, l state.Layout, _ *state.Record) error {
	if err := os.Remove(filepath.Join(l.Dir, DiskImage)); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("removing the VM's root disk: %w", err)
	}
	return nil
}

// CheckStart implements backend.Backend. A NixOS guest is its configuration,
// built again at every start: there is no first-boot setup to repeat.
func (b *Backend) CheckStart(r *state.Record, f backend.StartFlags) error {
	if f.Reprovision {
		return fmt.Errorf("--reprovision runs a cloud-init guest's first-boot setup again; VM %q uses the nixos backend, whose guest is rebuilt from its NixOS configuration at every start (hint: drop --reprovision; change the VM's --config module and start it)", r.Branch)
	}
	return nil
}

// pinned is the nixpkgs this build carries (or the test's Pinned).
func (b *Backend) pinned() string {
	if b.Pinned != "" {
		return b.Pinned
	}
	return defaultNixpkgs
}

// Prepare implements backend.Backend: it builds the VM with nix (unless
// nothing changed since the last build) and returns its run script.
func (b *Backend) Prepare(ctx context.Context, l state.Layout, r *state.Record, o backend.PrepareOptions) (*backend.Plan, error) {
	nix, err := b.findNix(ctx)
	if err != nil {
		return nil, err
	}
	s, err := state.SectionOf[Settings](r)
	if err != nil {
		return nil, err
	}
	src, err := pickNixpkgs(o.Nixpkgs, s.Nixpkgs, b.pinned(), b.Getenv("NIX_PATH"))
	if err != nil {
		return nil, err
	}
	nixpkgs, err := resolveNixpkgs(ctx, b.Run, nix, src)
	if err != nil {
		return nil, err
	}
	exe, err := b.guestExecutable()
	if err != nil {
		return nil, err
	}
	v, err := newVMJSON(l, r, nixpkgs, string(o.Share), exe)
	if err != nil {
		return nil, err
	}
	v.CACertificates = append(v.CACertificates, o.CACerts...)
	maps.Copy(v.Environment, o.Placeholders)
	maps.Copy(v.GitCredentials, o.GitCredentials)
	if err := writeFiles(l.Dir, v); err != nil {
		return nil, err
	}
	out, err := b.build(ctx, nix, l, r, o)
	if err != nil {
		return nil, err
	}
	return b.plan(l, r, out, o.Share)
}

// SettleCommand waits until the guest's boot is done, the repository's
// provisioning (agent-vm-provision.service) included, so start can report
// how it went. It needs no privilege.
const SettleCommand = "systemctl is-system-running --wait >/dev/null 2>&1; true"

// minNix is the oldest nix that evaluates nixpkgs 26.05 and has
// `nix build --print-out-paths`.
const minNix = "2.18"

var versionRE = regexp.MustCompile(`(\d+)\.(\d+)(?:\.(\d+))?`)

// findNix finds nix and checks its version.
func (b *Backend) findNix(ctx context.Context) (string, error) {
	nix, err := b.Run.LookPath("nix")
	if err != nil {
		return "", fmt.Errorf("the nixos backend needs nix, which is not installed here (hint: install Nix from https://nixos.org/download, or use the qemu backend instead: `agent-vm create --backend qemu`)")
	}
	res, err := b.Run.Run(ctx, execx.Cmd{Path: nix, Args: []string{"--version"}})
	if err != nil {
		return "", fmt.Errorf("running %s --version: %w", nix, err)
	}
	m := versionRE.FindStringSubmatch(string(res.Stdout))
	if m == nil {
		return "", fmt.Errorf("cannot read nix's version from %q", strings.TrimSpace(string(res.Stdout)))
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	if major < 2 || (major == 2 && minor < 18) {
		return "", fmt.Errorf("nix %s.%s is too old for the nixos backend, which needs nix %s or newer to evaluate nixpkgs 26.05 (hint: upgrade nix, or use `--backend qemu`)", m[1], m[2], minNix)
	}
	return nix, nil
}

// guestExecutable is the agent-vm binary the guest will run: this one. It
// must be statically linked (NixOS has no /lib64/ld-linux*).
func (b *Backend) guestExecutable() (string, error) {
	exe, err := b.Executable()
	if err != nil {
		return "", fmt.Errorf("finding the agent-vm binary for the guest: %w", err)
	}
	if p, err := filepath.EvalSymlinks(exe); err == nil {
		exe = p
	}
	f, err := elf.Open(exe)
	if err != nil {
		return "", fmt.Errorf("agent-vm at %s is not a Linux executable the guest can run: %w", exe, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("agent-vm at %s is dynamically linked, and the NixOS guest runs it as its MCP proxy (hint: use the Nix-built agent-vm, or build a static one: CGO_ENABLED=0 go install ./cmd/agent-vm)", exe)
		}
	}
	return exe, nil
}

// buildOutputs are the store paths of a build.
type buildOutputs struct {
	Inputs   string `json:"inputs"` // hash of everything the build read
	VM       string `json:"vm"`
	Launcher string `json:"launcher"`
}

// build runs nix build, unless the inputs are those of the last build and
// its outputs still exist.
func (b *Backend) build(ctx context.Context, nix string, l state.Layout, r *state.Record, o backend.PrepareOptions) (*buildOutputs, error) {
	inputs, err := inputsHash(l.Dir, r)
	if err != nil {
		return nil, err
	}
	recordPath := filepath.Join(l.Dir, BuildRecord)
	var last buildOutputs
	if raw, err := os.ReadFile(recordPath); err == nil && json.Unmarshal(raw, &last) == nil &&
		last.Inputs == inputs && exists(last.VM) && exists(last.Launcher) && gcRooted(l.Dir, &last) {
		b.Log.Debug("nix build skipped: nothing changed since the last build", "vm", last.VM)
		return &last, nil
	}
	o.Report.Report("building the NixOS VM with nix", 0, "")
	// --out-link, not --no-link: the links are GC roots, so
	// nix-collect-garbage cannot delete the VM's system while the VM exists.
	args := []string{"--extra-experimental-features", "nix-command", "build", "--out-link", filepath.Join(l.Dir, GCRoot),
		"--print-out-paths", "--json", "--file", filepath.Join(l.Dir, DefaultNix), "vm", "launcher"}
	res, err := b.Run.Run(ctx, execx.Cmd{Path: nix, Args: args, Stderr: b.Progress})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("nix could not build the VM: %s\n(hint: fix the error above, e.g. in your --config module; to reproduce: cd %s && nix build -f default.nix vm)",
			execx.Tail(res.Stderr, 3000), execx.ShellQuote(l.Dir))
	}
	outs := gjson.GetBytes(res.Stdout, "#.outputs.out").Array()
	if len(outs) != 2 || outs[0].String() == "" || outs[1].String() == "" {
		return nil, fmt.Errorf("nix build printed no output paths for vm and launcher: %s", execx.Tail(res.Stdout, 500))
	}
	out := &buildOutputs{Inputs: inputs, VM: outs[0].String(), Launcher: outs[1].String()}
	raw, _ := json.MarshalIndent(out, "", "  ")
	if err := atomicfile.Write(recordPath, append(raw, '\n'), 0o600); err != nil {
		return nil, err
	}
	return out, nil
}

// plan reads the launcher description the build made and returns how to
// boot: the run script with the disk and temp dir in the VM's directory.
func (b *Backend) plan(l state.Layout, r *state.Record, out *buildOutputs, share driver.ShareMode) (*backend.Plan, error) {
	raw, err := os.ReadFile(out.Launcher)
	if err != nil {
		return nil, fmt.Errorf("reading the build's launcher description: %w", err)
	}
	script := gjson.GetBytes(raw, "runScript").String()
	if script == "" || strings.Contains(script, "..") {
		return nil, fmt.Errorf("the build's launcher description %s has no usable runScript", out.Launcher)
	}
	if t := gjson.GetBytes(raw, "workspace.transport").String(); t != string(share) {
		return nil, fmt.Errorf("the VM was built for a %s workspace but the launcher will share it over %s", t, share)
	}
	tmp := filepath.Join(l.RunDir(), "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, err
	}
	return &backend.Plan{
		Boot: qemu.Boot{Script: &qemu.Script{
			Path:   filepath.Join(out.VM, script),
			Env:    scriptEnv(l, b.Getenv("PATH")),
			Netdev: ScriptNetdev,
			// The guest module forwards these two (forwardPorts); the
			// launcher adds the user's own (agent-vm port).
			Forwarded: []int{r.Ports.SSH, r.Ports.MCP},
		}},
		Credentials: []driver.Credential{{Name: guest.HostKeyCredential, File: l.HostKey()}},
		FixedShare:  true,
		Settle:      SettleCommand,
	}, nil
}

// ScriptNetdev is the id of the user-mode netdev nixpkgs' run script makes
// (qemu-vm.nix's networkingOptions: `-netdev user,id=user.0,...`).
const ScriptNetdev = "user.0"

// scriptEnv is the run script's whole environment. nixpkgs' run-<name>-vm
// (qemu-vm.nix's startVM) reads NIX_DISK_IMAGE, TMPDIR and USE_TMPDIR, set
// here to the VM's directory; it also reads SHARED_DIR (a host directory
// shared read-write), QEMU_OPTS, QEMU_NET_OPTS (e.g. a forward on every
// address), QEMU_KERNEL_PARAMS, NIXPKGS_QEMU_KERNEL_<name> (another
// kernel), NIX_EFI_VARS, NIX_SWTPM_DIR and NIX_SSL_CERT_FILE, none of which
// an agent-vm VM may take from whoever runs start, so none is passed (the
// launcher sets QEMU_NET_OPTS and, under TCG, QEMU_KERNEL_PARAMS itself). PATH
// is the caller's: the script puts coreutils first and calls QEMU by its
// store path.
func scriptEnv(l state.Layout, path string) []string {
	return []string{
		"PATH=" + path,
		"NIX_DISK_IMAGE=" + filepath.Join(l.Dir, DiskImage),
		"TMPDIR=" + filepath.Join(l.RunDir(), "tmp"),
		"USE_TMPDIR=1",
	}
}

// inputsHash covers everything a build reads: vm.json (with the nixpkgs
// path), the expressions, the modules, the user's module and the agent-vm
// binary. Files the user's module imports are not covered (start --rebuild).
func inputsHash(dir string, r *state.Record) (string, error) {
	h := sha256.New()
	files := []string{filepath.Join(dir, VMJSONFile), filepath.Join(dir, DefaultNix), filepath.Join(dir, DataNix)}
	mods, _ := filepath.Glob(filepath.Join(dir, ModulesDir, "*.nix"))
	files = append(files, mods...)
	files = append(files, filepath.Join(dir, ModulesDir, modules.ProvisionFile))
	s, err := state.SectionOf[Settings](r)
	if err != nil {
		return "", err
	}
	if s.Config != "" {
		files = append(files, s.Config)
	}
	var v VMJSON
	if raw, err := os.ReadFile(filepath.Join(dir, VMJSONFile)); err == nil && json.Unmarshal(raw, &v) == nil && v.AgentVMExecutable != nil {
		files = append(files, *v.AgentVMExecutable)
	}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return "", fmt.Errorf("reading build input %s: %w", f, err)
		}
		fmt.Fprintf(h, "%s\x00", f)
		_, err = io.Copy(h, fh)
		fh.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// gcRooted says whether the out-links of the last build still point at
// its outputs (a VM built by an older agent-vm has none).
func gcRooted(dir string, out *buildOutputs) bool {
	roots := GCRoots(dir)
	for i, want := range []string{out.VM, out.Launcher} {
		if got, err := os.Readlink(roots[i]); err != nil || got != want {
			return false
		}
	}
	return true
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
