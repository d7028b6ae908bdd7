package hostpkgs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// Package managers agent-vm can install with.
const (
	Apt   = "apt-get" // Debian, Ubuntu
	Dnf   = "dnf"     // Fedora, RHEL and the like
	NixOS = "nixos"   // installs nothing: the flake brings everything
)

// Host looks at and changes this machine's packages.
type Host struct {
	Run execx.Runner
	// Root is the file system root to read /etc from ("" = "/"); tests
	// point it at a directory of their own.
	Root string
}

// Find returns where program p is, looking on PATH and then in p.Paths.
func (h Host) Find(p Program) (string, bool) {
	if path, err := h.Run.LookPath(p.Name); err == nil {
		return path, true
	}
	for _, path := range p.Paths {
		if fi, err := os.Stat(filepath.Join(h.root(), path)); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return path, true
		}
	}
	return "", false
}

// Missing returns the programs of progs that are not there.
func (h Host) Missing(progs []Program) []Program {
	var out []Program
	for _, p := range progs {
		if _, ok := h.Find(p); !ok {
			out = append(out, p)
		}
	}
	return out
}

func (h Host) root() string {
	if h.Root == "" {
		return "/"
	}
	return h.Root
}

// Manager names this host's package manager: NixOS, Apt, Dnf, or "" when
// agent-vm knows none of them here.
func (h Host) Manager() string {
	if _, err := os.Stat(filepath.Join(h.root(), "etc/NIXOS")); err == nil {
		return NixOS
	}
	for _, m := range []string{Apt, Dnf} {
		if _, err := h.Run.LookPath(m); err == nil {
			return m
		}
	}
	return ""
}

// Plan is what installing progs takes on this host.
type Plan struct {
	Manager  string
	Missing  []Program // what is not there
	Packages []string  // the packages that provide it, sorted
	// Unpackaged are missing programs no package of this manager provides
	// (Go, or nix on Fedora): the installer cannot help, Note says what can.
	Unpackaged []Program
}

// Empty reports whether nothing needs installing.
func (p Plan) Empty() bool { return len(p.Missing) == 0 }

// Commands are the commands that install the plan's packages, as root.
func (p Plan) Commands() []execx.Cmd {
	if len(p.Packages) == 0 {
		return nil
	}
	switch p.Manager {
	case Apt:
		return []execx.Cmd{
			{Path: Apt, Args: []string{"update", "-q"}, Env: aptEnv},
			{Path: Apt, Args: append([]string{"install", "-y", "-q", "--no-install-recommends"}, p.Packages...), Env: aptEnv},
		}
	case Dnf:
		return []execx.Cmd{{Path: Dnf, Args: append([]string{"install", "-y"}, p.Packages...)}}
	}
	return nil
}

// SudoLine is the plan's commands as one line a user can paste.
func (p Plan) SudoLine() string {
	var parts []string
	for _, c := range p.Commands() {
		parts = append(parts, "sudo "+c.String())
	}
	return strings.Join(parts, " && ")
}

var aptEnv = []string{"DEBIAN_FRONTEND=noninteractive"}

// ErrUnknownManager means agent-vm cannot install packages on this host.
var ErrUnknownManager = errors.New("no package manager agent-vm knows (apt-get, dnf) on this host")

// PlanFor works out what installing the programs need asks for takes.
// Where a program has several candidate packages, the first one the
// package index knows is taken (ask again after `apt-get update`).
func (h Host) PlanFor(ctx context.Context, need Need) (Plan, error) {
	p := Plan{Manager: h.Manager(), Missing: h.Missing(For(need))}
	if p.Empty() || p.Manager == NixOS {
		return p, nil
	}
	if p.Manager == "" {
		return p, ErrUnknownManager
	}
	for _, prog := range p.Missing {
		cands := prog.Debian
		if p.Manager == Dnf {
			cands = prog.Fedora
		}
		if len(cands) == 0 {
			p.Unpackaged = append(p.Unpackaged, prog)
			continue
		}
		pkg := h.pick(ctx, p.Manager, cands)
		if !slices.Contains(p.Packages, pkg) {
			p.Packages = append(p.Packages, pkg)
		}
	}
	slices.Sort(p.Packages)
	return p, nil
}

// pick returns the first candidate the package index knows, or the last
// one when it knows none (an empty index before the first update).
func (h Host) pick(ctx context.Context, manager string, cands []string) string {
	if len(cands) == 1 || manager != Apt {
		return cands[0]
	}
	for _, c := range cands {
		res, err := h.Run.Run(ctx, execx.Cmd{Path: "apt-cache", Args: []string{"show", "--no-all-versions", c}})
		if err == nil && len(res.Stdout) > 0 {
			return c
		}
	}
	return cands[len(cands)-1]
}

// Install runs the plan's commands, their output going to out. For apt, the
// package index is updated first and the plan made again against it, so a
// fresh machine's empty index picks the right candidates.
func (h Host) Install(ctx context.Context, need Need, out io.Writer) (Plan, error) {
	p, err := h.PlanFor(ctx, need)
	if err != nil || len(p.Packages) == 0 {
		return p, err
	}
	cmds := p.Commands()
	if p.Manager == Apt {
		if err := h.runShown(ctx, cmds[0], out); err != nil {
			return p, err
		}
		if p, err = h.PlanFor(ctx, need); err != nil || len(p.Packages) == 0 {
			return p, err
		}
		cmds = p.Commands()[1:]
	}
	for _, c := range cmds {
		if err := h.runShown(ctx, c, out); err != nil {
			return p, err
		}
	}
	var still []Program
	for _, prog := range h.Missing(p.Missing) {
		if !slices.ContainsFunc(p.Unpackaged, func(u Program) bool { return u.Name == prog.Name }) {
			still = append(still, prog)
		}
	}
	if len(still) > 0 {
		return p, fmt.Errorf("installed %s, but %s still cannot be found (hint: check the package manager's output above)",
			strings.Join(p.Packages, " "), Names(still))
	}
	return p, nil
}

func (h Host) runShown(ctx context.Context, c execx.Cmd, out io.Writer) error {
	fmt.Fprintf(out, "+ %s\n", c.String())
	c.Stdout, c.Stderr = out, out
	if _, err := h.Run.Run(ctx, c); err != nil {
		return fmt.Errorf("installing packages: %w", err)
	}
	return nil
}

// Names lists programs' names, comma separated, for messages.
func Names(progs []Program) string {
	var n []string
	for _, p := range progs {
		n = append(n, p.Name)
	}
	return strings.Join(n, ", ")
}
