package vm

import (
	"context"
	"fmt"
	"io"
	"os"

	"golang.org/x/crypto/ssh"

	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/sshx"
)

// connect opens an SSH connection to a running VM (dialGuest).
func (m *Manager) connect(ctx context.Context, name string) (*ssh.Client, string, error) {
	e, err := m.Find(ctx, name)
	if err != nil {
		return nil, "", err
	}
	if e.Record == nil {
		return nil, "", e.Err
	}
	info := m.Status(ctx, e, false)
	switch info.State {
	case StateRunning:
	case StateStarting:
		return nil, "", fmt.Errorf("VM %q is still booting (hint: `agent-vm start %s` waits until it is ready)", e.Record.Branch, e.Slug)
	default:
		return nil, "", fmt.Errorf("VM %q is %s (hint: `agent-vm start %s` starts it)", e.Record.Branch, info.State, e.Slug)
	}
	c, err := m.dialGuest(ctx, e.Record, e.Layout)
	if err != nil {
		return nil, "", fmt.Errorf("connecting to VM %q over SSH: %w", e.Record.Branch, err)
	}
	return c, e.Slug, nil
}

// Exec runs argv in the VM's /workspace and returns its exit status.
// stdout and stderr stay separate.
func (m *Manager) Exec(ctx context.Context, name string, argv []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	if len(argv) == 0 {
		return -1, fmt.Errorf("no command given (hint: agent-vm exec %s -- COMMAND [ARGS...])", name)
	}
	c, _, err := m.connect(ctx, name)
	if err != nil {
		return -1, err
	}
	defer c.Close()
	return sshx.Run(ctx, c, "cd "+guest.Workspace+" && exec "+sshx.Quote(argv), stdin, stdout, stderr)
}

// Shell opens an interactive login shell in the VM's /workspace.
func (m *Manager) Shell(ctx context.Context, name string, in *os.File, out, errOut io.Writer) (int, error) {
	c, _, err := m.connect(ctx, name)
	if err != nil {
		return -1, err
	}
	defer c.Close()
	return sshx.Shell(ctx, c, `cd `+guest.Workspace+` 2>/dev/null; exec "${SHELL:-/bin/bash}" -l`, in, out, errOut)
}
