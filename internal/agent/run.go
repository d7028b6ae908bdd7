package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/agentstate"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/mcpsync"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	tellwait "github.com/agent-vm/agent-vm/internal/notify"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// Run makes sure the branch has a running VM and attaches the terminal to
// its agent session, starting the session if it does not run yet. It
// returns when the user detaches or the agent ends.
func Run(ctx context.Context, vms VMs, p Provisioner, o RunOptions) (*Result, error) {
	notify := o.Notify
	if notify == nil {
		notify = func(string) {}
	}
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if o.Session != "" {
		if err := session.CheckName(o.Session); err != nil {
			return nil, fmt.Errorf("--session: %w", err)
		}
	}
	log := o.Log
	if log == nil {
		log = hclog.NewNullLogger()
	}
	began := time.Now()
	step := func(what string) { log.Debug("run: "+what, "after", time.Since(began)) }
	res := &Result{}
	e, err := vms.Find(ctx, o.Name)
	create := errors.Is(err, state.ErrNotFound) && e.Record == nil
	switch {
	case create:
	case err != nil:
		return nil, err
	case e.Record == nil:
		return nil, e.Err
	}
	// Everything the user typed is checked before a VM is made.
	agent := o.Agent
	if agent == "" && !create {
		agent = e.Record.Agent
	}
	// A VM made here may get its agent from the repository's
	// .agent-vm/config.toml: only then is "no agent" known.
	agentFromConfig := create && agent == ""
	var argv []string
	var vars []session.Var
	var keyEnvs []string
	check := func() error {
		var err error
		if argv, keyEnvs, err = agentCommand(agent, o.Args, o.Name); err != nil {
			return err
		}
		vars, err = sessionEnv(o.Env, getenv, notify)
		return err
	}
	if !agentFromConfig {
		if err := check(); err != nil {
			return nil, err
		}
		if err := checkChrome(o, argv); err != nil {
			return nil, err
		}
	} else if _, err := sessionEnv(o.Env, getenv, func(string) {}); err != nil {
		return nil, err
	}
	if create {
		install := ""
		if _, err := guest.LookupAgent(agent); err == nil {
			install = agent // install the CLI it is about to run
		}
		notify(fmt.Sprintf("no VM for branch %s yet: creating one", o.Name))
		r, err := p.Create(ctx, o.Name, install)
		if err != nil {
			return nil, err
		}
		res.Created = true
		o.Name = r.Slug
		if agentFromConfig {
			agent = r.Agent
			if err := check(); err != nil {
				return nil, fmt.Errorf("created VM %s for branch %s, but %w", r.Slug, r.Branch, err)
			}
			if err := checkChrome(o, argv); err != nil {
				return nil, fmt.Errorf("created VM %s for branch %s, but %w", r.Slug, r.Branch, err)
			}
		}
	}
	keys := map[string]string{}
	for _, k := range keyEnvs {
		if v := getenv(k); v != "" {
			keys[k] = v
		}
	}
	up, booted, err := p.Start(ctx, o.Name, keys)
	if err != nil {
		return nil, err
	}
	for _, k := range slices.Backward(keyEnvs) {
		vars = append(agentKey(up, k, getenv, notify), vars...)
	}
	res.Started = booted
	res.VM, res.Branch = up.Slug, up.Branch
	step("the VM is up")
	if o.OnWait != "" {
		e, err := vms.Find(ctx, res.VM)
		if err == nil {
			err = tellwait.SetOnWait(e.Layout.RunDir(), o.OnWait)
		}
		if err != nil {
			return nil, fmt.Errorf("--on-wait: %w", err)
		}
	}
	c, _, err := vms.Connect(ctx, res.VM)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	chrome := false
	if o.Chrome {
		if chrome, err = p.OpenBrowser(ctx, res.VM); err != nil {
			return nil, err
		}
	}
	name := o.Session
	if name == "" {
		name = session.NameFor(argv[0])
	}
	if o.New {
		infos, err := listSessions(ctx, c)
		if err != nil {
			return nil, err
		}
		if name, err = newName(infos, name, o.Session != "", res.VM); err != nil {
			return nil, err
		}
		step("the sessions listed")
	}
	vars = append(syncMCP(ctx, vms, res.VM, getenv, notify), vars...)
	step("the host's MCP servers synced")
	program := argv[0]
	if chrome {
		argv = append([]string{argv[0], "--chrome"}, argv[1:]...)
	}
	w, h := sshx.TermSize(o.Term.In)
	// The start looks for the program itself and refuses a name in use,
	// so the usual run (a new session, its program there) asks the guest
	// once; only what it refuses is looked at further.
	installed := false
	for tries := 0; ; tries++ {
		err := startSession(ctx, c, session.Spec{Name: name, Argv: argv, Hooks: hooks(filepath.Base(program)), Env: vars, Width: w, Height: h, Heading: res.Branch, Require: true})
		switch {
		case err == nil:
			step("the session started")
			notify(fmt.Sprintf("started session %s in VM %s: %s", name, res.VM, strings.Join(argv, " ")))
			return attach(ctx, c, res, name, o.Term, notify)
		case errors.Is(err, session.ErrNoProgram) && !installed:
			if err := installAgent(ctx, vms, c, res.VM, program, o.Term.Err, notify); err != nil {
				return nil, err
			}
			installed = true
			step("the agent's program installed")
		case errors.Is(err, session.ErrNoProgram):
			return nil, fmt.Errorf("installed %s in VM %s, but a login shell there does not find it (hint: `agent-vm shell %s`, then `command -v %s` and the PATH)", termsafe.String(program), res.VM, res.VM, termsafe.String(program))
		case errors.Is(err, session.ErrDuplicate) && tries < 3:
			infos, err := listSessions(ctx, c)
			if err != nil {
				return nil, err
			}
			existing, ok := session.Find(infos, name)
			switch {
			case !ok: // removed since: start it
			case o.New: // another run took the name a moment ago
				if name, err = newName(infos, name, o.Session != "", res.VM); err != nil {
					return nil, err
				}
			case existing.Exited:
				notify(fmt.Sprintf("session %s had ended (%s); starting it again", name, ended(existing)))
				if _, err := guestRun(ctx, c, session.Remove(name), nil); err != nil {
					return nil, err
				}
			default:
				if len(o.Env) > 0 || len(o.Args) > 0 || chrome {
					notify(fmt.Sprintf("session %s is already running: --env, --chrome and the agent's arguments apply only when a session starts (hint: --new starts another)", name))
				}
				return attach(ctx, c, res, name, o.Term, notify)
			}
		default:
			return nil, fmt.Errorf("starting session %s in VM %s: %w", name, res.VM, err)
		}
	}
}

// startSession starts s in the guest; its refusals are session's errors.
func startSession(ctx context.Context, c *ssh.Client, s session.Spec) error {
	cmd, stdin, err := session.Start(s)
	if err != nil {
		return err
	}
	var errOut bytes.Buffer
	code, err := sshx.Run(ctx, c, cmd, bytes.NewReader(stdin), io.Discard, &errOut)
	if err != nil {
		return err
	}
	return session.StartError(code, errOut.String())
}

// newName is the name a --new session takes: name when no session has it,
// else the next free one, or an error when the user gave that name.
func newName(infos []session.Info, name string, given bool, vmName string) (string, error) {
	if _, ok := session.Find(infos, name); !ok {
		return name, nil
	}
	if given {
		return "", fmt.Errorf("a session called %s exists in VM %s already (hint: pick another --session, or `agent-vm attach %s --session %s`)", name, vmName, vmName, name)
	}
	return freeName(infos, name), nil
}

// syncMCP brings the host's MCP servers into the guest before a session
// starts (as `mcp sync` does) and returns the variables their guest
// configuration refers to, for the session's environment. A failure is
// reported and the agent starts without them: the user's MCP set-up must
// not keep the agent from running.
func syncMCP(ctx context.Context, vms VMs, vmName string, getenv func(string) string, notify func(string)) []session.Var {
	res, err := mcpsync.Sync(ctx, vms, vmName, mcpsync.Options{Getenv: getenv})
	if err != nil {
		notify(fmt.Sprintf("the host's MCP servers were not brought into the VM: %v (the agent starts without them; `agent-vm mcp sync %s` tries again)", err, vmName))
		return nil
	}
	if len(res.Servers) > 0 {
		notify(fmt.Sprintf("synced %d MCP server(s) from the host's Claude Code configuration into the VM (`agent-vm mcp sync %s --dry-run` shows them)", len(res.Servers), vmName))
	}
	return res.Env
}

// installAgent installs a known agent's CLI from npm in a guest that
// lacks it (a VM created without --agent, or whose first-boot install
// failed): once per VM, with npm's output on errOut; a failure says what
// the VM's egress proxy refused meanwhile (netpolicy.WithRefusals). Any
// other program must be in the guest already.
func installAgent(ctx context.Context, vms VMs, c *ssh.Client, vmName, program string, errOut io.Writer, notify func(string)) error {
	var agent guest.Agent
	known := false
	for _, a := range guest.Agents {
		if a.Command == program {
			agent, known = a, true
		}
	}
	if !known {
		return fmt.Errorf("--agent %s: VM %s has no program %s, and it is not an agent agent-vm knows (hint: one of %s, which run installs; or install it in the VM first: `agent-vm shell %s`)",
			termsafe.String(program), vmName, termsafe.String(program), strings.Join(guest.AgentNames(), ", "), vmName)
	}
	if errOut == nil {
		errOut = io.Discard
	}
	install := guest.NPMInstall
	// At its pinned version, its program's package alone.
	specs, alone := agent.Specs("", runtime.GOARCH) // the guest's CPU is this machine's
	if alone {
		install = guest.NPMInstallPrograms
	}
	notify(fmt.Sprintf("installing %s in VM %s (npm %s; a few minutes without KVM; a template with it starts new VMs with it installed: `agent-vm template build %s`)", agent.Name, vmName, strings.Join(specs, " "), vmName))
	began := time.Now()
	code, err := sshx.Run(ctx, c, "sudo "+sshx.Quote(install(specs...)), nil, errOut, errOut)
	if err != nil {
		return fmt.Errorf("installing %s in VM %s: %w", agent.Name, vmName, err)
	}
	if code != 0 {
		err := fmt.Errorf("installing %s in VM %s: the install exited with status %d (see its output above; hint: the guest needs to reach registry.npmjs.org, and `agent-vm run %s --agent %s` tries again)",
			agent.Name, vmName, code, vmName, agent.Name)
		if e, ferr := vms.Find(ctx, vmName); ferr == nil && e.Record != nil {
			err = netpolicy.WithRefusals(ctx, vms, e, vmName, began, err)
		}
		return err
	}
	return nil
}

// agentCommand is the agent's argv and the variables it reads its
// credential from.
func agentCommand(name string, args []string, vmName string) ([]string, []string, error) {
	if name == "" {
		return nil, nil, fmt.Errorf("no agent to run: VM %s was not created with --agent (hint: `agent-vm run %s --agent %s`, or --agent PROGRAM for any program in the VM)", vmName, vmName, strings.Join(guest.AgentNames(), "|"))
	}
	if a, err := guest.LookupAgent(name); err == nil {
		return append([]string{a.Command}, args...), a.Keys, nil
	}
	if strings.TrimSpace(name) != name || strings.ContainsAny(name, " \t\n\x00") {
		return nil, nil, fmt.Errorf("--agent %q: give one program; its arguments go after -- (e.g. `agent-vm run --agent mytool -- --flag`)", termsafe.String(name))
	}
	return append([]string{name}, args...), nil, nil
}

// agentKey is how the agent's API key (the variable keyEnv) reaches it.
// A VM whose network is contained holds a placeholder for it in every
// session's environment when the store or this run's environment gave it
// at the VM's start, and its proxy the value; nothing is added here. A VM
// that is not contained can hold no placeholder: the value from this
// environment is passed to the session, with a warning.
func agentKey(up VM, keyEnv string, getenv func(string) string, notify func(string)) []session.Var {
	v := getenv(keyEnv)
	switch {
	case keyEnv == "":
	case up.Contained && slices.Contains(up.Secrets, keyEnv):
	case up.Contained && v != "":
		notify(fmt.Sprintf("%s is set here, but VM %s was started without it, so the agent does not get it (hint: `agent-vm secret set %s` keeps it on the host for every VM; then `agent-vm stop %s` and run again)", keyEnv, up.Slug, keyEnv, up.Slug))
	case up.Contained:
	case v != "":
		notify(fmt.Sprintf("VM %s's network is not contained (%s backend): the value of %s enters the VM, where the agent can read it", up.Slug, up.Backend, keyEnv))
		return []session.Var{{Name: keyEnv, Value: v}}
	}
	return nil
}

// sessionEnv turns --env values into the session's variables: NAME takes
// the value from this process's environment, NAME=VALUE the value given
// (with a warning: it is in the shell's history). A name that looks like
// a credential's gets a warning too: the host's secret store would keep
// it out of the VM. The agent's own key variable is agentKey's.
func sessionEnv(env []string, getenv func(string) string, notify func(string)) ([]session.Var, error) {
	var vars []session.Var
	seen := map[string]int{}
	add := func(v session.Var) {
		if i, ok := seen[v.Name]; ok {
			vars[i] = v
			return
		}
		seen[v.Name] = len(vars)
		vars = append(vars, v)
	}
	for _, s := range env {
		name, value, given := strings.Cut(s, "=")
		if err := session.CheckEnvName(name); err != nil {
			return nil, fmt.Errorf("--env %q: %w", termsafe.String(s), err)
		}
		if looksLikeCredential(name) {
			notify(fmt.Sprintf("--env %s: its value enters the VM, where the agent can read it; `agent-vm secret set %s` keeps it on the host and lets the egress proxy add it to requests instead", name, name))
		}
		if !given {
			v := getenv(name)
			if v == "" {
				return nil, fmt.Errorf("--env %s: %s is not set in this environment (hint: export it first, or give --env %s=VALUE)", name, name, name)
			}
			value = v
		} else {
			notify(fmt.Sprintf("--env %s=...: the value is in your shell's history; --env %s takes it from the environment instead", name, name))
		}
		add(session.Var{Name: name, Value: value})
	}
	return vars, nil
}

// looksLikeCredential reports whether an environment variable's name is
// a credential's: it ends in _KEY, _TOKEN, _SECRET or _PASSWORD, or holds
// API_KEY, in any case.
func looksLikeCredential(name string) bool {
	n := strings.ToUpper(name)
	for _, suffix := range []string{"_KEY", "_TOKEN", "_SECRET", "_PASSWORD"} {
		if strings.HasSuffix(n, suffix) {
			return true
		}
	}
	return strings.Contains(n, "API_KEY")
}

// freeName is base, or base-2, base-3 ... whichever no session has.
func freeName(infos []session.Info, base string) string {
	for i := 2; ; i++ {
		n := base + "-" + strconv.Itoa(i)
		if len(n) > 40 {
			n = base[:40-len(strconv.Itoa(i))-1] + "-" + strconv.Itoa(i)
		}
		if _, taken := session.Find(infos, n); !taken {
			return n
		}
	}
}

func ended(in session.Info) string {
	if in.Status < 0 {
		return "killed by a signal"
	}
	return "exit status " + strconv.Itoa(in.Status)
}

// hooks are the arguments that give the agent agent-vm's hooks, which
// report its state (internal/agentstate): Claude Code's and Codex's; other
// agents are judged by their output.
func hooks(program string) []string {
	switch program {
	case "claude":
		return agentstate.ClaudeArgs()
	case "codex":
		return agentstate.CodexArgs()
	}
	return nil
}

// checkChrome refuses --chrome for an agent other than Claude Code, whose
// flag it is.
func checkChrome(o RunOptions, argv []string) error {
	if !o.Chrome || argv[0] == "claude" {
		return nil
	}
	return fmt.Errorf("--chrome is Claude Code's (Claude in Chrome), and the agent is %s (hint: --agent claude, or `agent-vm browser %s --cdp` for any agent's DevTools MCP)", argv[0], o.Name)
}
