package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/guest"
	"github.com/agent-vm/agent-vm/internal/logtail"
	"github.com/agent-vm/agent-vm/internal/sshx"
)

// LogsOptions are logs' inputs.
type LogsOptions struct {
	Follow bool
	Lines  int // how many lines of each log to show first; 0 = 200
}

// Logs writes the VM's serial console and, when the VM runs, the guest's
// provisioning log (the repository's packages and provision.sh) and
// agent-mcp's journal. With Follow it keeps writing them as they grow, each
// line prefixed with its source, until ctx ends.
//
// The guest writes both, so every line is escaped (termsafe.Line: colours
// dropped, other control characters shown as \x1b ...), whether or not out
// is a terminal: `agent-vm logs | grep` reaches one too. The raw bytes are
// in the console log file the header names.
func (m *Manager) Logs(ctx context.Context, name string, o LogsOptions, out io.Writer) error {
	e, err := m.findRecorded(ctx, name)
	if err != nil {
		return err
	}
	if o.Lines <= 0 {
		o.Lines = 200
	}
	d, err := m.driverOf(e.Record)
	if err != nil {
		return err
	}
	console := d.Logs(m.machine(e.Record, e.Layout)).Console
	running := m.Status(ctx, e, false).State == StateRunning
	journal := fmt.Sprintf("sudo journalctl -u agent-mcp --no-pager --output=short-iso -n %d", o.Lines)
	if !o.Follow {
		fmt.Fprintf(out, "==> serial console (%s) <==\n", console)
		safe := &logtail.PrefixWriter{W: out, Mu: &sync.Mutex{}}
		if tail := driver.TailFile(console, o.Lines); tail != "" {
			fmt.Fprintln(safe, tail)
		}
		if !running {
			fmt.Fprintf(out, "==> agent-mcp journal: the VM is not running <==\n")
			return nil
		}
		fmt.Fprintf(out, "==> provisioning log (%s) <==\n", guest.ProvisionLog)
		_, perr := m.guestCommand(ctx, name, provisionLog(o.Lines, false), safe)
		fmt.Fprintf(out, "==> agent-mcp journal <==\n")
		_, err := m.guestCommand(ctx, name, journal, safe)
		return errors.Join(perr, err, safe.Flush())
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	consoleOut := &logtail.PrefixWriter{W: out, Prefix: "console   | ", Mu: &mu}
	journalOut := &logtail.PrefixWriter{W: out, Prefix: "agent-mcp | ", Mu: &mu}
	provisionOut := &logtail.PrefixWriter{W: out, Prefix: "provision | ", Mu: &mu}
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs <- logtail.Follow(ctx, console, o.Lines, consoleOut)
	}()
	if running {
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, err := m.guestCommand(ctx, name, journal+" -f", journalOut)
			errs <- err
		}()
		go func() {
			defer wg.Done()
			_, err := m.guestCommand(ctx, name, provisionLog(o.Lines, true), provisionOut)
			errs <- err
		}()
	}
	wg.Wait()
	consoleOut.Flush()
	journalOut.Flush()
	provisionOut.Flush()
	close(errs)
	for err := range errs {
		if err != nil && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

// provisionLog shows the last n lines of the guest's provisioning log
// (guest.ProvisionLog), following it with follow.
func provisionLog(n int, follow bool) string {
	if follow {
		return fmt.Sprintf("tail -n %d -F %s 2>/dev/null", n, guest.ProvisionLog)
	}
	return fmt.Sprintf("tail -n %d %s 2>/dev/null || echo '(none yet: the guest has not provisioned)'", n, guest.ProvisionLog)
}

// guestCommand runs a shell command in the VM, its stdout and stderr both
// to out. The SSH session copies the two streams concurrently, so out is
// locked around each write.
func (m *Manager) guestCommand(ctx context.Context, name, cmd string, out io.Writer) (int, error) {
	c, _, err := m.connect(ctx, name)
	if err != nil {
		return -1, err
	}
	defer c.Close()
	w := &logtail.LockedWriter{W: out}
	return sshx.Run(ctx, c, cmd, nil, w, w)
}
