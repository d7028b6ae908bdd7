package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/hold"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
)

// HoldCommand is the hidden command that runs a VM's holder: the held
// connection every command reaches the guest through (internal/hold).
const HoldCommand = hold.Command

// holdFiles are the files of the VM's holder; its command line names the
// VM directory (holdMarker), which is how stop knows it.
func holdFiles(r *state.Record, l state.Layout) hold.Files { return hold.FilesFor(l.RunDir(), r.ID) }

func holdMarker(l state.Layout) string { return l.Dir }

// dialGuest is the one place vm connects to a guest: through the VM's
// holder when one serves (a local handshake), else directly with the
// pinned host key. A guest that is up can still drop a connection now and
// then (sshd restarting, a busy TCG guest): a reset or refused direct
// connection is tried again for a few seconds; a host key mismatch never
// is.
func (m *Manager) dialGuest(ctx context.Context, r *state.Record, l state.Layout) (*ssh.Client, error) {
	if r.Guest.Foreign != "" {
		return nil, errForeign(r, "pinned host key for agent-vm to connect with")
	}
	c, err := dialHeld(ctx, r, l)
	if err == nil {
		return c, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return m.dialDirect(ctx, r, l, err)
}

// dialHeld connects through the VM's holder (hold.ErrNoHolder when none
// serves).
func dialHeld(ctx context.Context, r *state.Record, l state.Layout) (*ssh.Client, error) {
	return hold.Dial(ctx, holdFiles(r, l), r.Guest.User, 5*time.Second)
}

// dialDirect connects to the guest itself (dialGuest's fallback; why says
// why the holder did not serve).
func (m *Manager) dialDirect(ctx context.Context, r *state.Record, l state.Layout, why error) (*ssh.Client, error) {
	m.Log.Debug("no held connection, dialing the guest directly", "reason", why)
	target := sshTarget(r, l)
	var c *ssh.Client
	var err error
	for attempt, delay := 0, 500*time.Millisecond; ; attempt, delay = attempt+1, delay*2 {
		c, err = sshx.Dial(ctx, target, 15*time.Second)
		if err == nil || errors.Is(err, sshx.ErrHostKeyMismatch) || ctx.Err() != nil || attempt == 3 {
			return c, err
		}
		m.Log.Debug("ssh connection failed, trying again", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
	}
}

// startHolder starts the VM's holder, detached, unless one runs. Failing
// to is a warning: commands dial the guest directly then.
func (m *Manager) startHolder(e state.Entry) {
	r, l := e.Record, e.Layout
	if r.Guest.Foreign != "" {
		return // nothing to hold it with (see foreign.go)
	}
	exe := m.Executable
	if exe == nil {
		exe = os.Executable
	}
	if err := hold.Launch(m.Run, exe, holdFiles(r, l), holdMarker(l), l.Log(hold.LogName)); err != nil {
		m.Log.Warn("not holding a connection to the guest; commands connect to it directly, each with a full SSH handshake", "error", err)
	}
}

// waitHolder waits, up to limit, until the VM's holder serves its socket
// (it does once its own connection to the guest is up). Not serving by
// then is no error: commands dial the guest directly.
func (m *Manager) waitHolder(ctx context.Context, e state.Entry, limit time.Duration) {
	if !hold.Wait(ctx, holdFiles(e.Record, e.Layout), holdMarker(e.Layout), limit) {
		m.Log.Debug("the holder does not serve; commands dial the guest directly", "log", e.Layout.Log(hold.LogName))
	}
}

// stopHolder ends the VM's holder. It would end by itself once the VM's
// QEMU is gone; stop does not leave that to chance.
func (m *Manager) stopHolder(ctx context.Context, e state.Entry) {
	if e.Record == nil || e.Record.ID == "" {
		return
	}
	if err := hold.Stop(ctx, holdFiles(e.Record, e.Layout), holdMarker(e.Layout), 5*time.Second); err != nil {
		m.Log.Warn("could not end the VM's holder", "error", err)
	}
}

// heldSocket is the holder's socket when a holder of the VM runs, else "".
func heldSocket(r *state.Record, l state.Layout) string {
	if r.ID == "" {
		return ""
	}
	return hold.Socket(holdFiles(r, l), holdMarker(l))
}

// ServeHold runs the holder of the VM whose directory is dir until ctx
// ends or its connection to the guest does (the hidden __hold command).
func ServeHold(ctx context.Context, dir string, logger hclog.Logger) error {
	l := state.Layout{Dir: dir}
	r, err := state.ReadRecord(l.Record())
	if err != nil {
		return fmt.Errorf("reading the VM of %s: %w (hint: `agent-vm start` runs the holder itself, with the VM's directory)", dir, err)
	}
	if r.Guest.Foreign != "" {
		return errForeign(r, "pinned host key to hold a connection with")
	}
	target := sshTarget(r, l)
	h := &hold.Holder{Files: holdFiles(r, l), RunDir: l.RunDir(), Log: logger.With("vm", r.Slug),
		Dial: func(ctx context.Context) (*ssh.Client, error) { return sshx.Dial(ctx, target, 30*time.Second) }}
	return h.Run(ctx)
}
