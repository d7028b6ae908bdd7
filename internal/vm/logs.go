package vm

import (
	"context"
	"io"

	"github.com/agent-vm/agent-vm/internal/logtail"
	"github.com/agent-vm/agent-vm/internal/sshx"
	"github.com/agent-vm/agent-vm/internal/vminfo"
)

// LogsOptions are logs' inputs.
type LogsOptions struct {
	Follow bool
	Lines  int // how many lines of each log to show first; 0 = 200
}

// Logs writes the VM's serial console and, when the VM runs, the guest's
// provisioning log and agent-mcp's journal (logtail.Show); with Follow it
// keeps writing them as they grow, until ctx ends.
func (m *Manager) Logs(ctx context.Context, name string, o LogsOptions, out io.Writer) error {
	e, err := m.Recorded(ctx, name)
	if err != nil {
		return err
	}
	d, err := m.driverOf(e.Record)
	if err != nil {
		return err
	}
	mach := m.machine(e.Record, e.Layout)
	s := logtail.Sources{Console: d.Logs(mach).Console}
	site, err := m.site(e.Record, mach)
	if err != nil {
		return err
	}
	if site != nil {
		s.ConsoleWhere, s.ConsoleHost = "host "+site.Host(), site.Run
	}
	if m.Status(ctx, e, false).State == vminfo.StateRunning {
		s.Guest = func(ctx context.Context, cmd string, w io.Writer) error {
			c, _, err := m.Connect(ctx, name)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = sshx.Run(ctx, c, cmd, nil, w, w)
			return err
		}
	}
	return logtail.Show(ctx, s, o.Lines, o.Follow, out)
}
