package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/image"
)

// SetupOptions say what `agent-vm setup` (and a start that finds something
// missing) may do.
type SetupOptions struct {
	// Need: the programs to install (hostpkgs.Run|Image, plus Test for the
	// test suite).
	Need hostpkgs.Need
	// ImageDir is the image cache; the base image is built there when
	// missing and Need has Image. "" skips the image.
	ImageDir string
	// Build builds the base image (image.Build with the CLI's options).
	Build func(ctx context.Context) (*image.Image, error)
	// Root: this process may install packages and build images.
	Root bool
	// Consent is asked once, with what setup would do, before it changes
	// anything. nil means no consent can be had (no terminal, no --yes).
	Consent func(actions []string) (bool, error)
	// Out receives the package manager's and the image build's output.
	Out io.Writer
	// RequiredOnly: do nothing when only optional programs are missing
	// (start: a host without virtiofsd still runs VMs, over 9p).
	RequiredOnly bool
}

// SetupReport says what setup did.
type SetupReport struct {
	Manager   string   `json:"manager"`
	Installed []string `json:"installed"` // packages
	Image     string   `json:"image"`     // the base image built now, "" when none was
	Changed   []string `json:"changed"`   // host settings changed (KVM access for libvirt)
	Notes     []string `json:"notes"`     // things setup could not do, with what to do
}

// ErrNoConsent means setup had something to do but no consent to do it.
var ErrNoConsent = errors.New("no consent")

// Setup installs the host packages agent-vm needs and builds the base
// image, asking once before it changes anything. It is idempotent: on a
// host that has everything it changes nothing.
func Setup(ctx context.Context, host hostpkgs.Host, o SetupOptions) (SetupReport, error) {
	plan, err := host.PlanFor(ctx, o.Need)
	r := SetupReport{Manager: plan.Manager}
	if errors.Is(err, hostpkgs.ErrUnknownManager) {
		return r, fmt.Errorf("this host lacks %s and %w (hint: install the packages that provide them with your package manager; their Debian names: %s)",
			hostpkgs.Names(plan.Missing), err, strings.Join(hostpkgs.DebianPackages(plan.Missing), " "))
	}
	if err != nil {
		return r, err
	}
	if o.RequiredOnly && !slices.ContainsFunc(plan.Missing, func(p hostpkgs.Program) bool { return !p.Optional }) {
		return r, nil
	}
	if plan.Manager == hostpkgs.NixOS {
		if !plan.Empty() {
			r.Notes = append(r.Notes, "on NixOS agent-vm installs nothing; this host lacks "+hostpkgs.Names(plan.Missing)+
				": run agent-vm from the flake (`nix run .#agent-vm -- ...`, which brings QEMU, virtiofsd, git and OpenSSH) or use `nix develop` for the tests")
		}
		return r, nil // the nixos backend builds its VMs with nix: no base image
	}
	buildImage := false
	if o.ImageDir != "" && o.Need&hostpkgs.Image != 0 {
		_, err := image.Lookup(o.ImageDir, image.DefaultBuildName)
		buildImage = errors.Is(err, image.ErrNotFound)
	}
	// libvirt's QEMU user needs /dev/kvm, or libvirt re-probes QEMU at
	// every call (see hostpkgs.KVMGroupAccessMissing).
	kvmAccess := false
	if o.Need&(hostpkgs.Vagrant|hostpkgs.Test) != 0 {
		if kvmAccess, err = host.KVMGroupAccessMissing(); err != nil {
			return r, err
		}
	}
	if kvmAccess && !o.Root {
		kvmAccess = false
		r.Notes = append(r.Notes, "as root, "+hostpkgs.KVMGroupAccessAction+": without it every vagrant start waits a minute on libvirt")
	}
	var actions []string
	if len(plan.Packages) > 0 {
		actions = append(actions, fmt.Sprintf("install %s with %s", strings.Join(plan.Packages, " "), plan.Manager))
	}
	if kvmAccess {
		actions = append(actions, hostpkgs.KVMGroupAccessAction)
	}
	if buildImage {
		actions = append(actions, "build the Debian base image into "+o.ImageDir+" (about 2 minutes)")
	}
	if len(actions) > 0 {
		if !o.Root {
			return r, notRoot(plan, buildImage)
		}
		ok := false
		if o.Consent != nil {
			if ok, err = o.Consent(actions); err != nil {
				return r, err
			}
		}
		if !ok {
			return r, fmt.Errorf("%w: setup would %s; nothing was changed (hint: run `agent-vm setup --yes`)", ErrNoConsent, strings.Join(actions, ", and "))
		}
	}
	if len(plan.Packages) > 0 {
		done, err := host.Install(ctx, o.Need, o.Out)
		r.Installed = done.Packages
		if err != nil {
			return r, err
		}
		plan = done
	}
	if kvmAccess {
		if err := host.GrantKVMGroupAccess(); err != nil {
			// Slow vagrant starts, not broken ones: a note, not a failure.
			r.Notes = append(r.Notes, err.Error())
		} else {
			r.Changed = append(r.Changed, "group "+hostpkgs.KVMGroup+" (libvirt's QEMU user) may now read and write "+hostpkgs.KVMDevice)
		}
	}
	for _, p := range plan.Unpackaged {
		r.Notes = append(r.Notes, fmt.Sprintf("%s is missing and %s has no package for it: %s", p.Name, plan.Manager, p.PackageHint()))
	}
	if buildImage {
		img, err := o.Build(ctx)
		if err != nil {
			return r, fmt.Errorf("building the base image: %w", err)
		}
		r.Image = img.Disk
	}
	if len(plan.Unpackaged) > 0 {
		return r, fmt.Errorf("this host still lacks %s (see the notes above)", hostpkgs.Names(plan.Unpackaged))
	}
	return r, nil
}

// notRoot is the error for a user who is not root: the exact commands.
func notRoot(plan hostpkgs.Plan, buildImage bool) error {
	var steps []string
	if len(plan.Packages) > 0 {
		steps = append(steps, plan.SudoLine())
	}
	if buildImage {
		steps = append(steps, "sudo agent-vm image build")
	}
	what := "the base image"
	if len(plan.Missing) > 0 {
		what = hostpkgs.Names(plan.Missing)
		if buildImage {
			what += " and the base image"
		}
	}
	return fmt.Errorf("this host lacks %s, and installing needs root (hint: run `%s`, or `sudo agent-vm setup`)", what, strings.Join(steps, " && "))
}

// SetupHost is `agent-vm setup`: the packages running VMs (and, with
// tests, the test suite; with a backend that needs more, such as vagrant,
// that backend) need and the base image, asking consent once.
func (m *Manager) SetupHost(ctx context.Context, tests bool, backendName string, consent func(actions []string) (bool, error)) (SetupReport, error) {
	need, err := m.setupNeed(tests, backendName)
	if err != nil {
		return SetupReport{}, err
	}
	return Setup(ctx, hostpkgs.Host{Run: m.Run}, SetupOptions{Need: need, ImageDir: m.ImageDir(),
		Build: func(ctx context.Context) (*image.Image, error) { return m.buildImage(ctx, ImageBuildOptions{}) },
		Root:  os.Geteuid() == 0, Consent: consent, Out: m.progress})
}

// PrepareHost is what start does before it boots: install what running VMs
// need when it is missing, with a one-line notice instead of a question
// (the user asked for a running VM).
func (m *Manager) PrepareHost(ctx context.Context) error { return m.setupFirst(ctx, hostpkgs.Run) }

func (m *Manager) setupFirst(ctx context.Context, need hostpkgs.Need) error {
	_, err := Setup(ctx, hostpkgs.Host{Run: m.Run}, SetupOptions{Need: need, Root: os.Geteuid() == 0, Out: m.progress, RequiredOnly: true,
		Consent: func(actions []string) (bool, error) {
			fmt.Fprintf(m.progress, "agent-vm: this host is not set up yet; doing what `agent-vm setup` does: %s\n", strings.Join(actions, "; "))
			return true, nil
		}})
	return err
}

// setupNeed is what setup installs: what running VMs need, the backend's
// own needs (a backend.HostNeeder's; "" and auto add none), and the
// tests'.
func (m *Manager) setupNeed(tests bool, name string) (hostpkgs.Need, error) {
	need := hostpkgs.Run | hostpkgs.Image
	if name != "" && name != BackendAuto {
		be, ok := m.Backends[name]
		if !ok {
			return 0, fmt.Errorf("--backend %q: must be auto, qemu, nixos or vagrant", name)
		}
		if h, ok := be.(backend.HostNeeder); ok {
			need |= h.HostNeeds()
		}
	}
	if tests {
		need |= hostpkgs.Test
	}
	return need, nil
}

// ProgramCheck is one host program `setup --check` looked for.
type ProgramCheck struct {
	Name string `json:"name"`
	Path string `json:"path"` // "" when missing
	Hint string `json:"hint"` // the package that has it
}

// CheckPrograms looks for every program agent-vm (and, with tests, the test
// suite) runs, changing nothing. The error names the missing ones.
func (m *Manager) CheckPrograms(tests bool, backendName string) ([]ProgramCheck, error) {
	need, err := m.setupNeed(tests, backendName)
	if err != nil {
		return nil, err
	}
	host := hostpkgs.Host{Run: m.Run}
	var out []ProgramCheck
	var missing []hostpkgs.Program
	for _, p := range hostpkgs.For(need) {
		path, ok := host.Find(p)
		if !ok {
			missing = append(missing, p)
		}
		out = append(out, ProgramCheck{Name: p.Name, Path: path, Hint: p.PackageHint()})
	}
	if len(missing) > 0 {
		flag := ""
		if tests {
			flag = " --tests"
		}
		if _, ok := m.Backends[backendName].(backend.HostNeeder); ok {
			flag += " --backend " + backendName
		}
		return out, fmt.Errorf("this host lacks %s (hint: run `agent-vm setup%s` as root)", hostpkgs.Names(missing), flag)
	}
	return out, nil
}
