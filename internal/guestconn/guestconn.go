// Package guestconn reaches a VM's guest over SSH: through the VM's
// holder when one serves (internal/hold: one held connection the commands
// share, a local handshake each), else directly with the VM's client key
// and pinned host key. It starts, waits for, stops and serves the holder
// (the hidden __hold command), and runs scripts as root in the guest.
//
// It knows the VM only as its record and directory (internal/state); a
// guest the user configured (a foreign guest, which has no pinned host
// key) is the caller's to refuse.
package guestconn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/egress"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/hold"
	"github.com/agent-vm/agent-vm/internal/notify"
	"github.com/agent-vm/agent-vm/internal/session"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/termsafe"
	"github.com/agent-vm/agent-vm/internal/userconfig"
)

// Guest is one VM's guest as agent-vm reaches it.
type Guest struct {
	Record *state.Record
	Layout state.Layout
	Log    hclog.Logger
}

// Target is the VM's SSH endpoint, with its pinned host key.
func (g Guest) Target() sshx.Target {
	r, l := g.Record, g.Layout
	return sshx.Target{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Ports.SSH)), User: r.Guest.User,
		KeyFile: l.ClientKey(), KnownHosts: l.KnownHosts()}
}

// Files are the files of the VM's holder; its command line names the VM
// directory (marker), which is how stop knows it.
func (g Guest) Files() hold.Files { return hold.FilesFor(g.Layout.RunDir(), g.Record.ID) }

func (g Guest) marker() string { return g.Layout.Dir }

// Dial connects to the guest: through the VM's holder when one serves,
// else directly with the pinned host key. A guest that is up can still
// drop a connection now and then (sshd restarting, a busy TCG guest): a
// reset or refused direct connection is tried again for a few seconds; a
// host key mismatch never is.
func (g Guest) Dial(ctx context.Context) (*ssh.Client, error) {
	c, err := g.DialHeld(ctx)
	if err == nil {
		return c, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return g.DialDirect(ctx, err)
}

// DialHeld connects through the VM's holder (hold.ErrNoHolder when none
// serves).
func (g Guest) DialHeld(ctx context.Context) (*ssh.Client, error) {
	return hold.Dial(ctx, g.Files(), g.Record.Guest.User, 5*time.Second)
}

// DialDirect connects to the guest itself (Dial's fallback; why says why
// the holder did not serve).
func (g Guest) DialDirect(ctx context.Context, why error) (*ssh.Client, error) {
	g.Log.Debug("no held connection, dialing the guest directly", "reason", why)
	target := g.Target()
	var c *ssh.Client
	var err error
	for attempt, delay := 0, 500*time.Millisecond; ; attempt, delay = attempt+1, delay*2 {
		c, err = sshx.Dial(ctx, target, 15*time.Second)
		if err == nil || errors.Is(err, sshx.ErrHostKeyMismatch) || ctx.Err() != nil || attempt == 3 {
			return c, err
		}
		g.Log.Debug("ssh connection failed, trying again", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
}

// Root runs a shell script as root in the guest (its user has
// passwordless sudo); script is called once connected.
func (g Guest) Root(ctx context.Context, script func() string) (code int, stdout, stderr string, err error) {
	c, err := g.Dial(ctx)
	if err != nil {
		return -1, "", "", err
	}
	defer c.Close()
	return RootOn(ctx, c, script())
}

// RootCommand is the guest command that runs, as root, the shell script
// it reads on its input (the guest's user has passwordless sudo).
const RootCommand = "sudo -n sh -s"

// RootOn runs a shell script as root on the open connection c.
func RootOn(ctx context.Context, c *ssh.Client, script string) (code int, stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	code, err = sshx.Run(ctx, c, RootCommand, strings.NewReader(script), &out, &errOut)
	return code, out.String(), errOut.String(), err
}

// StartHolder starts the VM's holder, detached, unless one runs: the
// agent-vm binary self names, run by run. Failing to is a warning:
// commands dial the guest directly then.
func (g Guest) StartHolder(run execx.Runner, self func() (string, error)) {
	if err := hold.Launch(run, self, g.Files(), g.marker(), g.Layout.Log(hold.LogName)); err != nil {
		g.Log.Warn("not holding a connection to the guest; commands connect to it directly, each with a full SSH handshake", "error", err)
	}
}

// WaitHolder waits, up to limit, until the VM's holder serves its socket
// (it does once its own connection to the guest is up). Not serving by
// then is no error: commands dial the guest directly.
func (g Guest) WaitHolder(ctx context.Context, limit time.Duration) {
	if !hold.Wait(ctx, g.Files(), g.marker(), limit) {
		g.Log.Debug("the holder does not serve; commands dial the guest directly", "log", g.Layout.Log(hold.LogName))
	}
}

// StopHolder ends the VM's holder. It would end by itself once the VM's
// QEMU is gone; stop does not leave that to chance.
func (g Guest) StopHolder(ctx context.Context) {
	if g.Record == nil || g.Record.ID == "" {
		return
	}
	if err := hold.Stop(ctx, g.Files(), g.marker(), 5*time.Second); err != nil {
		g.Log.Warn("could not end the VM's holder", "error", err)
	}
}

// Held is the holder's socket when a holder of the VM runs, else "".
func (g Guest) Held() string {
	if g.Record.ID == "" {
		return ""
	}
	return hold.Socket(g.Files(), g.marker())
}

// ServeDir runs the holder of the VM whose directory is dir until ctx
// ends or its connection to the guest does (the hidden __hold command,
// which start runs with the VM's directory). A guest made from the user's
// own configuration (the record's Guest.Foreign) has no pinned host key to
// hold a connection with.
func ServeDir(ctx context.Context, dir string, log hclog.Logger) error {
	l := state.Layout{Dir: dir}
	r, err := state.ReadRecord(l.Record())
	if err != nil {
		return fmt.Errorf("reading the VM of %s: %w (hint: `agent-vm start` runs the holder itself, with the VM's directory)", dir, err)
	}
	if r.Guest.Foreign != "" {
		return fmt.Errorf("VM %q runs %s as is, so it has no pinned host key to hold a connection with", r.Branch, r.Guest.Foreign)
	}
	return Guest{Record: r, Layout: l, Log: log}.Serve(ctx)
}

// Serve runs the VM's holder until ctx ends or its connection to the
// guest does (the hidden __hold command).
func (g Guest) Serve(ctx context.Context) error {
	target := g.Target()
	h := &hold.Holder{Files: g.Files(), RunDir: g.Layout.RunDir(), Log: g.Log.With("vm", g.Record.Slug),
		Dial: func(ctx context.Context) (*ssh.Client, error) { return sshx.Dial(ctx, target, 30*time.Second) }}
	h.Notices = hold.NewNotices()
	h.ReverseForwards = func() ([]hold.ReverseForward, error) { return g.reverseForwards(h.Log, h.Notices) }
	h.Watch = g.watchAgents(h.Log)
	// run --on-wait's command is the VM's until it stops, which ends this.
	defer os.Remove(filepath.Join(g.Layout.RunDir(), notify.OnWaitFile))
	return h.Run(ctx)
}

// watchAgents is the holder's watch of the VM's agent sessions: the user
// is told when one starts waiting (internal/notify).
func (g Guest) watchAgents(log hclog.Logger) func(ctx context.Context, c *ssh.Client) {
	config := func() (string, error) {
		c, err := userconfig.Load(userconfig.Path(os.Getenv))
		if err != nil {
			return "", err
		}
		return c.OnWait, nil
	}
	return func(ctx context.Context, c *ssh.Client) {
		w := &notify.Watcher{Branch: g.Record.Branch, VM: g.Record.Slug, Run: execx.OS{}, Getenv: os.Getenv, Log: log.Named("notify"),
			List:   func(ctx context.Context) ([]session.Info, error) { return Sessions(ctx, c) },
			Asks:   func() ([]egress.Ask, error) { return egress.ReadAsks(g.Layout.NetDir()) },
			OnWait: func() (string, error) { return notify.OnWait(g.Layout.RunDir(), config) }}
		w.Watch(ctx)
	}
}

// Sessions lists the agent sessions of the guest c is connected to, as
// they are now (session.List, read by session.Parse).
func Sessions(ctx context.Context, c *ssh.Client) ([]session.Info, error) {
	var out, errOut bytes.Buffer
	code, err := sshx.Run(ctx, c, session.List(), nil, &out, &errOut)
	if err != nil {
		return nil, err
	}
	if code != 0 {
		return nil, fmt.Errorf("in the guest: exit status %d: %s", code, termsafe.String(strings.TrimSpace(errOut.String())))
	}
	return session.Parse(out.String(), time.Now())
}
