// Package agent runs coding agents in VMs: `agent-vm run` (the branch's
// VM made and booted when it has none, the agent's CLI installed when the
// guest lacks it, the host's MCP servers brought in, a session started),
// `attach`, `sessions` and `logs --session`. What to ask the guest (tmux
// command lines, the environment hand-off, the parsing of tmux's answers)
// is internal/session's; this package carries it over SSH to a running
// VM, which it reaches through VMs, the small interface of vm's Manager it
// needs; a run makes and boots its VM through a Provisioner (cli wires
// both in).
package agent

import (
	"context"
	"io"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/agent-vm/agent-vm/internal/mcpsync"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
)

// VMs is what agent sessions need of agent-vm's VMs (Find, Connect), what
// the MCP sync before a session needs (mcpsync.VMs) and, when the agent's
// install fails, the VM's connection log (netpolicy.LogPuller); vm's
// Manager has it.
type VMs interface {
	mcpsync.VMs
	netpolicy.LogPuller
}

// Terminal is the user's terminal for an attached session.
type Terminal struct {
	In       *os.File
	Out, Err io.Writer
}

// VM is a run's VM as Create and Start report it.
type VM struct {
	Slug, Branch string
	// Agent is the agent CLI the VM was created with ("" for none; the
	// repository's config.toml may name one).
	Agent string
	// Backend runs the VM; Contained says whether its network is (the
	// egress proxy), and Secrets names the secrets whose placeholders its
	// guest holds (Start's VM only).
	Backend   string
	Contained bool
	Secrets   []string
}

// Provisioner is what run needs done to a VM besides VMs: the branch's
// VM made when it has none and booted when it is not running, with run's
// create and start flags, and the host's browser opened to it for
// --chrome. cli implements it over vm's Manager.
type Provisioner interface {
	// Create makes the VM of branch, installing agent's CLI ("" for
	// none).
	Create(ctx context.Context, branch, agent string) (VM, error)
	// Start boots the VM name means unless it runs (booted: this call
	// booted it). keys are the agent's API key from this environment, by
	// name, which a start of a contained VM hands its egress proxy as a
	// secret (the store's of the same name wins).
	Start(ctx context.Context, name string, keys map[string]string) (vm VM, booted bool, err error)
	// OpenBrowser, for --chrome, opens the host's browser to the running
	// VM (cli wires the browser room's ForAgent); bridge says Claude in
	// Chrome's bridge is tunnelled, so a session that starts gets
	// --chrome.
	OpenBrowser(ctx context.Context, vm string) (bridge bool, err error)
}

// RunOptions are run's inputs.
type RunOptions struct {
	// Name is the branch (or VM name); a branch without a VM gets one,
	// made with the Provisioner's Create.
	Name string
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
	// Getenv reads the host's environment (--env NAME, the agent's key,
	// MCP sync's variables); nil is os.Getenv.
	Getenv func(string) string
	// Chrome is --chrome: the Provisioner's OpenBrowser before the
	// session. Only Claude Code has it.
	Chrome bool
	// OnWait is --on-wait: the command the VM's holder runs when an agent
	// of it starts waiting, until the VM stops (internal/notify).
	OnWait string
	// Log gets run's steps at debug level, each with its time since run
	// began (nil: none).
	Log hclog.Logger
}

// Result is how an attached session ended for the user.
type Result struct {
	VM, Branch, Session string
	// Created: the VM was made by this run; Started: booted by it.
	Created, Started bool
	// Exited: the agent ended (Status is its exit status); otherwise the
	// user detached and the agent runs on.
	Exited bool
	Status int
}
