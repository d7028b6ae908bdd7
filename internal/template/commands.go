package template

// The templates' commands: `template build|list|rm`, `setup --template`
// and doctor's line. They act on agent-vm's VMs through VMs (vm's
// Manager, which cli passes in) and on the templates' own VMs through the
// Builder it gives them: a template is a VM of the templates' state
// directory, booted and suspended as any VM is.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/atomicfile"
	"github.com/agent-vm/agent-vm/internal/backend"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/hostdir"
	"github.com/agent-vm/agent-vm/internal/image"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/portbook"
	"github.com/agent-vm/agent-vm/internal/state"
)

// VMs is what the templates' commands need of agent-vm's VMs; vm's
// Manager has it.
type VMs interface {
	Lister
	// Recorded finds the VM name means, whose record must be readable.
	Recorded(ctx context.Context, name string) (state.Entry, error)
	// DefaultMachine is the record of the default machine: the VM
	// `create` makes with no flags on this host, which no directory holds.
	DefaultMachine(ctx context.Context) (*state.Record, error)
	// TemplateKey is the key of r's VM (NewKey) and the backend that
	// makes its template, or why its VM starts from none.
	TemplateKey(ctx context.Context, r *state.Record) (Key, backend.Templater, error)
	// TemplateSite is the templates' state directory, made on first use,
	// with its VMs' starts as boot says.
	TemplateSite(boot Boot) (*Site, error)
}

// Lister is what listing the templates needs of agent-vm's VMs.
type Lister interface {
	// DisksInUse are the disks the VMs' disks are made on (their
	// backends' ImagesInUse), each with the number of VMs whose disks are.
	DisksInUse() map[string]int
	// TemplateCurrent is what a template built now would have.
	TemplateCurrent() Current
	// TemplateStale is what the backend of the template's VM (its record
	// r, in l) finds older in it than a build now would make
	// (backend.Templater's TemplateStale; "" for nothing).
	TemplateStale(ctx context.Context, l state.Layout, r *state.Record) string
}

// Site is the templates' state directory as a build or a removal drives
// it.
type Site struct {
	Root *state.Root // the templates' state directory
	VMs  *state.Root // the VMs' state directory (their ports are taken too)
	// Book is the book of host ports over Root (a template's VM holds two
	// while it is built).
	Book *portbook.Book
	// Builder drives the VMs of Root: vm's Manager over that directory.
	Builder Builder
}

// Boot is how a build boots the template's VM: its wait for SSH and
// agent-mcp bounded by Timeout (0: the accelerator's), its steps told to
// Report.
type Boot struct {
	Timeout time.Duration
	Report  backend.Reporter
}

// Templates are the templates' commands over agent-vm's VMs.
type Templates struct {
	VMs VMs
	// Dir is the templates' state directory (vm.Manager.TemplateDir); nil
	// turns templates off.
	Dir *hostdir.Dir
	Log hclog.Logger
	Now func() time.Time
}

// Build makes the template the VM of branch name fits, or, for name "",
// the default machine (what `create` and `run` make without size flags
// in a repository with no config), with the agent CLIs agentList names
// (guest.ParseAgentPins: "all", "none", or NAME[@VERSION],...): a cold
// boot of a template seed, then a suspend (build). Once it is made, an
// older template of the same machine is retired (its disk stays while
// VMs' disks are made on it), so a rebuild replaces a template without
// breaking the VMs started from it.
func (t Templates) Build(ctx context.Context, name, agentList string, boot Boot) (*BuildResult, error) {
	agents, err := guest.ParseAgentPins(agentList)
	if err != nil {
		return nil, err
	}
	var r *state.Record
	branch := "BRANCH" // the default machine is no VM's: the fixes name none
	if name == "" {
		if r, err = t.VMs.DefaultMachine(ctx); err != nil {
			return nil, err
		}
	} else {
		e, err := t.VMs.Recorded(ctx, name)
		if err != nil {
			return nil, err
		}
		r, branch = e.Record, e.Record.Slug
	}
	k, be, err := t.VMs.TemplateKey(ctx, r)
	if err != nil {
		return nil, err
	}
	site, err := t.VMs.TemplateSite(boot)
	if err != nil {
		return nil, err
	}
	now := t.Now
	if now == nil {
		now = time.Now
	}
	n := New{Site: *site, From: r, Branch: branch, Now: now, Agents: agents, Used: t.disksInUse,
		Section: func() (any, error) { return be.TemplateSection(r) }}
	return build(ctx, n, k, t.Log)
}

// List lists the templates, each with what makes it older than one built
// now would be (Info.Stale).
func (t Templates) List(ctx context.Context) ([]Info, error) {
	if t.Dir == nil {
		return nil, nil
	}
	ts, err := list(t.Dir.Path, t.disksInUse())
	if err != nil || len(ts) == 0 {
		return ts, err
	}
	now := t.VMs.TemplateCurrent()
	for i, tm := range ts {
		if !tm.Ready {
			continue
		}
		var backendSays string
		if tr, err := state.ReadRecord(state.Layout{Dir: tm.Dir}.Record()); err == nil {
			backendSays = t.VMs.TemplateStale(ctx, state.Layout{Dir: tm.Dir}, tr)
		}
		ts[i].Stale = now.Stale(tm, backendSays)
	}
	return ts, nil
}

// Remove removes a template (by its slug, or "all"; see remove). Its
// disk is kept while some VM's disk is made on it.
func (t Templates) Remove(ctx context.Context, slug string) error {
	all, err := t.List(ctx)
	if err != nil {
		return err
	}
	picked := pick(all, slug)
	if len(picked) == 0 {
		return fmt.Errorf("no template %q in %s (hint: `agent-vm template list` lists them)", slug, t.Dir.Path)
	}
	site, err := t.VMs.TemplateSite(Boot{})
	if err != nil {
		return err
	}
	return remove(ctx, site.Root, picked, slug == "all", t.disksInUse(), site.Builder.Stop)
}

// disksInUse are the disks VMs' disks are made on (the VMs' DisksInUse),
// with a template's disk counting too the users its directory records
// (image.MarkUser, written by the backend as it makes a VM's disk on
// it): VMs of other state directories that share these templates
// (another --state-dir, integration-test's, bench's) must not lose it to
// a build or a removal here. Each count may miss some (VMs made before
// the records were kept, until they start again; VMs elsewhere), so a
// disk has the larger of the two.
func (t Templates) disksInUse() map[string]int {
	used := t.VMs.DisksInUse()
	if t.Dir == nil {
		return used
	}
	dirs, _ := filepath.Glob(filepath.Join(t.Dir.Path, "t-*"))
	for _, dir := range dirs {
		n := image.LiveUsers(dir)
		if n == 0 {
			continue
		}
		disks, _ := filepath.Glob(filepath.Join(dir, "*.qcow2")) // a template's disk is a qcow2 overlay
		for _, d := range disks {
			used[d] = max(used[d], n)
		}
	}
	return used
}

// Check is doctor's line about the templates (check).
func (t Templates) Check(ctx context.Context) backend.Check {
	ts, err := t.List(ctx)
	dir := ""
	if t.Dir != nil {
		dir = t.Dir.Path
	}
	return check(dir, ts, err)
}

// Current is the default machine's template when one holds the agent
// CLIs agentList names at the versions asked for and is not older than a
// build now would be: its slug, or "" (setup --template then builds).
func (t Templates) Current(ctx context.Context, agentList string) string {
	agents, err := guest.ParseAgentPins(agentList)
	if err != nil || t.Dir == nil {
		return ""
	}
	r, err := t.VMs.DefaultMachine(ctx)
	if err != nil {
		return ""
	}
	k, _, err := t.VMs.TemplateKey(ctx, r)
	if err != nil {
		return ""
	}
	ts, err := t.List(ctx)
	if err != nil {
		return ""
	}
	return CurrentOf(ts, k.Prefix(), agents)
}

// probeAgents checks, in the running guest of the template's VM e, that
// the agent CLIs pins are installed and run, and returns the version of
// each (AgentProbe); with Claude Code, it installs chrome-devtools-mcp
// too (devToolsMCP). A failure comes with the proxy's refusals, whose
// fixes name branch.
func probeAgents(ctx context.Context, b Builder, e state.Entry, pins []guest.AgentPin, branch string, log hclog.Logger) (map[string]string, error) {
	if len(pins) == 0 {
		return nil, nil
	}
	code, out, stderr, err := b.Root(ctx, e, AgentProbe(pins))
	if err == nil && code != 0 {
		// The first boot installed them: all the template VM's log is
		// since.
		err = netpolicy.WithRefusals(ctx, b, e, branch, time.Time{}, errors.New(strings.TrimSpace(stderr)))
	}
	if err != nil {
		return nil, err
	}
	versions, err := ParseAgentProbe(out, pins)
	if err == nil && slices.ContainsFunc(pins, func(p guest.AgentPin) bool { return p.Name == "claude" }) {
		devToolsMCP(ctx, b, e, branch, log)
	}
	return versions, err
}

// devToolsMCP installs chrome-devtools-mcp in a template with Claude Code,
// so its clones' `browser --cdp` finds it (the install script does nothing
// where the pinned versions are there). A failure costs the template
// nothing else: a clone installs it at its first --cdp, and the warning
// says so.
func devToolsMCP(ctx context.Context, b Builder, e state.Entry, branch string, log hclog.Logger) {
	d, err := guest.NewDevToolsMCP(guest.DevToolsMCPPrefix, runtime.GOARCH) // the guest's architecture is the host's
	if err == nil {
		var code int
		var stderr string
		began := time.Now()
		code, _, stderr, err = b.Root(ctx, e, d.Install())
		if err == nil && code != 0 {
			err = netpolicy.WithRefusals(ctx, b, e, branch, began, fmt.Errorf("exit status %d: %s", code, strings.TrimSpace(stderr)))
		}
	}
	if err != nil {
		log.Warn("the template has no chrome-devtools-mcp; a VM from it installs it at its first `agent-vm browser --cdp`", "error", err)
	}
}

// probeBootID asks the running guest of the template's VM e where its
// kernel keeps its boot id.
func probeBootID(ctx context.Context, b Builder, e state.Entry) (*BootIDSite, error) {
	code, out, stderr, err := b.Root(ctx, e, BootIDProbe)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(stderr))
	}
	if err != nil {
		return nil, fmt.Errorf("asking the guest where its kernel keeps its boot id: %w", err)
	}
	return ParseBootIDProbe(out)
}

// hintFile marks, in the templates' directory, that Hint has been given.
const hintFile = ".template-hint-given"

// Hint is the advice to build a template, for a start that booted a new
// VM cold for want of one (noneYet: vm.StartResult.NoTemplateYet), its SSH
// up after sshReady, once per host: "" after the first time.
func (t Templates) Hint(noneYet bool, sshReady time.Duration) string {
	if !noneYet || t.Dir == nil {
		return ""
	}
	if _, err := state.Open(t.Dir); err != nil { // made on first use
		return ""
	}
	mark := filepath.Join(t.Dir.Path, hintFile)
	if _, err := os.Stat(mark); err == nil {
		return ""
	}
	if err := atomicfile.Write(mark, nil, 0o600); err != nil {
		return ""
	}
	return fmt.Sprintf("this new VM booted cold: SSH after %s, and its agent CLI, if any, comes from npm (minutes without KVM). "+
		"A new VM started from a template is up in seconds with the agent CLIs installed: `agent-vm template build` makes one "+
		"for the default machine once (a cold boot and the installs), and every later branch starts from it (this is said once)", sshReady.Round(time.Second))
}
