package vm

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"os"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/state"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// Connect opens an SSH connection to the running VM name means (as
// dialGuest), and returns its slug; the caller closes the connection. The VM's
// state (its record, pid and QMP) and the holder's handshake do not
// depend on each other, so they run at once; the connection is used only
// if the state says running (a paused VM's holder can still answer).
// Without a holder, the guest is dialed directly once the state is known.
// A hibernated VM is resumed first: it wakes when used.
func (m *Manager) Connect(ctx context.Context, name string) (*ssh.Client, string, error) {
	e, err := m.Recorded(ctx, name)
	if err != nil {
		return nil, "", err
	}
	if err := m.ownGuest(e.Record, "pinned host key for agent-vm to connect with"); err != nil {
		return nil, "", err
	}
	type dialed struct {
		c   *ssh.Client
		err error
	}
	held := make(chan dialed, 1)
	go func() {
		c, err := m.guestOf(e.Record, e.Layout).DialHeld(ctx)
		held <- dialed{c, err}
	}()
	info := m.Status(ctx, e, false)
	h := <-held
	if info.Suspend == vminfo.SuspendHibernated { // it wakes when used
		_, err = m.Resume(ctx, e.Slug, StartOptions{Wake: true})
		info.State = vminfo.StateRunning
	}
	if err := cmp.Or(err, runningErr(e, info.State)); err != nil {
		if h.c != nil {
			h.c.Close()
		}
		return nil, "", err
	}
	c := h.c
	if h.err != nil {
		if c, err = m.guestOf(e.Record, e.Layout).DialDirect(ctx, h.err); err != nil {
			return nil, "", fmt.Errorf("connecting to VM %q over SSH: %w", e.Record.Branch, err)
		}
	}
	return c, e.Slug, nil
}

// runningErr says why a VM in state cannot take a connection (nil when
// it runs).
func runningErr(e state.Entry, st string) error {
	switch st {
	case vminfo.StateRunning:
		return nil
	case vminfo.StateStarting:
		return fmt.Errorf("VM %q is still booting (hint: `agent-vm start %s` waits until it is ready)", e.Record.Branch, e.Slug)
	case vminfo.StateSuspended:
		return fmt.Errorf("VM %q is suspended (hint: `agent-vm resume %s` brings it back)", e.Record.Branch, e.Slug)
	default:
		return fmt.Errorf("VM %q is %s (hint: `agent-vm start %s` starts it)", e.Record.Branch, st, e.Slug)
	}
}

// Exec runs argv in the VM's /workspace and returns its exit status.
// stdout and stderr stay separate.
func (m *Manager) Exec(ctx context.Context, name string, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if len(argv) == 0 {
		return -1, fmt.Errorf("no command given (hint: agent-vm exec %s -- COMMAND [ARGS...])", name)
	}
	c, _, err := m.Connect(ctx, name)
	if err != nil {
		return -1, err
	}
	defer c.Close()
	return sshx.Run(ctx, c, "cd "+guest.Workspace+" && exec "+sshx.Quote(argv), stdin, stdout, stderr)
}

// Shell opens an interactive login shell in the VM's /workspace.
func (m *Manager) Shell(ctx context.Context, name string, in *os.File, out, errOut io.Writer) (int, error) {
	c, _, err := m.Connect(ctx, name)
	if err != nil {
		return -1, err
	}
	defer c.Close()
	return sshx.Shell(ctx, c, `cd `+guest.Workspace+` 2>/dev/null; exec "${SHELL:-/bin/bash}" -l`, in, out, errOut)
}
