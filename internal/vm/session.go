package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/mcpsync"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/termsafe"
)

// SessionInfo is one agent session in a VM (see internal/session).
type SessionInfo = session.Info

// Terminal is the user's terminal for an attached session.
type Terminal struct {
	In       *os.File
	Out, Err io.Writer
}

// RunOptions are run's inputs.
type RunOptions struct {
	// Name is the branch (or VM name); a branch without a VM gets one,
	// made with Create (its Branch is Name).
	Name   string
	Create CreateOptions
	Start  StartOptions
	// Agent is what runs: a known agent (guest.Agents) or any program in
	// the guest; "" is the agent the VM was created with.
	Agent string
	Args  []string
	// Env are the --env values: NAME (its value from this process's
	// environment) or NAME=VALUE.
	Env []string
	// Session names the session (default: after the agent); New starts
	// another session even when one runs.
	Session string
	New     bool
	Term    Terminal
	// Notify tells the user what run is doing (one line each).
	Notify func(string)
}

// SessionResult is how an attached session ended for the user.
type SessionResult struct {
	VM, Branch, Session string
	// Created: the VM was made by this run; Started: booted by it.
	Created, Started bool
	// Exited: the agent ended (Status is its exit status); otherwise the
	// user detached and the agent runs on.
	Exited bool
	Status int
}

// RunAgent makes sure the branch has a running VM and attaches the terminal to
// its agent session, starting the session if it does not run yet. It
// returns when the user detaches or the agent ends.
func (m *Manager) RunAgent(ctx context.Context, o RunOptions) (*SessionResult, error) {
	notify := o.Notify
	if notify == nil {
		notify = func(string) {}
	}
	if o.Session != "" {
		if err := session.CheckName(o.Session); err != nil {
			return nil, fmt.Errorf("--session: %w", err)
		}
	}
	res := &SessionResult{}
	e, err := m.Find(ctx, o.Name)
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
	switch {
	case agent != "":
	case create:
		agent = o.Create.Agent
	default:
		agent = e.Record.Agent
	}
	// A VM made here may get its agent from the repository's
	// .agent-vm/config.toml: only then is "no agent" known.
	agentFromConfig := create && agent == ""
	var argv []string
	var vars []session.Var
	check := func() error {
		var keyEnv string
		var err error
		if argv, keyEnv, err = agentCommand(agent, o.Args, o.Name); err != nil {
			return err
		}
		vars, err = sessionEnv(o.Env, keyEnv, m.getenv, notify)
		return err
	}
	if !agentFromConfig {
		if err := check(); err != nil {
			return nil, err
		}
	} else if _, err := sessionEnv(o.Env, "", m.getenv, func(string) {}); err != nil {
		return nil, err
	}
	if create {
		if _, err := guest.LookupAgent(agent); err == nil && o.Create.Agent == "" {
			o.Create.Agent = agent // install the CLI it is about to run
		}
		o.Create.Branch = o.Name
		notify(fmt.Sprintf("no VM for branch %s yet: creating one", o.Name))
		r, err := m.Create(ctx, o.Create)
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
		}
	}
	sr, err := m.Start(ctx, o.Name, o.Start)
	if err != nil {
		return nil, err
	}
	res.Started = !sr.AlreadyRunning
	res.VM, res.Branch = sr.Info.Slug, sr.Info.Branch
	c, _, err := m.connect(ctx, res.VM)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	infos, err := listSessions(ctx, c)
	if err != nil {
		return nil, err
	}
	name := o.Session
	if name == "" {
		name = session.NameFor(argv[0])
	}
	if existing, ok := session.Find(infos, name); ok {
		switch {
		case o.New && o.Session == "":
			name = freeName(infos, name)
		case o.New:
			return nil, fmt.Errorf("a session called %s exists in VM %s already (hint: pick another --session, or `agent-vm attach %s %s`)", name, res.VM, res.VM, name)
		case existing.Exited:
			notify(fmt.Sprintf("session %s had ended (%s); starting it again", name, ended(existing)))
			if _, err := guestRun(ctx, c, session.Remove(name), nil); err != nil {
				return nil, err
			}
		default:
			if len(o.Env) > 0 || len(o.Args) > 0 {
				notify(fmt.Sprintf("session %s is already running: --env and the agent's arguments apply only when a session starts (hint: --new starts another)", name))
			}
			return m.attach(ctx, c, res, name, o.Term, notify)
		}
	}
	if err := m.ensureAgent(ctx, c, res.VM, argv[0], o.Term.Err, notify); err != nil {
		return nil, err
	}
	vars = append(m.syncMCP(ctx, res.VM, notify), vars...)
	w, h := sshx.TermSize(o.Term.In)
	cmd, stdin, err := session.Start(session.Spec{Name: name, Argv: argv, Env: vars, Width: w, Height: h, Heading: res.Branch})
	if err != nil {
		return nil, err
	}
	var errOut bytes.Buffer
	code, err := sshx.Run(ctx, c, cmd, bytes.NewReader(stdin), io.Discard, &errOut)
	if err != nil {
		return nil, fmt.Errorf("starting session %s in VM %s: %w", name, res.VM, err)
	}
	if err := session.StartError(code, errOut.String()); err != nil {
		if errors.Is(err, session.ErrDuplicate) {
			// Another run started it a moment ago: join it.
			return m.attach(ctx, c, res, name, o.Term, notify)
		}
		return nil, fmt.Errorf("starting session %s in VM %s: %w", name, res.VM, err)
	}
	notify(fmt.Sprintf("started session %s in VM %s: %s", name, res.VM, strings.Join(argv, " ")))
	return m.attach(ctx, c, res, name, o.Term, notify)
}

// syncMCP brings the host's MCP servers into the guest before a session
// starts (as `mcp sync` does) and returns the variables their guest
// configuration refers to, for the session's environment. A failure is
// reported and the agent starts without them: the user's MCP set-up must
// not keep the agent from running.
func (m *Manager) syncMCP(ctx context.Context, vmName string, notify func(string)) []session.Var {
	res, err := mcpsync.Sync(ctx, m, vmName, mcpsync.Options{Getenv: m.getenv})
	if err != nil {
		notify(fmt.Sprintf("the host's MCP servers were not brought into the VM: %v (the agent starts without them; `agent-vm mcp sync %s` tries again)", err, vmName))
		return nil
	}
	if len(res.Servers) > 0 {
		notify(fmt.Sprintf("synced %d MCP server(s) from the host's Claude Code configuration into the VM (`agent-vm mcp sync %s --dry-run` shows them)", len(res.Servers), vmName))
	}
	return res.Env
}

// ensureAgent installs a known agent's CLI from npm when the guest lacks
// it (a VM created without --agent, or whose first-boot install failed):
// once per VM, with npm's output on errOut.
func (m *Manager) ensureAgent(ctx context.Context, c *ssh.Client, vmName, program string, errOut io.Writer, notify func(string)) error {
	var agent guest.Agent
	known := false
	for _, a := range guest.Agents {
		if a.Command == program {
			agent, known = a, true
		}
	}
	if !known {
		return nil
	}
	if _, err := guestRun(ctx, c, `bash -lc 'command -v "$0"' `+sshx.Quote([]string{program}), nil); err == nil {
		return nil
	}
	notify(fmt.Sprintf("installing %s in VM %s (npm %s; a few minutes without KVM)", agent.Name, vmName, agent.Package))
	if errOut == nil {
		errOut = io.Discard
	}
	code, err := sshx.Run(ctx, c, "sudo "+sshx.Quote(guest.NPMInstall(agent.Package)), nil, errOut, errOut)
	if err != nil {
		return fmt.Errorf("installing %s in VM %s: %w", agent.Name, vmName, err)
	}
	if code != 0 {
		return fmt.Errorf("installing %s in VM %s: npm exited with status %d (see its output above; hint: the guest needs to reach registry.npmjs.org, and `agent-vm exec %s -- sudo %s` tries again)",
			agent.Name, vmName, code, vmName, strings.Join(guest.NPMInstall(agent.Package), " "))
	}
	return nil
}

// agentCommand is the agent's argv and the API key variable it reads.
func agentCommand(name string, args []string, vmName string) ([]string, string, error) {
	if name == "" {
		var names []string
		for _, a := range guest.Agents {
			names = append(names, a.Name)
		}
		return nil, "", fmt.Errorf("no agent to run: VM %s was not created with --agent (hint: `agent-vm run %s --agent %s`, or --agent PROGRAM for any program in the VM)", vmName, vmName, strings.Join(names, "|"))
	}
	if a, err := guest.LookupAgent(name); err == nil {
		return append([]string{a.Command}, args...), a.KeyEnv, nil
	}
	if strings.TrimSpace(name) != name || strings.ContainsAny(name, " \t\n\x00") {
		return nil, "", fmt.Errorf("--agent %q: give one program; its arguments go after -- (e.g. `agent-vm run --agent mytool -- --flag`)", termsafe.String(name))
	}
	return append([]string{name}, args...), "", nil
}

// sessionEnv turns --env values into the session's variables: NAME takes
// the value from this process's environment, NAME=VALUE the value given
// (with a warning: it is in the shell's history). The agent's own key
// variable is passed when it is set here.
func sessionEnv(env []string, keyEnv string, getenv func(string) string, notify func(string)) ([]session.Var, error) {
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
	if keyEnv != "" {
		if v := getenv(keyEnv); v != "" {
			add(session.Var{Name: keyEnv, Value: v})
		}
	}
	for _, s := range env {
		name, value, given := strings.Cut(s, "=")
		if err := session.CheckEnvName(name); err != nil {
			return nil, fmt.Errorf("--env %q: %w", termsafe.String(s), err)
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

// freeName is base, or base-2, base-3 ... whichever no session has.
func freeName(infos []SessionInfo, base string) string {
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

func ended(in SessionInfo) string {
	if in.Status < 0 {
		return "killed by a signal"
	}
	return "exit status " + strconv.Itoa(in.Status)
}

// AttachOptions are attach's inputs.
type AttachOptions struct {
	Name    string // the branch or VM
	Session string // "" = the only session
	Term    Terminal
	Notify  func(string)
}

// Attach attaches the terminal to a session of a running VM. A session
// whose agent has ended is not attached: its scrollback is written to the
// terminal and its status returned.
func (m *Manager) Attach(ctx context.Context, o AttachOptions) (*SessionResult, error) {
	notify := o.Notify
	if notify == nil {
		notify = func(string) {}
	}
	c, slug, err := m.connect(ctx, o.Name)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	res := &SessionResult{VM: slug, Branch: o.Name}
	if e, err := m.Find(ctx, slug); err == nil && e.Record != nil {
		res.Branch = e.Record.Branch
	}
	infos, err := listSessions(ctx, c)
	if err != nil {
		return nil, err
	}
	in, err := pickSession(infos, o.Session, slug)
	if err != nil {
		return nil, err
	}
	if in.Exited {
		res.Session, res.Exited, res.Status = in.Name, true, in.Status
		if err := writeScrollback(ctx, c, in.Name, o.Term.Out); err != nil {
			return nil, err
		}
		notify(fmt.Sprintf("session %s has ended (%s); `agent-vm sessions rm %s %s` removes it", in.Name, ended(in), slug, in.Name))
		return res, nil
	}
	return m.attach(ctx, c, res, in.Name, o.Term, notify)
}

// pickSession finds the session the user means.
func pickSession(infos []SessionInfo, name, vmName string) (SessionInfo, error) {
	if name != "" {
		if in, ok := session.Find(infos, name); ok {
			return in, nil
		}
		return SessionInfo{}, fmt.Errorf("VM %s has no session %s%s", vmName, name, sessionHint(infos, vmName))
	}
	switch len(infos) {
	case 1:
		return infos[0], nil
	case 0:
		return SessionInfo{}, fmt.Errorf("VM %s has no agent sessions (hint: `agent-vm run %s` starts one)", vmName, vmName)
	}
	return SessionInfo{}, fmt.Errorf("VM %s has %d sessions; name one%s", vmName, len(infos), sessionHint(infos, vmName))
}

func sessionHint(infos []SessionInfo, vmName string) string {
	if len(infos) == 0 {
		return fmt.Sprintf(" (hint: it has none; `agent-vm run %s` starts one)", vmName)
	}
	var names []string
	for _, in := range infos {
		names = append(names, in.Name)
	}
	return fmt.Sprintf(" (hint: its sessions are %s: `agent-vm attach %s %s`)", strings.Join(names, ", "), vmName, names[0])
}

// attach runs the tmux client on a PTY until the user detaches or the
// agent ends (the wrapper then detaches every client), then reads how the
// session stands.
func (m *Manager) attach(ctx context.Context, c *ssh.Client, res *SessionResult, name string, t Terminal, notify func(string)) (*SessionResult, error) {
	res.Session = name
	notify(fmt.Sprintf("attaching to session %s of VM %s (detach: %s; the agent runs on)", name, res.VM, session.DetachKeys))
	in := t.In
	if in == nil {
		in = os.Stdin
	}
	if _, err := sshx.Attach(ctx, c, session.Attach(name), in, t.Out, t.Err); err != nil {
		return nil, fmt.Errorf("attaching to session %s of VM %s: %w", name, res.VM, err)
	}
	// The wrapper records the status just before it detaches the clients;
	// give a session that is on its way out a moment to say so.
	var info SessionInfo
	for attempt := 0; ; attempt++ {
		infos, err := listSessions(ctx, c)
		if err != nil {
			return nil, err
		}
		found := false
		info, found = session.Find(infos, name)
		if !found {
			notify(fmt.Sprintf("session %s is gone (it was removed)", name))
			return res, nil
		}
		if info.Exited || attempt == 5 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if info.Exited {
		res.Exited, res.Status = true, info.Status
		notify(fmt.Sprintf("the agent in session %s ended (%s); `agent-vm logs %s --session %s` shows its output", name, ended(info), res.VM, name))
		return res, nil
	}
	notify(fmt.Sprintf("detached from session %s; the agent runs on (`agent-vm attach %s %s` re-attaches)", name, res.VM, name))
	return res, nil
}

// Sessions lists the agent sessions of a running VM.
func (m *Manager) Sessions(ctx context.Context, name string) ([]SessionInfo, error) {
	c, _, err := m.connect(ctx, name)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return listSessions(ctx, c)
}

// RemoveSession ends a session. One whose agent still runs is removed only
// with force (the agent gets SIGHUP).
func (m *Manager) RemoveSession(ctx context.Context, name, sess string, force bool) error {
	c, slug, in, err := m.findSession(ctx, name, sess)
	if err != nil {
		return err
	}
	defer c.Close()
	if !in.Exited && !force {
		return fmt.Errorf("the agent in session %s of VM %s is still running (hint: attach and end it, `agent-vm attach %s %s`, or remove it anyway with --force)", sess, slug, slug, sess)
	}
	_, err = guestRun(ctx, c, session.Remove(sess), nil)
	return err
}

// SessionLog writes a session's scrollback (escaped: it is the agent's
// output) to out.
func (m *Manager) SessionLog(ctx context.Context, name, sess string, out io.Writer) error {
	c, _, _, err := m.findSession(ctx, name, sess)
	if err != nil {
		return err
	}
	defer c.Close()
	return writeScrollback(ctx, c, sess, out)
}

// findSession connects to a running VM and finds one of its sessions; the
// caller closes the connection.
func (m *Manager) findSession(ctx context.Context, name, sess string) (*ssh.Client, string, SessionInfo, error) {
	c, slug, err := m.connect(ctx, name)
	if err != nil {
		return nil, "", SessionInfo{}, err
	}
	infos, err := listSessions(ctx, c)
	if err != nil {
		c.Close()
		return nil, "", SessionInfo{}, err
	}
	in, ok := session.Find(infos, sess)
	if !ok {
		c.Close()
		return nil, "", SessionInfo{}, fmt.Errorf("VM %s has no session %s%s", slug, sess, sessionHint(infos, slug))
	}
	return c, slug, in, nil
}

func writeScrollback(ctx context.Context, c *ssh.Client, sess string, out io.Writer) error {
	text, err := guestRun(ctx, c, session.Scrollback(sess), nil)
	if err != nil {
		return err
	}
	text = strings.TrimRight(text, "\n ")
	for _, line := range strings.Split(text, "\n") {
		if _, err := fmt.Fprintln(out, termsafe.Line(line)); err != nil {
			return err
		}
	}
	return nil
}

func listSessions(ctx context.Context, c *ssh.Client) ([]SessionInfo, error) {
	out, err := guestRun(ctx, c, session.List(), nil)
	if err != nil {
		return nil, err
	}
	return session.Parse(out)
}

// guestRun runs a command line in the guest and returns its stdout; a
// non-zero exit is an error with its stderr.
func guestRun(ctx context.Context, c *ssh.Client, cmd string, stdin []byte) (string, error) {
	var out, errOut bytes.Buffer
	var in io.Reader
	if stdin != nil {
		in = bytes.NewReader(stdin)
	}
	code, err := sshx.Run(ctx, c, cmd, in, &out, &errOut)
	if err != nil {
		return "", err
	}
	if code != 0 {
		return "", fmt.Errorf("in the guest: exit status %d: %s", code, termsafe.String(strings.TrimSpace(errOut.String())))
	}
	return out.String(), nil
}
