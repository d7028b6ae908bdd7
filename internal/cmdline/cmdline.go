// Package cmdline is what every command of agent-vm's binary keeps, the
// verbs people type (internal/cli) and the commands agent-vm runs of
// itself (internal/selfcmd) alike: how its command line is read (the
// grammar Shape holds an App to: flags after the arguments, usage errors,
// empty values refused, unknown commands named with the nearest, help as a
// word at every depth); where it reads and writes (IO); how its end
// becomes the process's exit code (a usage error 2, a command's own status
// as it is, an interruption 130; Report); the logger the global flags ask
// for.
package cmdline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"
)

// Exit codes.
const (
	ExitOK          = 0
	ExitError       = 1
	ExitUsage       = 2
	ExitInterrupted = 130
)

// IO is where a command reads and writes.
type IO struct {
	In     *os.File
	Out    io.Writer
	Err    io.Writer
	Getenv func(string) string
}

// usageError is a mistake in how the command was called.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// Usagef is a mistake in how the command was called: Report prints it
// with a pointer to --help and exits 2.
func Usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// exitCodeError carries a command's own exit status.
type exitCodeError struct{ code int }

func (e *exitCodeError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// ExitStatus ends a command with code as the process's exit status and
// nothing printed: what a program it ran exited with (exec, shell, an
// agent's session), or a status of its own.
func ExitStatus(code int) error { return &exitCodeError{code: code} }

// Report prints err (if any) on stdio.Err and returns the exit code for it.
func Report(ctx context.Context, stdio IO, err error) int {
	if err == nil {
		return ExitOK
	}
	var code *exitCodeError
	if errors.As(err, &code) {
		return code.code
	}
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		fmt.Fprintf(stdio.Err, "agent-vm: interrupted: %v\n", err)
		return ExitInterrupted
	}
	var u *usageError
	if errors.As(err, &u) {
		fmt.Fprintf(stdio.Err, "agent-vm: %v\n(run `agent-vm --help` for usage)\n", err)
		return ExitUsage
	}
	fmt.Fprintf(stdio.Err, "agent-vm: %v\n", err)
	return ExitError
}

// NoArgs refuses positional arguments.
func NoArgs(cliCtx *cli.Context) error {
	if cliCtx.NArg() > 0 {
		return Usagef("%s takes no arguments, got %q", cliCtx.Command.Name, cliCtx.Args().Slice())
	}
	return nil
}
