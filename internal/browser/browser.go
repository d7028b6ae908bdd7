// Package browser is `agent-vm browser` and run's --chrome: it opens and
// closes a running VM's browser bridges (internal/bridge), the ways the agent
// in the VM reaches the host's browser, each off until the user asks for
// it, for one VM:
//
//   - the Claude in Chrome bridge (--chrome-bridge, run --chrome): the
//     guest's Claude Code finds a bridge socket where it looks for one,
//     and it leads to the host's Claude in Chrome;
//   - DevTools (--cdp, --launch): the guest's 127.0.0.1:9222 leads to a
//     host Chrome/Chromium's remote-debugging endpoint, and the guest's
//     Claude Code gets chrome-devtools-mcp (installed in the guest once,
//     pinned) registered against it;
//   - URLs (--open-urls): the guest's xdg-open asks the host to open an
//     http or https URL.
//
// The bridges are reverse forwards on the VM's held SSH connection, kept by its
// holder: this package writes the VM's browser.json under the VM's lock and
// has the holder reopen them (VMs.ReloadBridges). A stop closes them all.
package browser

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/bridge"
	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/hostbrowser"
	"github.com/agent-vm/agent-vm/internal/netpolicy"
	"github.com/agent-vm/agent-vm/internal/state"
)

// VMs is what the browser bridges need of agent-vm's VMs; vm's Manager has
// it.
type VMs interface {
	// Recorded finds the VM name means (a branch or a VM name).
	Recorded(ctx context.Context, name string) (state.Entry, error)
	// Locked finds it and takes its lock; the caller releases it.
	Locked(ctx context.Context, name string) (state.Entry, *state.Lock, error)
	// State is the VM's state as status shows it (driver.StateRunning ...).
	State(ctx context.Context, e state.Entry) string
	// Connect opens an SSH connection to the running VM name means.
	Connect(ctx context.Context, name string) (*ssh.Client, string, error)
	// ReloadBridges has the holder of e's running VM open the bridges its
	// browser.json names and close the others.
	ReloadBridges(ctx context.Context, e state.Entry) error
	// PullLog brings e's connection log here, for a failed install of
	// chrome-devtools-mcp (netpolicy.WithRefusals).
	netpolicy.LogPuller
}

// Options are `browser`'s flags.
type Options struct {
	Name string
	// ChromeBridge tunnels the host's Claude in Chrome bridge.
	ChromeBridge bool
	// CDP makes the host's DevTools endpoint at 127.0.0.1:Port reachable
	// (Port 0: 9222); Launch starts agent-vm's Chromium there first.
	CDP    bool
	Port   int
	Launch bool
	// OpenURLs lets the guest open http and https URLs on the host.
	OpenURLs bool
	// Force opens bridges for a VM whose network is offline.
	Force bool
	// Notify tells the user what happens (a line each); nil: nothing.
	Notify func(string)
	// Getenv reads the host's environment (where the bridge's sockets
	// are); nil is os.Getenv.
	Getenv func(string) string
	// Launcher starts agent-vm's Chromium with DevTools on the host's
	// 127.0.0.1:port, or finds it running (Host.Launch); needed for
	// Launch.
	Launcher func(ctx context.Context, port int) (hostbrowser.Launched, error)
	// Stop stops the Chromium Launcher started when the bridge does not
	// open after all (nil: it is left running).
	Stop Stopper
}

// Stopper stops agent-vm's Chromium unless a VM other than except has a
// bridge to it (usedBy names it): Host.Stop.
type Stopper func(ctx context.Context, except string) (usedBy string, stopped bool, err error)

// DefaultDevToolsPort is a DevTools endpoint's usual port, on the host's
// 127.0.0.1.
const DefaultDevToolsPort = 9222

// Info is what a VM has open (`browser BRANCH`).
type Info struct {
	VM      string        `json:"vm"`
	Branch  string        `json:"branch"`
	Bridges bridge.Config `json:"bridges"`
	// Open says what is open, in words, one bridge a line.
	Open []string `json:"open"`
}

func infoOf(e state.Entry, d bridge.Config) *Info {
	return &Info{VM: e.Slug, Branch: e.Record.Branch, Bridges: d, Open: d.Lines()}
}

// Show reports the bridges of the VM name means.
func Show(ctx context.Context, vms VMs, name string) (*Info, error) {
	e, err := vms.Recorded(ctx, name)
	if err != nil {
		return nil, err
	}
	d, err := bridge.ReadConfig(e.Layout.RunDir())
	if err != nil {
		return nil, err
	}
	return infoOf(e, d), nil
}

// Open opens the bridges o asks for (adding to those open) on the running VM
// o.Name means. Each bridge's host end is checked first, so a bridge that
// would lead nowhere is an error, not an open bridge: no bridge socket, no
// DevTools endpoint. Nothing changes when any check fails.
func Open(ctx context.Context, vms VMs, o Options) (_ *Info, openErr error) {
	if !o.ChromeBridge && !o.CDP && !o.Launch && !o.OpenURLs {
		return nil, errors.New("no bridge named (hint: --chrome-bridge, --cdp [--port N], --launch or --open-urls; --off closes them)")
	}
	notify := o.Notify
	if notify == nil {
		notify = func(string) {}
	}
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	e, lock, err := vms.Locked(ctx, o.Name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	r := e.Record
	if st := vms.State(ctx, e); st != driver.StateRunning {
		return nil, fmt.Errorf("VM %q is %s, and browser bridges open on a running VM (hint: `agent-vm start %s`)", r.Branch, st, e.Slug)
	}
	offline := r.Net != nil && r.Net.Mode == egress.ModeOffline
	if offline && !o.Force {
		return nil, fmt.Errorf("VM %q's network is offline, and a browser bridge is a way out of the VM: a browser with your logins reaches everything it does (hint: --force opens it anyway; `agent-vm net mode --vm %s allow` ends offline)", r.Branch, e.Slug)
	}
	was, err := bridge.ReadConfig(e.Layout.RunDir())
	if err != nil {
		return nil, err
	}
	d := was
	if o.ChromeBridge {
		dir, err := bridge.ChromeBridgeDir(getenv)
		if err != nil {
			return nil, err
		}
		if _, err := bridge.FindChromeBridge(dir); err != nil {
			return nil, err
		}
		d.ChromeBridge = dir
	}
	if o.CDP || o.Launch {
		port := o.Port
		if port == 0 {
			port = DefaultDevToolsPort
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		if err := bridge.CheckDevToolsAddr(addr); err != nil {
			return nil, fmt.Errorf("--port: %w", err)
		}
		if o.Launch {
			if o.Launcher == nil {
				return nil, errors.New("--launch: no launcher wired (a bug)")
			}
			l, err := o.Launcher(ctx, port)
			if err != nil {
				return nil, err
			}
			if !l.Reused && o.Stop != nil {
				// A Chromium started for a bridge that then does not open
				// is stopped again.
				defer func() {
					if openErr != nil {
						_, _, _ = o.Stop(context.WithoutCancel(ctx), e.Slug)
					}
				}()
			}
			for _, w := range l.Warnings {
				notify(w)
			}
			if l.Port != port {
				// One profile, one Chromium: the one running keeps its port.
				notify(fmt.Sprintf("agent-vm's Chromium runs with DevTools on port %d, not %d: the bridge leads there", l.Port, port))
				addr = bridge.DevToolsAddr(l.Port)
			}
			switch {
			case l.Reused:
				notify(fmt.Sprintf("agent-vm's Chromium runs already (pid %d, profile %s)", l.Pid, l.Profile))
			case l.Headless:
				notify(fmt.Sprintf("started agent-vm's Chromium without a window, there being no display (pid %d, profile %s)", l.Pid, l.Profile))
			default:
				notify(fmt.Sprintf("started agent-vm's Chromium (pid %d, profile %s): log in there once to the sites the agent may use", l.Pid, l.Profile))
			}
		}
		v, err := bridge.ProbeDevTools(ctx, addr)
		if err != nil {
			return nil, err
		}
		notify(fmt.Sprintf("DevTools endpoint at %s: %s", addr, v.Browser))
		if err := devToolsMCP(ctx, vms, e, notify); err != nil {
			return nil, err
		}
		d.DevTools, d.Launched, d.Log = addr, o.Launch, netpolicy.LogPath(e.Layout)
	}
	if o.OpenURLs {
		d.OpenURLs, d.Log = true, netpolicy.LogPath(e.Layout)
		if p, err := exec.LookPath(bridge.Opener); err == nil {
			d.Opener = p
		} else {
			d.Opener = ""
			notify("no " + bridge.Opener + " on this host: the guest's URLs are shown and logged here, not opened")
		}
	}
	d.Forced = was.Forced || offline
	if err := apply(ctx, vms, e, d, was); err != nil {
		return nil, err
	}
	return infoOf(e, d), nil
}

// Off closes every bridge of the VM name means, takes chrome-devtools-mcp
// out of its guest's Claude Code configuration and, when the VM's DevTools
// bridge led to agent-vm's Chromium, stops it unless another VM uses it
// (stop; nil leaves it running).
func Off(ctx context.Context, vms VMs, name string, stop Stopper, notify func(string)) (*Info, error) {
	if notify == nil {
		notify = func(string) {}
	}
	e, lock, err := vms.Locked(ctx, name)
	if err != nil {
		return nil, err
	}
	defer lock.Release()
	was, err := bridge.ReadConfig(e.Layout.RunDir())
	if err != nil {
		return nil, err
	}
	if !was.Any() {
		return infoOf(e, bridge.Config{}), nil
	}
	if err := apply(ctx, vms, e, bridge.Config{}, was); err != nil {
		return nil, err
	}
	if was.DevTools != "" {
		if err := unregisterDevToolsMCP(ctx, vms, e); err != nil {
			return nil, fmt.Errorf("the bridges are closed, but chrome-devtools-mcp is still registered in the guest: %w", err)
		}
	}
	if was.Launched && stop != nil {
		usedBy, stopped, err := stop(ctx, e.Slug)
		switch {
		case err != nil:
			return nil, fmt.Errorf("the bridges are closed, but agent-vm's Chromium: %w", err)
		case usedBy != "":
			notify(fmt.Sprintf("agent-vm's Chromium keeps running: VM %s has a bridge to it", usedBy))
		case stopped:
			notify("stopped agent-vm's Chromium (its profile stays, logged in)")
		}
	}
	return infoOf(e, bridge.Config{}), nil
}

// apply writes d as e's bridges and has the holder open them; when it
// cannot, the bridges that were (was) are put back.
func apply(ctx context.Context, vms VMs, e state.Entry, d, was bridge.Config) error {
	if err := bridge.WriteConfig(e.Layout.RunDir(), d); err != nil {
		return err
	}
	err := vms.ReloadBridges(ctx, e)
	if err == nil {
		return nil
	}
	if werr := bridge.WriteConfig(e.Layout.RunDir(), was); werr == nil {
		_ = vms.ReloadBridges(ctx, e)
	}
	return err
}

// ForAgent opens what `run --chrome` needs on the running VM name means:
// the Claude in Chrome bridge when the host has a bridge socket (bridge:
// the agent gets --chrome); else, saying so with the guidance, DevTools
// when a host browser's endpoint answers on 127.0.0.1:9222; else nothing,
// and the agent starts without a browser.
func ForAgent(ctx context.Context, vms VMs, name string, getenv func(string) string, notify func(string)) (bridgeOpen bool, err error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	dir, err := bridge.ChromeBridgeDir(getenv)
	if err != nil {
		return false, err
	}
	_, findErr := bridge.FindChromeBridge(dir)
	if findErr == nil {
		if _, err := Open(ctx, vms, Options{Name: name, ChromeBridge: true, Notify: notify, Getenv: getenv}); err != nil {
			return false, err
		}
		notify("Claude in Chrome: the host's bridge is tunnelled into the VM (the agent starts with --chrome)")
		return true, nil
	}
	notify(findErr.Error())
	addr := bridge.DevToolsAddr(DefaultDevToolsPort)
	if _, err := bridge.ProbeDevTools(ctx, addr); err != nil {
		notify(fmt.Sprintf("no DevTools endpoint to fall back to either (%v): the agent starts without a browser (hint: `agent-vm browser %s --launch` starts agent-vm's Chromium for it)", err, name))
		return false, nil
	}
	if _, err := Open(ctx, vms, Options{Name: name, CDP: true, Notify: notify, Getenv: getenv}); err != nil {
		return false, err
	}
	notify(fmt.Sprintf("fell back to DevTools: the host browser at %s is reachable in the VM, through chrome-devtools-mcp (the agent starts without --chrome)", addr))
	return false, nil
}
