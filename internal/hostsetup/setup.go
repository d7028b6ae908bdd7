// Package hostsetup is this host's readiness for VMs: `agent-vm setup`
// pins the package sources this host resolves to addresses the egress
// proxies refuse (Pin, internal/pins), installs what is missing (the host
// programs of internal/hostpkgs, asking once before it installs or builds
// anything, the Debian base image and, as root, agent-vm's account), start does the same with a notice
// instead of a question (First), `setup --check` lists the programs
// (CheckPrograms), and `doctor` reports what runs here, which backends can
// run VMs and whether the package sources are reachable (Doctor). It knows
// no VM: the caller hands it the drivers and backends to ask, the host to
// set up and the pins file.
package hostsetup

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/agent-vm/agent-vm/internal/hostpkgs"
	"github.com/agent-vm/agent-vm/internal/image"
)

// Options say what `agent-vm setup` (and a start that finds something
// missing) may do.
type Options struct {
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

// Report says what setup did.
type Report struct {
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
func Setup(ctx context.Context, host hostpkgs.Host, o Options) (Report, error) {
	plan, err := host.PlanFor(ctx, o.Need)
	r := Report{Manager: plan.Manager}
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
	if o.Need&(hostpkgs.Vagrant|hostpkgs.Libvirt|hostpkgs.Test) != 0 {
		if kvmAccess, err = host.KVMGroupAccessMissing(); err != nil {
			return r, err
		}
	}
	if kvmAccess && !o.Root {
		kvmAccess = false
		r.Notes = append(r.Notes, "as root, "+hostpkgs.KVMGroupAccessAction+": without it every vagrant start waits a minute on libvirt")
	}
	// As root, VMs run as agent-vm's own account (hostpkgs.Account); a
	// user's VMs run as that user and need none.
	account := false
	if o.Root {
		_, _, ok, err := host.AccountIDs()
		if err != nil {
			return r, err
		}
		account = !ok
	}
	var actions []string
	if len(plan.Packages) > 0 {
		actions = append(actions, fmt.Sprintf("install %s with %s", strings.Join(plan.Packages, " "), plan.Manager))
	}
	if kvmAccess {
		actions = append(actions, hostpkgs.KVMGroupAccessAction)
	}
	if account {
		actions = append(actions, hostpkgs.AccountAction)
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
			return r, fmt.Errorf("%w: setup would %s; nothing was installed or built (hint: run `agent-vm setup --yes`)", ErrNoConsent, strings.Join(actions, ", and "))
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
	if account {
		uid, _, err := host.CreateAccount(ctx)
		if err != nil {
			return r, err
		}
		r.Changed = append(r.Changed, fmt.Sprintf("account %s (uid %d): the VMs root starts run as it", hostpkgs.Account, uid))
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

// First is what start does before it boots: install what need (running
// VMs: hostpkgs.Run) lacks on this host, with a one-line notice on out
// instead of a question (the user asked for a running VM), and nothing
// when only optional programs are missing. root: this process may install.
func First(ctx context.Context, host hostpkgs.Host, need hostpkgs.Need, root bool, out io.Writer) error {
	_, err := Setup(ctx, host, Options{Need: need, Root: root, Out: out, RequiredOnly: true,
		Consent: func(actions []string) (bool, error) {
			fmt.Fprintf(out, "agent-vm: this host is not set up yet; doing what `agent-vm setup` does: %s\n", strings.Join(actions, "; "))
			return true, nil
		}})
	return err
}
