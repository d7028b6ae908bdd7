package logtail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/agent-vm/agent-vm/internal/driver"
	"github.com/agent-vm/agent-vm/internal/execx"
	"github.com/agent-vm/agent-vm/internal/guest"
)

// Sources are a VM's logs as `agent-vm logs` shows them: the serial
// console's file on the host and, while the VM runs, the guest's
// provisioning log (the repository's packages and provision.sh) and
// agent-mcp's journal, read by a command in the guest.
type Sources struct {
	// Console is the serial console's log file.
	Console string
	// ConsoleHost, when set, runs a shell command on the machine the
	// console log is on (a VM placed on another host: Console is a path
	// there), its output to w, until it ends or ctx does; ConsoleWhere
	// names that machine in the header.
	ConsoleHost  func(ctx context.Context, cmd string, w io.Writer) error
	ConsoleWhere string
	// Guest runs a shell command in the guest, its stdout and stderr to
	// w (which takes writes from both at once), until the command ends or
	// ctx does; nil when the VM is not running.
	Guest func(ctx context.Context, cmd string, w io.Writer) error
}

// Show writes the last lines of each of s's logs (200 when lines <= 0),
// each under a header that names it. With follow it then keeps writing
// them as they grow, each line prefixed with its source, until ctx ends.
//
// The guest writes all of them, so every line is escaped (PrefixWriter),
// whether or not out is a terminal: `agent-vm logs | grep` reaches one
// too. The raw bytes are in the console log file the header names.
func Show(ctx context.Context, s Sources, lines int, follow bool, out io.Writer) error {
	if lines <= 0 {
		lines = 200
	}
	journal := fmt.Sprintf("sudo journalctl -u agent-mcp --no-pager --output=short-iso -n %d", lines)
	where := s.Console
	if s.ConsoleWhere != "" {
		where += " on " + s.ConsoleWhere
	}
	if !follow {
		fmt.Fprintf(out, "==> serial console (%s) <==\n", where)
		safe := &PrefixWriter{W: out, Mu: &sync.Mutex{}}
		if s.ConsoleHost != nil {
			if err := s.ConsoleHost(ctx, fmt.Sprintf("tail -n %d %s 2>/dev/null || true", lines, execx.ShellQuote(s.Console)), safe); err != nil {
				return errors.Join(err, safe.Flush())
			}
		} else if tail := driver.TailFile(s.Console, lines); tail != "" {
			fmt.Fprintln(safe, tail)
		}
		if s.Guest == nil {
			fmt.Fprintf(out, "==> agent-mcp journal: the VM is not running <==\n")
			return nil
		}
		fmt.Fprintf(out, "==> provisioning log (%s) <==\n", guest.ProvisionLog)
		perr := s.Guest(ctx, provisionLog(lines, false), safe)
		fmt.Fprintf(out, "==> agent-mcp journal <==\n")
		err := s.Guest(ctx, journal, safe)
		return errors.Join(perr, err, safe.Flush())
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	consoleOut := &PrefixWriter{W: out, Prefix: "console   | ", Mu: &mu}
	journalOut := &PrefixWriter{W: out, Prefix: "agent-mcp | ", Mu: &mu}
	provisionOut := &PrefixWriter{W: out, Prefix: "provision | ", Mu: &mu}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if s.ConsoleHost != nil {
			errs <- s.ConsoleHost(ctx, fmt.Sprintf("tail -n %d -F %s 2>/dev/null", lines, execx.ShellQuote(s.Console)), consoleOut)
			return
		}
		errs <- Follow(ctx, s.Console, lines, consoleOut)
	}()
	if s.Guest != nil {
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs <- s.Guest(ctx, journal+" -f", journalOut)
		}()
		go func() {
			defer wg.Done()
			errs <- s.Guest(ctx, provisionLog(lines, true), provisionOut)
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
