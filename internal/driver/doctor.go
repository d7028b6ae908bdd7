package driver

import (
	"context"
	"strings"

	"github.com/agent-vm/agent-vm/internal/execx"
)

// CheckProgram checks that a program runs and reports its version line
// (what args, e.g. --version, print first); hint says how to install it.
func CheckProgram(ctx context.Context, run execx.Runner, name string, args []string, hint string) Check {
	p, err := run.LookPath(name)
	if err != nil {
		return Check{Name: name, Detail: "not found", Hint: hint}
	}
	res, err := run.Run(ctx, execx.Cmd{Path: p, Args: args})
	if err != nil {
		return Check{Name: name, Detail: p + ": " + err.Error(), Hint: hint}
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(res.Stdout)), "\n")
	return Check{Name: name, OK: true, Detail: p + " (" + line + ")"}
}
